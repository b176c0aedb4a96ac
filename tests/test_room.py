"""The disk room's reservations, on the real file system of a temp folder: the floor is set a
fixed margin under what is free when the test starts, so the figures are the test's own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.core.errors import DiskExhausted
from agent.install.disk.root import DiskFloor, GiB, disk_space
from agent.state.room import Claim, DiskRoom

MiB = 1024**2
ROOM = 64 * MiB  # what the floor leaves usable, give or take the machine's other writers


async def test_an_install_waiting_for_an_eviction_takes_no_room_from_one_streaming(
    tmp_path: Path,
) -> None:
    """An expectation counts against the other installs only once it fits: while an install
    too large for the room waits for an eviction pass (a transaction of the root's index), a
    download in flight goes on; the large one is then refused and holds nothing. (Reserved
    before it was checked, it cut the streaming download off midway: CI.)"""
    _, free = disk_space(tmp_path)
    asked, gate = asyncio.Event(), asyncio.Event()

    async def evict(needed: int) -> list[Path]:
        asked.set()
        await gate.wait()  # a pass that finds nothing unused to evict
        return []

    room = DiskRoom(tmp_path, DiskFloor(bytes_=free - ROOM, percent=None), evict)
    streaming, large = Claim(), Claim()
    room.claims |= {streaming, large}
    download = room.space(streaming, "first")
    await download.expect(8 * MiB)
    waiting = asyncio.create_task(room.space(large, "second").expect(GiB))
    await asyncio.wait_for(asked.wait(), 10)
    # fits: the gigabyte is not the room's while it waits (counted, this take would wait for
    # an eviction too, and be refused)
    await asyncio.wait_for(download.take(4 * MiB, MiB), 10)
    gate.set()
    with pytest.raises(DiskExhausted, match="second: installing needs"):
        await asyncio.wait_for(waiting, 10)
    assert large.outstanding == 0, "a refused expectation holds no room"
    await download.take(8 * MiB, 0)


async def test_an_expectation_that_fits_is_reserved_against_the_next_one(tmp_path: Path) -> None:
    """Two installs expecting together: the first that fits holds its bytes at once, so the
    second, which would fit alone, is refused naming them."""
    _, free = disk_space(tmp_path)

    async def evict(needed: int) -> list[Path]:
        return []

    room = DiskRoom(tmp_path, DiskFloor(bytes_=free - ROOM, percent=None), evict)
    first, second = Claim(), Claim()
    room.claims |= {first, second}
    await room.space(first, "first").expect(ROOM // 2 + 8 * MiB)
    assert first.outstanding == ROOM // 2 + 8 * MiB
    with pytest.raises(DiskExhausted, match="expected by other installs in flight"):
        await room.space(second, "second").expect(ROOM // 2)
