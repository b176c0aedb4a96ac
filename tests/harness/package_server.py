"""A real HTTP package server (aiohttp on 127.0.0.1) whose packages a test scripts: statuses
answered first, held bodies, slow chunks, ranges, cut transfers; it counts the GETs."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class _Package:
    body: bytes
    statuses: list[int] = field(default_factory=list)  # answered first, one per request
    gate: asyncio.Event | None = None  # when set: hold the body until the event is set
    chunk_delay_s: float = 0.0
    # say Accept-Ranges and answer a Range request 206 with those bytes (else 200, whole)
    ranges: bool = True
    range_body: bytes | None = None  # what ranges are cut from, if not ``body``
    cuts: list[int] = field(default_factory=list)  # whole GETs that end after so many bytes
    last_gate: tuple[int, asyncio.Event] | None = None  # the last N bytes wait for the event


class PackageServer:
    """A real aiohttp server on 127.0.0.1 that serves packages and counts every GET of a whole
    package (``gets``: downloads at the source) and every ranged GET (``ranged``: a part, such
    as the tail an extraction that overlaps its download reads first)."""

    def __init__(self) -> None:
        self._packages: dict[str, _Package] = {}
        self.gets: Counter[str] = Counter()
        self.ranged: Counter[str] = Counter()
        self._requested: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name:.+}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def add(self, name: str, body: bytes, *, statuses: list[int] | None = None) -> str:
        """Serve ``body`` at /name; return its URL."""
        self._packages[name] = _Package(body, list(statuses or []))
        return f"{self.base_url}/{name}"

    def hold(self, name: str) -> asyncio.Event:
        """Hold /name's responses until the returned event is set."""
        gate = asyncio.Event()
        self._packages[name].gate = gate
        return gate

    def slow(self, name: str, chunk_delay_s: float) -> None:
        self._packages[name].chunk_delay_s = chunk_delay_s

    def package(self, name: str) -> _Package:
        """/name's settings, to change how it is served."""
        return self._packages[name]

    def hold_last(self, name: str, size: int) -> asyncio.Event:
        """Send /name's body but its last ``size`` bytes, then hold them until the returned
        event is set (whole GETs only)."""
        gate = asyncio.Event()
        self._packages[name].last_gate = (size, gate)
        return gate

    def requested(self, name: str) -> asyncio.Event:
        """An event set once /name has been requested."""
        return self._requested.setdefault(name, asyncio.Event())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        package = self._packages.get(name)
        span = _range(request.headers.get("Range", ""))
        if package is not None and package.ranges and span is not None:
            self.ranged[name] += 1
            return _part(package.range_body or package.body, span)
        self.gets[name] += 1
        self.requested(name).set()
        if package is None:
            return web.Response(status=404, text="no such package")
        if package.statuses:
            return web.Response(status=package.statuses.pop(0), text="injected failure")
        if package.gate is not None:
            await package.gate.wait()
        cut = package.cuts.pop(0) if package.cuts else None
        ranges = {"Accept-Ranges": "bytes"} if package.ranges else {}
        if not package.chunk_delay_s and cut is None and package.last_gate is None:
            return web.Response(body=package.body, content_type="application/zip", headers=ranges)
        body = package.body
        response = web.StreamResponse(headers={"Content-Length": str(len(body)), **ranges})
        await response.prepare(request)
        held = len(body) - package.last_gate[0] if package.last_gate is not None else len(body)
        for start in range(0, held if cut is None else cut, 64 * 1024):
            end = min(start + 64 * 1024, held if cut is None else cut)
            await response.write(body[start:end])
            await asyncio.sleep(package.chunk_delay_s)
        if cut is not None:  # the connection drops mid-body
            assert request.transport is not None
            request.transport.close()
            return response
        if package.last_gate is not None:
            await package.last_gate[1].wait()
            await response.write(body[held:])
        await response.write_eof()
        return response


def _range(header: str) -> tuple[int, int] | None:
    """``bytes=FIRST-LAST`` as numbers (the only form the agent sends), or None."""
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", header)
    return (int(match[1]), int(match[2])) if match else None


def _part(body: bytes, span: tuple[int, int]) -> web.Response:
    first, last = span[0], min(span[1], len(body) - 1)
    if first > last:
        return web.Response(status=416, headers={"Content-Range": f"bytes */{len(body)}"})
    return web.Response(
        status=206,
        body=body[first : last + 1],
        headers={"Content-Range": f"bytes {first}-{last}/{len(body)}"},
        content_type="application/zip",
    )


@asynccontextmanager
async def package_server() -> AsyncIterator[PackageServer]:
    server = PackageServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def route_server(route: Route, path: str = "/{name:.*}") -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 answering GETs of ``path`` with ``route``; yields its
    base URL (``http://127.0.0.1:<port>``)."""
    app = web.Application()
    app.router.add_get(path, route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
