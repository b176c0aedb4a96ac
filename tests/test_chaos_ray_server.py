"""The Ray chaos run's package server (scripts/chaosray/server.py), on 127.0.0.1: every route
of the material whole, a range as 206 (uv reads a wheel's tail first), an unsatisfiable one as
416, a page asked for without its slash, 404 for the rest, and the runner's hook answering
instead when it returns a response."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
from aiohttp import web

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the runner's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from chaosray.server import serve  # noqa: E402
from chaosray.workload import material  # noqa: E402


async def test_it_serves_every_route_whole_and_in_ranges() -> None:
    made = material(9)
    routes = made.routes()
    async with serve(made) as base, aiohttp.ClientSession() as http:
        assert base.startswith("http://127.0.0.1:")
        for path, body in routes.items():
            async with http.get(base + path) as got:
                assert (got.status, await got.read()) == (200, body), path
                assert got.headers["Accept-Ranges"] == "bytes"
        wheel = "/files/chaos_w-1.0-py3-none-any.whl"
        body = routes[wheel]
        for spec, part in (("bytes=10-19", body[10:20]), ("bytes=-22", body[-22:])):
            async with http.get(base + wheel, headers={"Range": spec}) as got:
                assert (got.status, await got.read()) == (206, part), spec
                first = 10 if spec == "bytes=10-19" else len(body) - 22
                expected = f"bytes {first}-{first + len(part) - 1}/{len(body)}"
                assert got.headers["Content-Range"] == expected
        async with http.get(base + wheel, headers={"Range": f"bytes={len(body)}-"}) as got:
            assert got.status == 416
        async with http.head(base + wheel) as got:
            assert (got.status, int(got.headers["Content-Length"])) == (200, len(body))
        async with http.get(base + "/simple/chaos-a") as got:
            assert (got.status, got.content_type) == (200, "text/html")
            assert await got.read() == routes["/simple/chaos-a/"]
        async with http.get(base + "/pkg/nothing.zip") as got:
            assert got.status == 404


async def test_the_hook_answers_first_when_it_returns_a_response() -> None:
    seen: list[str] = []

    async def hook(request: web.Request) -> web.StreamResponse | None:
        seen.append(request.path)
        return web.Response(status=500) if request.path.endswith(".zip") else None

    made = material(9)
    async with serve(made, hook) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/pkg/wd-b.zip") as got:
            assert got.status == 500
        async with http.get(base + "/simple/chaos-b/") as got:
            assert got.status == 200
    assert seen == ["/pkg/wd-b.zip", "/simple/chaos-b/"]
