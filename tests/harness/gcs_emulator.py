"""The GCS emulator the object-store tests start as a process: gcp-storage-emulator, in memory,
on 127.0.0.1, with the two things of real GCS its downloads lack and the agent's client needs.

- ``Last-Modified`` and ``ETag`` on an object's GET (real GCS sends both; obstore refuses an
  answer without them: "Last-Modified Header missing from response").
- With ``--bearer TOKEN``: a download without ``Authorization: Bearer TOKEN`` is answered 401
  with GCS's JSON error (reason ``authError``), as GCS answers bad credentials; the emulator
  itself checks none.

    python tests/harness/gcs_emulator.py --port PORT --bucket NAME [--bearer TOKEN]

It prints ``ready`` once it serves, and runs until it is killed.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from email.utils import format_datetime
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import server  # type: ignore[import-untyped]
from gcp_storage_emulator.handlers import objects  # type: ignore[import-untyped]


def _patched(bearer: str | None) -> Any:
    download = objects.download

    def handler(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        if bearer is not None and request.get_header("authorization") != f"Bearer {bearer}":
            response.status = HTTPStatus.UNAUTHORIZED
            response.json(
                {"error": {"code": 401, "message": "Invalid Credentials",
                           "errors": [{"reason": "authError", "message": "Invalid Credentials"}]}}
            )  # fmt: skip
            return
        download(request, response, storage, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            updated = datetime.fromisoformat(obj["updated"])
            response["Last-Modified"] = format_datetime(updated, usegmt=True)
            response["ETag"] = f'"{obj.get("etag") or obj["md5Hash"]}"'

    return handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--bearer")
    args = parser.parse_args()
    handler = _patched(args.bearer)
    server.HANDLERS = tuple(
        (regex, {m: handler if f is objects.download else f for m, f in methods.items()})
        for regex, methods in server.HANDLERS
    )
    emulator = server.create_server("127.0.0.1", args.port, in_memory=True,
                                    default_bucket=args.bucket)  # fmt: skip
    emulator.start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        emulator.stop()
        sys.exit(0)


if __name__ == "__main__":
    main()
