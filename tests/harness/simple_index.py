"""A package index on 127.0.0.1 (aiohttp): PEP 503 pages for the wheels it is given, and the
wheels themselves (ranges answered), each whole GET of a wheel counted (``gets``: downloads at
the source).

``loopback_only`` points every proxy variable at a closed port of 127.0.0.1 but for loopback
itself: an installer reaches this index and nothing beyond the machine."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from packaging.utils import canonicalize_name

from tests.harness.uv_wheels import no_network


class SimpleIndex:
    def __init__(self, wheels: Iterable[Path]) -> None:
        self.wheels = {wheel.name: wheel for wheel in wheels}
        self.gets: Counter[str] = Counter()  # wheel file name -> whole GETs
        self.ranged: Counter[str] = Counter()  # wheel file name -> GETs of a range
        self.base_url = ""

    @property
    def simple(self) -> str:
        """The index URL an installer is given (``--index-url``)."""
        return f"{self.base_url}/simple"

    def gets_of(self, project: str) -> int:
        """GETs of ``project``'s wheels."""
        return sum(n for name, n in self.gets.items() if _project(name) == project)

    async def page(self, request: web.Request) -> web.Response:
        project = canonicalize_name(request.match_info["project"])
        names = sorted(name for name in self.wheels if _project(name) == project)
        if not names:
            return web.Response(status=404)
        links = "".join(f'<a href="/files/{name}">{name}</a><br/>' for name in names)
        return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")

    async def file(self, request: web.Request) -> web.StreamResponse:
        """The wheel (ranges answered: uv reads a wheel's metadata from its tail first); a GET
        of it whole counted in ``gets``, a ranged one in ``ranged``."""
        wheel = self.wheels.get(request.match_info["file"])
        if wheel is None:
            return web.Response(status=404)
        if request.method == "GET":
            (self.ranged if request.http_range.start is not None or request.http_range.stop
             is not None else self.gets)[wheel.name] += 1  # fmt: skip
        return web.FileResponse(wheel)


def _project(wheel_name: str) -> str:
    return canonicalize_name(wheel_name.split("-")[0])


@asynccontextmanager
async def simple_index(wheels: Iterable[Path]) -> AsyncIterator[SimpleIndex]:
    index = SimpleIndex(wheels)
    app = web.Application()
    app.router.add_get("/simple/{project}/", index.page)
    app.router.add_get("/files/{file}", index.file)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    index.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield index
    finally:
        await runner.cleanup()


def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proxies at a closed loopback port (``no_network``), loopback itself reached directly."""
    no_network(monkeypatch)
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(key, "127.0.0.1,localhost")
