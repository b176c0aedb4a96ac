"""The Ray chaos run's package server: aiohttp on 127.0.0.1, every route of a ``Material``
(the zips at their paths, the wheels at ``/files/<name>``, the PEP 503 pages at
``/simple/<project>/``), ranges answered (uv reads a wheel's tail first; the agent may read a
zip's), HEAD too.

``hook``, when given, is awaited first for every request: a response it returns is sent instead
(the runner's faults: a 500, a stall before answering, a reset connection); None serves the
file. ``serve`` yields the base URL (``http://127.0.0.1:<port>``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from chaosray.workload import Material

Hook = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def _content_type(path: str) -> str:
    if path.endswith("/"):
        return "text/html"
    return "application/zip" if path.endswith(".zip") else "application/octet-stream"


def _answer(request: web.Request, body: bytes, content_type: str) -> web.Response:
    """The body, or the part a ``Range`` header asks for (206), or 416 for one out of it."""
    headers = {"Accept-Ranges": "bytes"}
    if "Range" not in request.headers:
        return web.Response(body=body, content_type=content_type, headers=headers)
    try:
        span = request.http_range
        start, stop, _ = span.indices(len(body))
    except ValueError:
        start, stop = 0, 0
    if start >= stop:
        headers["Content-Range"] = f"bytes */{len(body)}"
        return web.Response(status=416, headers=headers)
    headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(body)}"
    return web.Response(
        status=206, body=body[start:stop], content_type=content_type, headers=headers
    )


@asynccontextmanager
async def serve(material: Material, hook: Hook | None = None) -> AsyncIterator[str]:
    """Serve ``material`` on 127.0.0.1 (a free port) while the block runs; its base URL."""
    routes = material.routes()

    async def handle(request: web.Request) -> web.StreamResponse:
        if hook is not None:
            answer = await hook(request)
            if answer is not None:
                return answer
        path = request.path
        body = routes.get(path, routes.get(path + "/"))  # a page asked for without its slash
        if body is None:
            return web.Response(status=404, text="no such path")
        return _answer(request, body, _content_type(path if path in routes else path + "/"))

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
