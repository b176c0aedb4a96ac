"""Builds in flight: those kept going past their creates' setup timeout, and what every build
says while it runs.

A create that reaches its ``setup_timeout_seconds`` fails then, as Ray's agent does; the installs
it started are not thrown away. ``keep`` marks them: when their last waiter leaves, the store does
not cancel them (``UriStore.ensure``), they run to their end under the store: READY (released at
once if no create wants it then: an unused package, kept in the budget and evictable as any), or
failed and cleaned up as any failure (``installing``). A later ensure of the key (the create
retried, or another env naming the same package) joins the build in flight. At most
``max_kept`` builds go on with nobody waiting (past that a build is cancelled as before, saying
so); one per key, as every install. Nothing half-built is ever used: a build is staged and renamed
into place whole (``placing``).

While a build runs, every ``every_s`` (``agent.core.progress``) its progress line goes to the
agent's log and to ``emit`` (the service's: the setup logs of the jobs waiting on it): its label
and kind, the packages installed and the bytes in its staging folder so far (measured in a
thread, at most once per line), and its time so far. The clock and the sleep are injected.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

from agent.core.progress import PROGRESS_EVERY_S, BuildProgress, Throttle, progress_line
from agent.core.uris import UriKey
from agent.install.disk.root import du
from agent.state.entries import UriEntry, UriState

log = logging.getLogger(__name__)

Emit = Callable[[UriKey, str], None]
_TICK_S = 1.0  # how often the watch looks for a line due (each build's is every ``every_s``)


class Builds:
    """The store's builds in flight (its ``entries``, shared)."""

    def __init__(
        self,
        entries: dict[UriKey, UriEntry],
        *,
        max_kept: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        every_s: float = PROGRESS_EVERY_S,
        measure: Callable[[Path], Measured] | None = None,
    ) -> None:
        self._entries = entries
        self._max_kept = max_kept
        self._clock = clock
        self._sleep = sleep
        self._throttle = Throttle(every_s)
        self._measure = measure or measure_staging
        self.emit: Emit | None = None  # set by the service: a line for the jobs waiting
        self._task: asyncio.Task[None] | None = None

    @property
    def every_s(self) -> float:
        """Between two lines of one build."""
        return self._throttle.every_s

    @every_s.setter
    def every_s(self, value: float) -> None:
        self._throttle.every_s = value

    # -- kept going ------------------------------------------------------------------------
    def keep(self, keys: Iterable[UriKey]) -> tuple[UriKey, ...]:
        """Keep these keys' installs in flight going when their last waiter leaves (a create's
        setup timeout); return those kept. Bounded: at most ``max_kept`` kept at once."""
        kept: list[UriKey] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.state is not UriState.INSTALLING or entry.abandoned:
                continue
            if not entry.kept and self.kept_count() >= self._max_kept:
                log.warning(
                    "%s: not kept going past its create's setup timeout: %d builds already go "
                    "on with no create waiting (the most kept); cancelled",
                    key.label,
                    self._max_kept,
                    extra={"uri": key.label},
                )
                continue
            entry.kept = True
            kept.append(key)
        return tuple(kept)

    def kept_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.kept and e.state is UriState.INSTALLING)

    def left(self, entry: UriEntry) -> bool:
        """The last waiter of ``entry``'s install left it: True when it goes on (kept)."""
        if not entry.kept:
            return False
        log.info(
            "%s: its build goes on with no create waiting (a setup timeout); a create of it "
            "joins the build",
            entry.key.label,
            extra={"uri": entry.key.label},
        )
        return True

    # -- progress --------------------------------------------------------------------------
    def in_flight(self) -> Iterator[tuple[UriEntry, BuildProgress]]:
        """Each install under this agent's claim and its progress as last measured (no I/O)."""
        now = self._clock()
        for entry in list(self._entries.values()):
            build = entry.build
            if entry.state is UriState.INSTALLING and build is not None:
                yield entry, _progress(entry, now)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="build progress")

    def halt(self) -> asyncio.Task[None] | None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def _watch(self) -> None:
        while True:
            await self._sleep(min(_TICK_S, self.every_s))
            try:
                await self.tick()
            except Exception:  # a line lost, never the watch
                log.exception("build progress: a tick failed")

    async def tick(self) -> int:
        """Say the lines due now: each measured, logged and emitted. Returns how many."""
        now = self._clock()
        due = [
            entry
            for entry, _ in self.in_flight()
            if entry.build is not None and self._throttle.due(entry.key, entry.build.started, now)
        ]
        self._throttle.forget({e.key for e, _ in self.in_flight()})
        for entry in due:
            build = entry.build
            if build is not None and build.staging is not None:
                measured = await asyncio.to_thread(self._measure, build.staging)
                build.bytes_so_far, build.packages_done = measured
            if entry.build is None:  # it ended meanwhile
                continue
            progress = _progress(entry, self._clock())
            line = progress_line(progress)
            log.info(
                line,
                extra={
                    "uri": progress.label,
                    "kind": progress.kind,
                    "bytes_so_far": progress.bytes_so_far,
                    "seconds": round(progress.elapsed_s, 3),
                },
            )
            if self.emit is not None:
                self.emit(entry.key, line)
        return len(due)


def _progress(entry: UriEntry, now: float) -> BuildProgress:
    build = entry.build
    assert build is not None
    return BuildProgress(
        label=entry.key.label,
        kind=entry.key.kind.value,
        elapsed_s=max(0.0, now - build.started),
        bytes_so_far=build.bytes_so_far,
        packages_done=build.packages_done or None,
        queued=build.staging is None,
    )


Measured = tuple[int, int]  # bytes, and packages installed (``*.dist-info`` folders)


def measure_staging(staging: Path) -> Measured:
    """A build's staging folder so far: its bytes (``du``: each inode once), and the packages
    installed in it (a venv's ``*.dist-info`` folders: pip writes one as it installs each
    package, uv as it links each). Blocking: in a thread. Files vanishing under it are skipped."""
    packages = 0
    for _, dirs, _ in os.walk(staging):
        packages += sum(1 for d in dirs if d.endswith(".dist-info"))
    return du(staging), packages
