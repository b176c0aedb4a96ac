"""The packages' http server, a child process so that serving costs nothing on the benchmark's
own event loop: ``python -m benchlib.pkg_server --dir D`` serves D's files on 127.0.0.1 (sendfile),
prints its base URL as its first line, counts GETs of whole files per file (downloads counted at
the source) and reports them at ``/_stats``, and ranged GETs (parts of a file, such as the tail an
agent reads to extract while it downloads) apart, at ``/_ranged``. It stops on SIGTERM.

``--rate BYTES_PER_S`` limits what it sends, all connections together, to that many bytes per
second: one token bucket that every response takes its chunks from, in turn (the fleet
workload's package store, whose link the nodes share and contend for). Without it files go out
by sendfile, as fast as the machine copies them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path

from aiohttp import web

CHUNK = 64 * 1024  # a limited response is sent in chunks of this size, each paid for in turn


class Bucket:
    """A token bucket shared by every connection: ``take(n)`` returns once ``n`` bytes may go
    out. Callers are served one at a time in arrival order (an asyncio lock is FIFO), so
    connections sending chunk by chunk share the rate about evenly. It holds at most ``burst``
    tokens (one chunk): an idle link does not save up for a later burst."""

    def __init__(self, rate: float, burst: int = CHUNK) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            if self._tokens < 0:  # the debt is paid by waiting; the next taker starts at ~0
                await asyncio.sleep(-self._tokens / self.rate)


async def serve(directory: Path, rate: float | None) -> None:
    gets: Counter[str] = Counter()
    ranged: Counter[str] = Counter()
    bucket = Bucket(rate) if rate else None

    async def package(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = directory / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return web.Response(status=404, text=f"no package {name}")
        if request.http_range.start is not None or request.http_range.stop is not None:
            ranged[name] += 1  # a part, not a download
        else:
            gets[name] += 1
        if bucket is None:
            return web.FileResponse(path, headers={"Content-Type": "application/zip"})
        return await _limited(request, path, bucket)

    async def stats(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(gets), content_type="application/json")

    async def ranges(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(ranged), content_type="application/json")

    app = web.Application()
    app.router.add_get("/_stats", stats)
    app.router.add_get("/_ranged", ranges)
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


async def _limited(request: web.Request, path: Path, bucket: Bucket) -> web.StreamResponse:
    """The file in chunks, each taken from the shared bucket before it is written."""
    data = await asyncio.to_thread(path.read_bytes)
    headers = {"Content-Type": "application/zip", "Accept-Ranges": "bytes"}
    span = request.http_range
    status = 200
    if span.start is not None or span.stop is not None:  # a part: as FileResponse answers
        part = range(len(data))[span]
        if not part:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        first, last = part[0], part[-1]
        headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
        data, status = data[first : last + 1], 206
    headers["Content-Length"] = str(len(data))
    response = web.StreamResponse(status=status, headers=headers)
    await response.prepare(request)
    view = memoryview(data)
    for offset in range(0, len(data), CHUNK):
        chunk = view[offset : offset + CHUNK]
        await bucket.take(len(chunk))
        await response.write(chunk)
    await response.write_eof()
    return response


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0  # said below
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of bytes/s above 0, not {text[:40]!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument(
        "--rate", type=_rate, metavar="BYTES_PER_S", help="limit all connections together"
    )
    args = parser.parse_args()
    asyncio.run(serve(args.dir, args.rate))


if __name__ == "__main__":
    main()
