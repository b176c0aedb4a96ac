"""Headers sent with http(s) downloads (under Ray: Ray's User-Agent and bearer token, issue 31),
over aiohttp and real servers on 127.0.0.1: every GET carries them, ranged reads too, and a
redirect to another origin (here another port) drops ``Authorization``, so a token goes only
where it was sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from agent.core.uris import parse_uri
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.transport import MockTransport, Request, Response
from agent.ops.ray_knobs import RAYS_USER_AGENT, ray_http_headers
from tests.harness.in_process import running_agent
from tests.harness.package_server import Route, route_server
from tests.harness.packages import make_zip

BODY = make_zip({"proj/main.py": "print('hi')\n" * 50})
LIMITS = FetchLimits(attempts=1)
TOKEN = "t0ken-of-the-test"
HEADERS = dict(ray_http_headers({"RAY_RUNTIME_ENV_BEARER_TOKEN": TOKEN}))

Seen = list[tuple[str, dict[str, str]]]


def _recording(seen: Seen, answer: Callable[[web.Request], web.StreamResponse]) -> Route:
    """``answer``, noting each request's path and headers in ``seen``."""

    async def route(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, dict(request.headers)))
        return answer(request)

    return route


async def _fetch(url: str, dest: Path) -> int:
    async with aiohttp.ClientSession(trust_env=False) as session:
        fetcher = Fetcher(session, LIMITS, http_headers=HEADERS)
        return await fetcher.fetch(parse_uri("working_dir", url), dest, label=url)


async def test_a_get_carries_rays_user_agent_and_the_bearer_token(tmp_path: Path) -> None:
    seen: Seen = []
    async with route_server(_recording(seen, lambda _: web.Response(body=BODY))) as base:
        assert await _fetch(f"{base}/p.zip", tmp_path / "out") == len(BODY)
    ((path, headers),) = seen
    assert path == "/p.zip"
    assert headers["User-Agent"] == RAYS_USER_AGENT
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Accept-Encoding"] == "identity"  # the fetcher's own stay on top


async def test_a_redirect_to_the_same_origin_keeps_the_token(tmp_path: Path) -> None:
    seen: Seen = []

    def answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/p.zip":
            raise web.HTTPFound("/moved/p.zip")
        return web.Response(body=BODY)

    async with route_server(_recording(seen, answer)) as base:
        assert await _fetch(f"{base}/p.zip", tmp_path / "out") == len(BODY)
    assert [path for path, _ in seen] == ["/p.zip", "/moved/p.zip"]
    assert all(h["Authorization"] == f"Bearer {TOKEN}" for _, h in seen)


async def test_a_redirect_to_another_origin_drops_the_token_and_keeps_the_user_agent(
    tmp_path: Path,
) -> None:
    first: Seen = []
    other: Seen = []
    async with route_server(_recording(other, lambda _: web.Response(body=BODY))) as elsewhere:

        def answer(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(f"{elsewhere}/p.zip")

        async with route_server(_recording(first, answer)) as base:
            assert await _fetch(f"{base}/p.zip", tmp_path / "out") == len(BODY)
    ((_, sent_first),) = first
    ((_, sent_other),) = other
    assert sent_first["Authorization"] == f"Bearer {TOKEN}"
    assert "Authorization" not in sent_other, sent_other
    assert sent_other["User-Agent"] == RAYS_USER_AGENT


async def test_the_mock_transport_drops_the_token_across_origins_as_aiohttp_does(
    tmp_path: Path,
) -> None:
    """The mock keeps aiohttp's rule, so tests over it see what the agent sends."""

    def handler(request: Request) -> Response:
        if request.url == "http://a.test/p.zip":
            return Response(302, headers={"Location": "http://a.test:80/q.zip"})
        if request.url == "http://a.test:80/q.zip":  # the same origin, its port spelled out
            return Response(302, headers={"Location": "https://a.test/r.zip"})
        return Response(200, BODY)

    transport = MockTransport(handler)
    fetcher = Fetcher(transport, LIMITS, http_headers=HEADERS)
    url = "http://a.test/p.zip"
    await fetcher.fetch(parse_uri("working_dir", url), tmp_path / "out", label=url)
    tokens = [r.headers.get("Authorization") for r in transport.requests]
    assert tokens == [f"Bearer {TOKEN}", f"Bearer {TOKEN}", None]


async def test_a_ranged_read_carries_the_headers_too() -> None:
    transport = MockTransport(lambda _: Response(206, b"x" * 10, {"Content-Range": "bytes 0-9/20"}))
    fetcher = Fetcher(transport, LIMITS, http_headers=HEADERS)
    assert await fetcher.read_range("http://a.test/p.zip", 0, 10, 20, {}) == b"x" * 10
    (request,) = transport.requests
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Range"] == "bytes=0-9"


async def test_an_agent_sends_its_settings_headers_with_a_packages_download() -> None:
    """The agent's ``http_headers`` (set from Ray's variables under Ray) reach its fetcher."""
    seen: Seen = []
    got = _recording(seen, lambda _: web.Response(body=BODY))
    async with route_server(got) as base, running_agent(http_headers=tuple(HEADERS.items())) as a:
        reply = await a.create(json.dumps({"working_dir": f"{base}/wd.zip"}))
        assert reply.context.cwd
    ((_, headers),) = seen
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["User-Agent"] == RAYS_USER_AGENT
