"""The disk floor: whether an install's next bytes fit on the agent's disk, with what it keeps free.

An install says how many bytes it is about to write (a download's declared size, a zip's
unpacked size, a chunk past what was declared); ``DiskRoom.make_room`` lets it go on only if the
file system keeps its floor (the min-free-disk setting) free after those bytes *and* after what
the other installs in flight still expect to write (their claims). If not, it asks the store to
evict unused packages, when evicting them can make the room, waits for their deletion, and
measures again; else it refuses with ``DiskExhausted``, naming the figures.

Evictions are the store's: the room only says how many bytes it lacks (``evict``, a coroutine
returning the packages moved to the trash: a pass over the root's index). Measuring is one
``statvfs`` call, kept on the event loop: it is a quick metadata call on the agent's local root,
and ``take`` measures once per downloaded chunk, where a thread hop each time would cost more
than the call. Deleting the evicted packages runs in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import DiskExhausted
from agent.install.disk.root import DiskFloor, disk_space, remove_all


@dataclass(eq=False)
class Claim:
    """The disk one install in flight expects to write and has not written yet."""

    declared: int = 0
    written: int = 0

    @property
    def outstanding(self) -> int:
        return max(self.declared - self.written, 0)


class DiskRoom:
    """The floor under one root, and the claims of the installs in flight."""

    def __init__(
        self,
        root: Path,
        floor: DiskFloor | None,
        evict: Callable[[int], Awaitable[list[Path]]],
    ) -> None:
        """``floor``: None keeps no floor (every install fits). ``evict(n)``: evict unused
        packages to free at least ``n`` bytes, or none if that cannot; return their paths in
        the trash, still to be deleted."""
        self._root = root
        self._floor = floor
        self._evict = evict
        # one per install between its slot and its end (the store adds and discards it);
        # each counts against every other install's room
        self.claims: set[Claim] = set()

    def space(self, claim: Claim, label: str) -> InstallSpace:
        """The floor as one install's fetcher sees it (``agent.install.fetch.base.Space``)."""
        return InstallSpace(self, claim, label)

    async def make_room(
        self,
        needed: int,
        label: str,
        claim: Claim,
        *,
        written: int | None = None,
        reserve: bool = False,
    ) -> None:
        """Leave the floor free after ``needed`` more bytes and what the other installs in
        flight still expect to write, evicting unused packages (and waiting for their deletion)
        if that is what it takes and can make it; else refuse, with the figures. ``written``:
        the bytes of a download in flight (for the message). ``reserve``: the claim expects
        ``needed`` bytes from now on, counted against the others only once they fit (set in the
        step that found the room: an install waiting for an eviction, or refused, takes no room
        from the installs streaming meanwhile)."""
        if self._floor is None:
            self._reserve(claim, needed, reserve)
            return
        total, free = disk_space(self._root)
        floor = self._floor.floor(total)
        others = self._others(claim)
        if free - others - needed >= floor:
            self._reserve(claim, needed, reserve)
            return
        trashed = await self._evict(floor + needed + others - free)  # [] when it would not do
        if trashed:
            await asyncio.to_thread(remove_all, trashed)  # the room exists once they are gone
        # measured again even with nothing trashed: the eviction may have cleared the wheel cache
        total, free = disk_space(self._root)
        others = self._others(claim)
        if free - others - needed < floor:
            raise DiskExhausted(_no_room(label, needed, written, floor, free, others, len(trashed)))
        self._reserve(claim, needed, reserve)

    @staticmethod
    def _reserve(claim: Claim, size: int, reserve: bool) -> None:
        if reserve:
            claim.declared, claim.written = size, 0

    def _others(self, claim: Claim) -> int:
        return sum(c.outstanding for c in self.claims if c is not claim)


class InstallSpace:
    """The floor, as the fetcher sees it (``agent.install.fetch.base.Space``) for one install."""

    def __init__(self, room: DiskRoom, claim: Claim, label: str) -> None:
        self._room, self._claim, self._label = room, claim, label

    async def expect(self, size: int) -> None:
        await self._room.make_room(size, self._label, self._claim, reserve=True)

    async def take(self, written: int, more: int) -> None:
        claim = self._claim
        claim.written = written
        needed = max(claim.outstanding, more)
        await self._room.make_room(needed, self._label, claim, written=written)

    async def add(self, size: int) -> None:
        claim = self._claim
        await self._room.make_room(claim.outstanding + size, self._label, claim)
        claim.declared += size  # counted against the others once it fits, as ``expect`` does


def _no_room(
    label: str,
    needed: int,
    written: int | None,
    floor: int,
    free: int,
    others: int,
    evicted: int,
) -> str:
    keeps = f"keeps {floor} free (the min-free-disk setting)"
    held = f" ({others} of them expected by other installs in flight)" if others else ""
    after = f"after evicting {evicted} unused package(s)"
    if written is not None:
        return (
            f"{label}: the download has written {written} bytes and needs room for {needed} "
            f"more; the agent {keeps}, but {free} bytes are free on the agent's disk{held} "
            f"{after}; its partial file is removed"
        )
    if needed == 0:
        return (
            f"{label}: {free} bytes are free on the agent's disk{held} and the agent {keeps}, "
            f"{after}: nothing can be installed until space is freed"
        )
    return (
        f"{label}: installing needs {needed} bytes and {keeps}, but {free} bytes are free on "
        f"the agent's disk{held} {after}"
    )
