"""A venv build's disk, in pure units: the estimate of a lock (what is counted, what the wheel
cache saves, what is unknown), the guard that stops an installer before the floor (statvfs and
the installer faked), and the room's eviction rounds and words for a build (statvfs faked)."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path

import pytest

from agent.core.errors import DiskExhausted
from agent.install.disk.root import DiskFloor
from agent.install.venvs.disk_guard import DiskGuard, Spare, says_enospc
from agent.install.venvs.estimate import (
    EXPANSION,
    cached_pins,
    lock_estimate,
    unpacked_bytes,
)
from agent.state.room import Claim, DiskRoom
from tests.harness.polling import wait_until

MiB = 1024**2

LOCK = b"""
version = 1
[[package]]
name = "exp"
version = "0.1.0"
source = { virtual = "." }

[[package]]
name = "big"
version = "1.0"
source = { registry = "/w" }
wheels = [{ path = "/w/big-1.0-py3-none-any.whl" }]

[[package]]
name = "Torchish"
version = "2.0"
source = { registry = "https://pypi.org/simple" }
wheels = [
    { url = "https://x/torchish-2.0-cp311-cp311-macosx_11_0_arm64.whl", size = 999999999 },
    { url = "https://x/torchish-2.0-cp311-cp311-manylinux_2_17_x86_64.whl", size = 1000 },
]

[[package]]
name = "cached"
version = "3.0"
source = { registry = "https://pypi.org/simple" }
wheels = [{ url = "https://x/cached-3.0-py3-none-any.whl", size = 5000 }]

[[package]]
name = "fromsource"
version = "0.1"
source = { git = "https://x/y" }
"""


def test_a_lock_counts_local_wheels_unpacked_index_wheels_expanded_and_skips_cached() -> None:
    """The local wheel by its central directory, the index wheel this machine takes by its
    size times EXPANSION (not the macOS one), the cached one not at all, the git one unknown."""
    estimate = lock_estimate(
        LOCK,
        cached=frozenset({("cached", "3.0")}),
        unpacked=lambda path: 7 * MiB if path == "/w/big-1.0-py3-none-any.whl" else None,
        python="3.11.7",
    )
    assert (estimate.counted, estimate.cached, estimate.unknown) == (2, 1, 1)
    assert estimate.bytes_ == 7 * MiB + 1000 * EXPANSION
    assert estimate.describe() == (
        "2 wheels of its lock not in the root's wheel cache, 1 there already, "
        "1 package of unknown size not counted"
    )


def test_a_local_wheel_is_measured_from_its_central_directory(tmp_path: Path) -> None:
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m/a.bin", b"\0" * 300_000)
        zf.writestr("m/b.py", b"x = 1\n")
    wheel = tmp_path / "m-1.0-py3-none-any.whl"
    wheel.write_bytes(body.getvalue())
    assert unpacked_bytes(wheel) == 300_006
    assert unpacked_bytes(tmp_path / "missing.whl") is None


def test_the_cache_holds_a_wheel_only_where_its_entry_points_at_an_unpacked_one(
    tmp_path: Path,
) -> None:
    """uv's index: ``<name>/<version>-<tags>`` linked into archive-v0 counts; a lone ``.lock``
    (an unpack killed midway) or a dangling link does not."""
    archive = tmp_path / "archive-v0" / "abc"
    archive.mkdir(parents=True)
    index = tmp_path / "wheels-v8" / "index" / "h1"
    for name in ("big", "killed", "gone"):
        (index / name).mkdir(parents=True)
    (index / "big" / "1.0-py3-none-any").symlink_to(archive)
    (index / "big" / "1.0-py3-none-any.lock").touch()
    (index / "killed" / "2.0-py3-none-any.lock").touch()
    (index / "gone" / "3.0-py3-none-any").symlink_to(tmp_path / "archive-v0" / "nothing")
    assert cached_pins(tmp_path) == {("big", "1.0")}
    assert cached_pins(tmp_path / "no-cache") == frozenset()


class FakeRoom:
    """A build's room whose statvfs answers from a script; it records what it is told."""

    def __init__(self, frees: list[int], floor: int = 10 * MiB) -> None:
        self.frees, self.floor = frees, floor
        self.told: list[int] = []

    async def reserve(self, needed: int, what: str) -> None:
        pass

    def spare(self) -> Spare | None:
        free = self.frees.pop(0) if len(self.frees) > 1 else self.frees[0]
        return Spare(free, self.floor, 0)

    def wrote(self, written: int) -> None:
        self.told.append(written)

    def stopped(self, written: int, spare: Spare, *, ran_out: bool) -> DiskExhausted:
        return DiskExhausted(f"stopped after {written} with {spare.free} free, ran_out={ran_out}")


class FakeInstaller:
    """An installer that runs until killed or told to exit."""

    def __init__(self) -> None:
        self.exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.killed: list[bool] = []

    async def wait(self) -> int:
        return await asyncio.shield(self.exit)

    def kill(self, *, group: bool = False) -> None:
        self.killed.append(group)
        if not self.exit.done():
            self.exit.set_result(-9)


async def test_the_guard_kills_the_group_before_the_floor_and_says_what_was_written() -> None:
    room = FakeRoom([50 * MiB, 30 * MiB, 15 * MiB, 9 * MiB])
    installer = FakeInstaller()
    guard = DiskGuard(room, interval_s=0.001)
    with pytest.raises(DiskExhausted, match=f"stopped after {41 * MiB} with {9 * MiB} free"):
        await asyncio.wait_for(guard.watch(installer), 10)
    assert installer.killed == [True], "the installer's whole group is killed"
    assert room.told == [0, 20 * MiB, 35 * MiB, 41 * MiB], "the claim follows what it wrote"


async def test_the_guard_returns_the_exit_status_of_an_installer_that_fits() -> None:
    room = FakeRoom([50 * MiB, 40 * MiB])
    installer = FakeInstaller()
    guard = DiskGuard(room, interval_s=0.001)
    watching = asyncio.ensure_future(guard.watch(installer))
    await wait_until(lambda: len(room.told) >= 2, what="the guard's second measure")
    installer.exit.set_result(0)
    assert await asyncio.wait_for(watching, 10) == 0
    assert installer.killed == []
    assert guard.written == 10 * MiB
    error = guard.ran_out()  # the same build meeting ENOSPC later: the same error, with figures
    assert "ran_out=True" in error.message


def test_enospc_is_recognised_in_uv_pip_and_python_words() -> None:
    assert says_enospc("failed to write to file `x`: No space left on device (os error 28)")
    assert says_enospc("OSError: [Errno 28] No space left on device: 'x'")
    assert not says_enospc("error: Failed to download `bigdep==2.0`")


class FakeDisk:
    """(total, free) of a disk, where evicting frees nothing until the wheel cache is cleared:
    a venv's files are hardlinks into the cache."""

    def __init__(self, free: int) -> None:
        self.free, self.evicts = free, 0

    def measure(self, path: Path) -> tuple[int, int]:
        return 1000 * MiB, self.free

    async def evict(self, needed: int) -> list[Path]:
        self.evicts += 1
        if self.evicts == 1:
            return [Path("/nonexistent/trashed-venv")]  # its bytes are still the cache's
        if self.evicts == 2:
            self.free += 200 * MiB  # nothing left to evict: the cache is cleared
        return []


async def test_evicting_a_venv_then_clearing_the_cache_makes_room_in_rounds() -> None:
    disk = FakeDisk(free=100 * MiB)
    room = DiskRoom(Path("/root"), DiskFloor(bytes_=50 * MiB, percent=None), disk.evict,
                    measure=disk.measure)  # fmt: skip
    claim = Claim()
    await room.build(claim, "uv_project:x").reserve(150 * MiB, "building its venv")
    assert disk.evicts == 2
    assert claim.outstanding == 150 * MiB


async def test_a_build_that_cannot_fit_is_refused_in_human_units_naming_the_setting() -> None:
    disk = FakeDisk(free=100 * MiB)
    room = DiskRoom(Path("/srv/root"), DiskFloor(bytes_=50 * MiB, percent=None), disk.evict,
                    measure=disk.measure)  # fmt: skip
    claim = Claim()
    with pytest.raises(DiskExhausted) as caught:
        await room.build(claim, "uv_project:x").reserve(900 * MiB, "building its venv (2 wheels)")
    assert caught.value.message.startswith(
        "uv_project:x: building its venv (2 wheels) needs about 900.0 MiB; the agent keeps "
        "50.0 MiB free on its disk (the min-free-disk setting), but 300.0 MiB are free after "
        "evicting 1 unused package(s). Nothing was written. To make room: free space on the "
        "disk of the agent's root (/srv/root)"
    )
    assert "min-free-disk setting" in caught.value.message
    assert claim.outstanding == 0, "a refused build holds no room"
