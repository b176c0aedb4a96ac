"""A URI store over a mock transport, as the store's tests drive it: scripted packages, a recording
sleep, a settable clock, the store built on them."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from agent.core.uris import UriKey, UriKind
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.transport import MockTransport, Request, Response, TransportError
from agent.install.installers import InstallTools, build_installers
from agent.install.unpack.plan import ArchiveLimits
from agent.state.passes import PASS_WINDOW_S
from agent.state.state_db import StateDB
from agent.state.store import UriStore
from tests.harness.packages import make_zip

BASE = "http://pkgs.test/"


FILE_BYTES = 1000  # each package below unpacks to exactly this many bytes


LIMITS = FetchLimits(attempts=4, backoff_initial_s=0.5, backoff_max_s=1.5)


def package(name: str) -> bytes:
    """A py_modules zip of one module whose files hold FILE_BYTES bytes in all."""
    return make_zip({f"{name}/__init__.py": "x" * FILE_BYTES})


class MockPackages:
    """Packages in memory behind a ``MockTransport``: the handler serves ``BASE + name``,
    counts every GET, answers injected transport errors, then injected statuses first, and can
    hold a name's answer (``hold``) or stop the next body half-way (``stall``) until a gate is
    set. A name added with a ``stream`` is sent chunk by chunk with no Content-Length."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.streams: dict[str, Callable[[], AsyncIterator[bytes]]] = {}
        self.statuses: dict[str, list[int]] = {}
        self.errors: dict[str, list[TransportError]] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.stalls: dict[str, list[asyncio.Event]] = {}  # one per answer to come
        self.gets: Counter[str] = Counter()
        self.transport = MockTransport(self._handle)

    def add(self, name: str, *, statuses: tuple[int, ...] = ()) -> str:
        """Serve ``package(name)`` at the returned URL, after the ``statuses``."""
        self.bodies[name] = package(name)
        self.statuses[name] = list(statuses)
        return BASE + name

    def hold(self, name: str) -> asyncio.Event:
        """Hold every answer to ``name`` (whatever it is) until the returned gate is set."""
        return self.gates.setdefault(name, asyncio.Event())

    def open_all(self) -> None:
        """Let every held and stalled answer go (a rig's teardown)."""
        for gate in self.gates.values():
            gate.set()
        for stalls in self.stalls.values():
            for gate in stalls:
                gate.set()

    def stall(self, name: str) -> asyncio.Event:
        """Have the next 200 to ``name`` send half its body, then the rest once the returned
        gate is set."""
        gate = asyncio.Event()
        self.stalls.setdefault(name, []).append(gate)
        return gate

    async def _handle(self, request: Request) -> Response:
        name = request.url.removeprefix(BASE)
        self.gets[name] += 1
        if (gate := self.gates.get(name)) is not None:
            await gate.wait()
        if errors := self.errors.get(name):
            raise errors.pop(0)
        if statuses := self.statuses.get(name):
            return Response(statuses.pop(0), b"injected failure")
        if (stream := self.streams.get(name)) is not None:
            return Response(200, stream())
        body = self.bodies.get(name)
        if body is None:
            return Response(404, b"no such package")
        if stalls := self.stalls.get(name):
            body_held = _stalled(body, stalls.pop(0))
            return Response(200, body_held, {"Content-Length": str(len(body))})
        return Response(200, body)


async def _stalled(body: bytes, gate: asyncio.Event) -> AsyncIterator[bytes]:
    half = len(body) // 2
    yield body[:half]
    await gate.wait()
    yield body[half:]


class RecordingSleep:
    """Stands in for asyncio.sleep between retries: records each delay, returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


def make_store(
    root: Path,
    transport: MockTransport,
    *,
    db: StateDB,
    refcount: Callable[[UriKey], int],
    budget_bytes: int = 10**9,
    limits: FetchLimits = LIMITS,
    sleep: RecordingSleep | None = None,
    clock: Clock | None = None,
    pass_window_s: float = PASS_WINDOW_S,
) -> UriStore:
    """The store as the agent builds it, over the mock transport and ``db`` (opened); no disk
    floor."""
    fetcher = Fetcher(transport, limits, sleep=sleep or RecordingSleep(), rand=lambda: 0.0)
    installers = build_installers(
        InstallTools(fetcher, ArchiveLimits(), sys.executable, "pip", root / "logs")
    )
    return UriStore(
        root, installers, db=db, refcount=refcount, budget_bytes=budget_bytes,
        clock=clock or Clock(), pass_window_s=pass_window_s,
    )  # fmt: skip


def key_of(url: str) -> UriKey:
    return UriKey(UriKind.PY_MODULES, url)
