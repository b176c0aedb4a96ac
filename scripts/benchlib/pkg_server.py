"""The packages' http server, a child process so that serving costs nothing on the benchmark's
own event loop: ``python -m benchlib.pkg_server --dir D`` serves D's files on 127.0.0.1 (sendfile),
prints its base URL as its first line, counts GETs per file (downloads counted at the source) and
reports them at ``/_stats``. It stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections import Counter
from pathlib import Path

from aiohttp import web


async def serve(directory: Path) -> None:
    gets: Counter[str] = Counter()

    async def package(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = directory / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return web.Response(status=404, text=f"no package {name}")
        gets[name] += 1
        return web.FileResponse(path, headers={"Content-Type": "application/zip"})

    async def stats(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(gets), content_type="application/json")

    app = web.Application()
    app.router.add_get("/_stats", stats)
    app.router.add_get("/{name}", package)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(f"http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    asyncio.run(serve(parser.parse_args().dir))


if __name__ == "__main__":
    main()
