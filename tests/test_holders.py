"""Holders' lock files as a pass meets them on a hostile disk (agent/state/holders.py): entries
that are no lock file, lock files this user cannot open, a crash mid-take; on real files and
a real SQLite index, with holders really alive (their lock held here) or really dead."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.state import holders, index
from agent.state.holders import HolderLock, Reaping, begin_reaping, is_alive, lock_path
from agent.state.reaping import Reaped
from agent.state.state_db import StateDB
from tests.harness.index_holders import KEY, die, holder, install, make_untestable, rows

PASS_S = 10  # a pass is milliseconds: one that takes this long is stuck


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for sub in ("uris", "tmp", "trash", "holders"):
        (tmp_path / sub).mkdir()
    return tmp_path


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the warnings its own passes log (they are logged once per process)."""
    monkeypatch.setattr(holders, "_warned", set(), raising=False)


def dead_lock(root: Path) -> str:
    """A holder killed after taking its lock: the file is there, unlocked."""
    lock = HolderLock.take(root)
    os.close(lock.fd)
    return lock.holder_id


def lock_is_free(path: Path) -> bool:
    """Nobody (not even another descriptor of this process) holds a lock on the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


async def a_pass(db: StateDB, how: str) -> Reaped:
    """A sweep or a start's reconcile, bounded: either reaps the dead."""
    if how == "sweep":
        return (await asyncio.wait_for(db.sweep(budget_bytes=10**9), PASS_S)).reaped
    scan = index.Scan(frozenset(), frozenset())
    got = await asyncio.wait_for(db.reconcile(lambda: scan, lambda key: None), PASS_S)
    return got.reaped


@pytest.fixture
def untestable(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    return lambda path: make_untestable(monkeypatch, path)


# -- A: an entry in place of a lock file that is no regular file ------------------------------


@pytest.mark.parametrize("how", ["sweep", "reconcile"])
async def test_a_folder_named_as_a_lock_file_is_removed_and_the_pass_completes(
    root: Path, how: str
) -> None:
    """A folder holders/<id>.lock is a dead holder's: removed (rmdir), the pass returns its
    result, and the other dead holder it reaped is let go (its lock file gone, unlocked)."""
    folder = lock_path(root, "a" * 32)
    folder.mkdir()
    other = dead_lock(root)
    kept_open = os.open(lock_path(root, other), os.O_RDONLY)  # to see its lock after removal
    db = await holder(root)
    try:
        await a_pass(db, how)
        assert not folder.exists()
        assert not lock_path(root, other).exists()
        fcntl.flock(kept_open, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the reaper let it go
    finally:
        os.close(kept_open)
        await db.close()


async def test_a_lock_folder_that_cannot_be_removed_is_warned_of_once_and_left(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder with something in it: not removed (nothing in it is deleted), warned of once
    over two passes, and each pass completes."""
    folder = lock_path(root, "a" * 32)
    folder.mkdir()
    (folder / "keep").write_text("x")
    db = await holder(root)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.state.holders"):
            await a_pass(db, "sweep")
            await a_pass(db, "sweep")
        assert (folder / "keep").read_text() == "x"
        said = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert "remove it by hand" in said[0]
    finally:
        await db.close()


async def test_a_failing_step_of_finish_still_lets_every_reaped_lock_go(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish() after the commit: one lock whose removal fails unexpectedly does not keep the
    next one locked (its dead holder would look alive for this process's life)."""
    first, second = dead_lock(root), dead_lock(root)
    reaped = Reaped()
    for hid in (first, second):
        lock = begin_reaping(root, hid)
        assert lock is not None
        reaped.locks.append(lock)
    assert not lock_is_free(lock_path(root, second))

    def broken(path: Path, *, locked: bool) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(holders, "_remove_lock", broken)
    with pytest.raises(RuntimeError, match="boom"):
        reaped.finish()
    assert lock_is_free(lock_path(root, first))
    assert lock_is_free(lock_path(root, second))
    assert reaped.locks == []


def test_a_reaping_of_no_lock_removes_a_fifo_but_leaves_a_regular_file_that_appeared(
    root: Path,
) -> None:
    """Found missing or not a regular file (nothing locked): a FIFO there is unlinked; a
    regular file that appeared under the name since may be a holder's lock renamed into place,
    so it is left for the next pass to test."""
    fifo, appeared = lock_path(root, "a" * 32), lock_path(root, "b" * 32)
    os.mkfifo(fifo)
    found = [begin_reaping(root, hid) for hid in ("a" * 32, "b" * 32)]
    appeared.write_text("1")
    for lock in found:
        assert isinstance(lock, Reaping)
        assert not lock.locked
        lock.done()
    assert not os.path.lexists(fifo)
    assert appeared.read_text() == "1"


# -- B: a lock file this user cannot open ------------------------------------------------------


@pytest.mark.parametrize("how", ["sweep", "reconcile"])
async def test_a_holder_whose_lock_file_cannot_be_opened_is_kept_as_alive_and_warned_once(
    root: Path, how: str, untestable: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    """Another user's 0600 lock file: the pass completes, the holder is not reaped (its
    references and folders kept: never reap what cannot be tested), and one warning over two
    passes names the file and what to do."""
    other = await holder(root)
    await install(other, KEY)
    die(other)
    untestable(lock_path(root, other.holder_id))
    db = await holder(root)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.state.holders"):
            first = await a_pass(db, how)
            second = await a_pass(db, how)
        assert first.holders == second.holders == []
        assert rows(root, "SELECT holder FROM refs") == [(other.holder_id,)]
        assert other.staging.is_dir()
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1, caplog.text
        assert str(lock_path(root, other.holder_id)) in said[0]
        assert "remove the file as its owner" in said[0]
    finally:
        await db.close()


def test_liveness_of_a_lock_file_that_cannot_be_opened_is_unknown(
    root: Path, untestable: Callable[[Path], None]
) -> None:
    """liveness says None (unknown), is_alive True (a pass keeps it), begin_reaping None."""
    hid = dead_lock(root)
    untestable(lock_path(root, hid))
    assert holders.liveness(root, hid) is None
    assert is_alive(root, hid)
    assert begin_reaping(root, hid) is None


# -- F: holder_pid reads safely; a crash between create and rename ----------------------------


def test_holder_pid_follows_no_link_waits_on_no_fifo_and_reads_only_ids(root: Path) -> None:
    """The pid of a live lock file is read; a link (to a file with a pid), a FIFO and an id
    that is no id (a path from a hand-edited index) give None, at once."""
    lock = HolderLock.take(root)
    try:
        assert holders.holder_pid(root, lock.holder_id) == os.getpid()
    finally:
        lock.release()
    (root / "target").write_text("123")
    os.symlink(root / "target", lock_path(root, "b" * 32))
    os.mkfifo(lock_path(root, "c" * 32))
    assert holders.holder_pid(root, "b" * 32) is None
    assert holders.holder_pid(root, "c" * 32) is None  # returns: the open does not block
    assert holders.holder_pid(root, "../target") is None


def making_file(root: Path, *, age_s: float) -> tuple[Path, int]:
    """holders/.<id>.making as HolderLock.take creates it (a descriptor on it, unlocked),
    last modified ``age_s`` ago."""
    path = root / "holders" / f".{holders.new_holder_id()}.making"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path, fd


async def test_a_pass_removes_a_making_file_a_crashed_start_left_and_keeps_a_live_ones(
    root: Path,
) -> None:
    """A start killed between creating its lock file and renaming it into place leaves
    .<id>.making: a pass removes it once it is old and unlocked; one its holder holds locked
    (renaming it now), and one created just now (its holder about to lock it), stay."""
    stale, stale_fd = making_file(root, age_s=holders.MAKING_GRACE_S + 60)
    os.close(stale_fd)  # the crashed start
    locked, locked_fd = making_file(root, age_s=holders.MAKING_GRACE_S + 60)
    fcntl.flock(locked_fd, fcntl.LOCK_EX)  # a live start, stopped before its rename
    fresh, fresh_fd = making_file(root, age_s=0)  # a live start, before its flock
    db = await holder(root)
    try:
        await a_pass(db, "sweep")
        assert not stale.exists()
        assert locked.exists()
        assert fresh.exists()
        fcntl.flock(fresh_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the pass let it go
    finally:
        for fd in (locked_fd, fresh_fd):
            os.close(fd)
        await db.close()
