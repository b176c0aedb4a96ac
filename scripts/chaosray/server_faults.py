"""The package server's faults in the chaos run on real Ray: the server's hook
(``chaosray.server.serve``'s ``hook``) that answers some requests with a fault while the runner
wants it.

Each whole GET of a package (``/pkg/``) or a wheel (``/files/``) draws from the run's seeded
generator: with ``rate`` (0 until the runner raises it for a spell), one of ``KINDS``: ``500``
(an error status), ``reset`` (the connection dropped mid-body), ``stall`` (half the body, a
pause of a few seconds, then the rest). Every fault is recorded with its time and path
(``faults``): the oracle blames a failed unit on one only when the unit's env downloads that
path. Index pages and ranged reads are never faulted (an installer's resolution failing is not
what the run is about; its wheel downloads are).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

KINDS = ("500", "reset", "stall")
STALL_S = (1.0, 6.0)
FAULTED = ("/pkg/", "/files/")  # the paths of packages and wheels


@dataclass(frozen=True)
class ServerFault:
    t: float
    path: str
    kind: str


@dataclass
class ServerFaults:
    routes: Mapping[str, bytes]  # what the server serves: path -> body
    rng: random.Random
    rate: float = 0.0
    faults: list[ServerFault] = field(default_factory=list)

    async def __call__(self, request: web.Request) -> web.StreamResponse | None:
        """A faulted answer to ``request``, or None (the server answers it as usual)."""
        path = request.path
        body = self.routes.get(path)
        if body is None or not path.startswith(FAULTED) or "Range" in request.headers:
            return None
        if request.method != "GET" or self.rng.random() >= self.rate:
            return None
        kind = self.rng.choice(KINDS)
        self.faults.append(ServerFault(time.time(), path, kind))
        if kind == "500":
            return web.Response(status=500, text="injected by the chaos run")
        response = web.StreamResponse(headers={"Content-Length": str(len(body))})
        half = len(body) // 2
        try:
            await response.prepare(request)
            await response.write(body[:half])
            if kind == "reset":
                assert request.transport is not None
                request.transport.abort()
                return response
            await asyncio.sleep(self.rng.uniform(*STALL_S))
            await response.write(body[half:])
            await response.write_eof()
        except ConnectionError:
            pass  # the agent gave up on it (or died): nothing to answer
        return response
