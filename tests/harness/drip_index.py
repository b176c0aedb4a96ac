"""A package index on 127.0.0.1 that drips: a PEP 503 simple page for one wheel, and the wheel
sent in small chunks, its second half held until the test releases it. It counts the wheel's
GETs (downloads at the source)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

CHUNK = 16 * 1024


class DripIndex:
    def __init__(self, wheel: Path, chunk_delay_s: float) -> None:
        self.wheel = wheel
        self.body = wheel.read_bytes()
        self.name = wheel.name.split("-")[0]
        self.chunk_delay_s = chunk_delay_s
        self.gets = 0  # of the wheel
        self.gate = asyncio.Event()  # its second half waits for it
        self.base_url = ""

    @property
    def simple(self) -> str:
        return f"{self.base_url}/simple"

    def release(self) -> None:
        self.gate.set()

    async def page(self, request: web.Request) -> web.Response:
        link = f'<a href="/files/{self.wheel.name}">{self.wheel.name}</a>'
        return web.Response(text=f"<html><body>{link}</body></html>", content_type="text/html")

    async def file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["file"] != self.wheel.name:
            return web.Response(status=404)
        self.gets += 1
        response = web.StreamResponse(headers={"Content-Length": str(len(self.body))})
        await response.prepare(request)
        half = len(self.body) // 2
        for start in range(0, len(self.body), CHUNK):
            if start >= half:
                await self.gate.wait()
            await response.write(self.body[start : start + CHUNK])
            if start < half:
                await asyncio.sleep(self.chunk_delay_s)
        await response.write_eof()
        return response


@asynccontextmanager
async def drip_index(wheel: Path, *, chunk_delay_s: float = 0.01) -> AsyncIterator[DripIndex]:
    index = DripIndex(wheel, chunk_delay_s)
    app = web.Application()
    app.router.add_get(f"/simple/{index.name}/", index.page)
    app.router.add_get("/files/{file}", index.file)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    index.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield index
    finally:
        index.release()  # a held body ends, so the server stops at once
        await runner.cleanup()
