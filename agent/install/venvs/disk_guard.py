"""The disk floor while an installer runs: a venv build (uv, pip) writes what nothing measured
ahead, so free space on the root's file system is watched while it runs, and the installer is
stopped (its whole process group killed) before the floor is crossed.

``DiskGuard.watch`` waits for the installer's exit and, every ``interval_s`` meanwhile, measures
the room left (``BuildRoom.spare``: one statvfs, the floor, what the other installs in flight
still expect). What the disk lost since the build's first installer started is what the build
wrote (others' writes included: a bound good enough for a message), told to the room so the
other installs count it. When the room left goes under zero the group is killed and the build
fails with ``DiskExhausted`` naming the figures (``BuildRoom.stopped``); the store then removes
the staging folder, so nothing half-built stays (uv's own partial unpack in the wheel cache is
the cache's own bytes: unused, cleared when room is made). The floor must exceed what an
installer writes in ``interval_s``: at 1 GB/s, 50 MB; the default floor is 1 GiB.

An installer that meets ENOSPC anyway (a race with another writer, or no floor) fails with its
own words; ``ran_out`` finds them in its log, and the build's error is the same
``DiskExhausted`` with the figures, never the installer's raw text.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.core.errors import DiskExhausted

INTERVAL_S = 0.05  # between two measures while an installer runs
# what pip, uv (Rust's io::Error) and Python say of ENOSPC
ENOSPC_WORDS = ("No space left on device", "os error 28", "[Errno 28]")
_LOG_TAIL_BYTES = 64 * 1024  # of an installer's log, read for them


@dataclass(frozen=True, slots=True)
class Spare:
    """The room on the root's disk, measured once."""

    free: int  # bytes free (for the agent's user)
    floor: int  # bytes kept free: the min-free-disk setting
    others: int  # bytes other installs in flight still expect to write

    @property
    def left(self) -> int:
        """What may still be written before the floor is crossed."""
        return self.free - self.floor - self.others


class BuildRoom(Protocol):
    """The disk floor as one venv build sees it (the store's ``DiskRoom``, for one install)."""

    async def reserve(self, needed: int, what: str) -> None:
        """Make room for ``needed`` more bytes (evicting unused packages), or raise
        ``DiskExhausted`` naming them; ``what``: the build and how the figure was made."""

    def spare(self) -> Spare | None:
        """The room now (one statvfs); None when the agent keeps no floor."""

    def wrote(self, written: int) -> None:
        """The build has written ``written`` bytes so far (its claim's progress)."""

    def stopped(self, written: int, spare: Spare, *, ran_out: bool) -> DiskExhausted:
        """The error of a build stopped by the guard (``ran_out``: by ENOSPC) after
        ``written`` bytes, with the figures."""


class Exited(Protocol):
    """An installer as the guard sees it (``agent.install.venvs.spawn.Child``)."""

    async def wait(self) -> int: ...

    def kill(self, *, group: bool = False) -> None: ...


class DiskGuard:
    """One build's guard, across its installers (``uv venv``, then ``uv pip install``...): what
    it wrote is counted from the first one's start."""

    def __init__(self, room: BuildRoom, *, interval_s: float = INTERVAL_S) -> None:
        self._room = room
        self._interval_s = interval_s
        self._start_free: int | None = None
        self.written = 0

    async def watch(self, child: Exited) -> int:
        """Wait for ``child``'s exit status; stop it and raise ``DiskExhausted`` if the room
        left goes under zero first."""
        spare = self._measure()
        if spare is None:
            return await child.wait()
        waiting = asyncio.ensure_future(child.wait())
        try:
            while True:
                if spare.left < 0:
                    child.kill(group=True)
                    await asyncio.shield(waiting)
                    raise self._room.stopped(self.written, spare, ran_out=False)
                done, _ = await asyncio.wait({waiting}, timeout=self._interval_s)
                if done:
                    return waiting.result()
                spare = self._measure()
                assert spare is not None, "the floor does not come and go"
        finally:
            if not waiting.done():  # cancelled: the caller kills the group and waits
                waiting.cancel()

    def ran_out(self) -> DiskExhausted:
        """The error of an installer that met ENOSPC, with the figures measured now."""
        spare = self._measure() or Spare(0, 0, 0)
        return self._room.stopped(self.written, spare, ran_out=True)

    def _measure(self) -> Spare | None:
        spare = self._room.spare()
        if spare is None:
            return None
        if self._start_free is None:
            self._start_free = spare.free
        self.written = max(self.written, self._start_free - spare.free)
        self._room.wrote(self.written)
        return spare


def says_enospc(text: str) -> bool:
    """Whether an installer's output says it ran out of disk space."""
    return any(words in text for words in ENOSPC_WORDS)


def log_says_enospc(log: Path, command_mark: str) -> bool:
    """Whether the last command's output in an installer's log (its end, after the last line
    starting with ``command_mark``) says it ran out of disk space. Blocking."""
    with log.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
        text = f.read().decode(errors="replace")
    return says_enospc(text.rsplit(f"\n{command_mark}", 1)[-1])


def enospc_error(guard: DiskGuard | None, who: str, log: Path) -> DiskExhausted:
    """An installer (``who``: its label and program) that met ENOSPC: the guard's error with
    the figures, or, with no guard (a lock, not a build), one naming its log."""
    if guard is not None:
        return guard.ran_out()
    return DiskExhausted(
        f"{who} ran out of space on the agent's disk (its whole output is in {log} on the "
        "agent's node): free space on that disk"
    )
