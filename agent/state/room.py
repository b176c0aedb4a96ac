"""The disk floor: whether an install's next bytes fit on the agent's disk, with what it keeps free.

An install says how many bytes it is about to write (a download's declared size, a zip's
unpacked size, a chunk past what was declared); ``DiskRoom.make_room`` lets it go on only if the
file system keeps its floor (the min-free-disk setting) free after those bytes *and* after what
the other installs in flight still expect to write (their claims). If not, it asks the store to
evict unused packages, when evicting them can make the room, waits for their deletion, and
measures again; else it refuses with ``DiskExhausted``, naming the figures.

A venv build says what it estimates (``BuildSpace.reserve``: ``agent.install.venvs.estimate``)
and is watched while its installer runs (``agent.install.venvs.disk_guard``); its refusals name
the figures in human units, the setting, and the ways to make room.

Evicting a venv whose files are hardlinks into the wheel cache frees nothing until the cache
is cleared too: so the room evicts in rounds (at most ``EVICT_ROUNDS``), measuring after each; a
round that finds no unused package to evict clears the cache's own bytes instead, and the
rounds end when one frees nothing.

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
from agent.core.units import human_bytes
from agent.install.disk.root import DiskFloor, disk_space, remove_all
from agent.install.venvs.disk_guard import Spare

EVICT_ROUNDS = 3  # of eviction and measure, for one make_room


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
        *,
        measure: Callable[[Path], tuple[int, int]] = disk_space,
    ) -> None:
        """``floor``: None keeps no floor (every install fits). ``evict(n)``: evict unused
        packages to free at least ``n`` bytes, or none if that cannot; return their paths in
        the trash, still to be deleted. ``measure``: (total, free) bytes of the root's file
        system (one statvfs)."""
        self._root = root
        self._measure = measure
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
        what: str | None = None,
    ) -> None:
        """Leave the floor free after ``needed`` more bytes and what the other installs in
        flight still expect to write, evicting unused packages (and waiting for their deletion)
        if that is what it takes and can make it; else refuse, with the figures. ``written``:
        the bytes of a download in flight (for the message). ``reserve``: the claim expects
        ``needed`` bytes from now on, counted against the others only once they fit (set in the
        step that found the room: an install waiting for an eviction, or refused, takes no room
        from the installs streaming meanwhile). ``what``: a venv build and how its ``needed``
        was estimated, for its refusal's words."""
        if self._floor is None:
            self._reserve(claim, needed, reserve)
            return
        total, free = self._measure(self._root)
        floor = self._floor.floor(total)
        others = self._others(claim)
        if free - others - needed >= floor:
            self._reserve(claim, needed, reserve)
            return
        evicted = 0
        for _ in range(EVICT_ROUNDS):
            trashed = await self._evict(floor + needed + others - free)  # []: it would not do
            if trashed:
                await asyncio.to_thread(remove_all, trashed)  # the room exists once they are gone
            evicted += len(trashed)
            # measured again even with nothing trashed: the eviction may have cleared the cache
            before = free
            total, free = self._measure(self._root)
            others = self._others(claim)
            if free - others - needed >= floor:
                self._reserve(claim, needed, reserve)
                return
            if not trashed and free <= before:  # nothing evicted, nothing cleared: no more
                break
        if what is not None:
            figures = _Figures(needed, floor, free, others, evicted)
            raise DiskExhausted(_no_room_to_build(label, what, figures, self._root))
        raise DiskExhausted(_no_room(label, needed, written, floor, free, others, evicted))

    def build(self, claim: Claim, label: str) -> BuildSpace:
        """The floor as one venv build sees it (``agent.install.venvs.disk_guard.BuildRoom``)."""
        return BuildSpace(self, claim, label)

    def spare(self, claim: Claim) -> Spare | None:
        """The room now for ``claim``'s install; None when no floor is kept."""
        if self._floor is None:
            return None
        total, free = self._measure(self._root)
        return Spare(free, self._floor.floor(total), self._others(claim))

    def stopped(self, label: str, written: int, spare: Spare, *, ran_out: bool) -> DiskExhausted:
        """The error of a build the guard stopped (``ran_out``: its installer met ENOSPC)."""
        return DiskExhausted(_stopped(label, written, spare, self._root, ran_out=ran_out))

    @staticmethod
    def _reserve(claim: Claim, size: int, reserve: bool) -> None:
        if reserve:
            claim.declared, claim.written = size, 0

    def _others(self, claim: Claim) -> int:
        return sum(c.outstanding for c in self.claims if c is not claim)


class BuildSpace:
    """The floor, as a venv build sees it (``agent.install.venvs.disk_guard.BuildRoom``)."""

    def __init__(self, room: DiskRoom, claim: Claim, label: str) -> None:
        self._room, self._claim, self._label = room, claim, label

    async def reserve(self, needed: int, what: str) -> None:
        await self._room.make_room(needed, self._label, self._claim, reserve=True, what=what)

    def spare(self) -> Spare | None:
        return self._room.spare(self._claim)

    def wrote(self, written: int) -> None:
        self._claim.written = written

    def stopped(self, written: int, spare: Spare, *, ran_out: bool) -> DiskExhausted:
        return self._room.stopped(self._label, written, spare, ran_out=ran_out)


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


@dataclass(frozen=True, slots=True)
class _Figures:
    needed: int
    floor: int
    free: int
    others: int
    evicted: int


def _ways(root: Path) -> str:
    """What an operator can do about a full disk, and the setting to change."""
    return (
        f"To make room: free space on the disk of the agent's root ({root}), end the envs that "
        "use its packages (unused ones are evicted as room is needed), or lower the "
        "min-free-disk setting"
    )


def _held(others: int) -> str:
    if not others:
        return ""
    return f" ({human_bytes(others)} of them expected by other installs in flight)"


def _no_room_to_build(label: str, what: str, f: _Figures, root: Path) -> str:
    return (
        f"{label}: {what} needs about {human_bytes(f.needed)}; the agent keeps "
        f"{human_bytes(f.floor)} free on its disk (the min-free-disk setting), but "
        f"{human_bytes(f.free)} are free{_held(f.others)} after evicting {f.evicted} unused "
        f"package(s). Nothing was written. {_ways(root)}"
    )


def _stopped(label: str, written: int, spare: Spare, root: Path, *, ran_out: bool) -> str:
    how = (
        f"ran out of space on the agent's disk, which keeps {human_bytes(spare.floor)} free "
        "(the min-free-disk setting)"
        if ran_out
        else f"was stopped before the disk's free space fell under the {human_bytes(spare.floor)} "
        "the agent keeps free (the min-free-disk setting)"
    )
    return (
        f"{label}: building its venv {how}: it needs more than the {human_bytes(written)} it "
        f"had written, and {human_bytes(spare.free)} are free now{_held(spare.others)}. Its "
        f"partial venv is removed. {_ways(root)}"
    )
