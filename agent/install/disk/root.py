"""The agent's root on disk: where a package lives, how big things are, how much room is left.
Blocking helpers: the store calls them in threads (statvfs excepted: one quick call)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.core.units import exact_bytes
from agent.core.uris import UriKey
from agent.crash import crash_point
from agent.install.unpack.plan import ArchiveLimits


def disk_space(path: Path) -> tuple[int, int]:
    """(total, free for us) bytes of the file system holding ``path``: one statvfs call."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed), each inode once: a file
    hardlinked twice in the tree counts once, one shared with the wheel cache or another venv
    counts whole (``agent.install.venvs.wheel_cache`` says the rule). Blocking: call it in a
    thread."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


MEASURE_MAX_ENTRIES = 2_000_000  # names a re-measure reads before it stops (a lower bound)
MEASURE_MAX_S = 60.0  # and seconds


@dataclass(frozen=True)
class Measured:
    """A folder re-measured (``measure_tree``)."""

    size: int  # bytes, as ``du`` counts them
    ident: tuple[int, int]  # the folder's (st_dev, st_ino): which folder was measured
    complete: bool  # False: the walk stopped at a bound, ``size`` is a lower bound


def measure_tree(
    path: Path,
    *,
    max_entries: int = MEASURE_MAX_ENTRIES,
    max_s: float = MEASURE_MAX_S,
    clock: Callable[[], float] = time.monotonic,
) -> Measured | None:
    """``du`` of a folder others may have written to (a worker's ``.venv``, caches, outputs),
    as hostile input: no link followed, no other file system entered (a mount inside is not
    the package's), each inode once, at most ``max_entries`` names read and ``max_s`` seconds
    spent (then ``complete`` is False). None if ``path`` is not a folder (gone, or a link).
    Blocking: call it in a thread."""
    try:
        top = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return None
    ident = (top.st_dev, top.st_ino)
    total, read, deadline = 0, 0, clock() + max_s
    seen: set[tuple[int, int]] = set()
    folders = [os.fspath(path)]
    while folders:
        try:
            names = os.scandir(folders.pop())
        except OSError:  # gone, or not ours to read: what can be read is counted
            continue
        with names:
            for entry in names:
                read += 1
                if read > max_entries or (read % 4096 == 0 and clock() > deadline):
                    return Measured(total, ident, complete=False)
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if st.st_dev == top.st_dev:
                        folders.append(entry.path)
                    continue
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return Measured(total, ident, complete=True)


def unpack_reservation(declared: int, archive_bytes: int, limits: ArchiveLimits) -> int:
    """Disk to reserve for unpacking a zip that declares ``declared`` bytes: none when the
    extraction will refuse it before writing a byte (over max_uncompressed_bytes or
    max_ratio), so a bomb's declaration never evicts the cache. Pure."""
    if declared > limits.max_uncompressed_bytes:
        return 0
    if declared / max(archive_bytes, 1) > limits.max_ratio and declared > limits.ratio_floor_bytes:
        return 0
    return declared


def package_dir(root: Path, key: UriKey) -> Path:
    """The layout: ``<root>/uris/<kind>-<32 hex of sha256(uri)>``."""
    digest = hashlib.sha256(key.uri.encode()).hexdigest()[:32]
    return root / "uris" / f"{key.kind.value}-{digest}"


def remove_all(paths: list[Path], trash: bool = True) -> None:
    for path in paths:
        if trash:
            crash_point("during_trash_deletion")
        remove_tree(path)


def remove_tree(path: Path) -> None:
    """Delete a directory tree, or a file, if it exists. Blocking: call it in a thread."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def move_to_trash(trash: Path, path: Path) -> Path:
    """Move a package out of ``uris/`` into a trash folder (the agent's own, under ``trash/``)
    in one rename (one metadata call, fine on the loop); its deletion comes later, in a thread
    (``remove_all``)."""
    trashed = trash / uuid.uuid4().hex
    os.rename(path, trashed)
    return trashed


GiB = 1024**3


@dataclass(frozen=True)
class DiskFloor:
    """Free space an install must leave on the root's file system: the smaller of the two
    given (the default: 1 GiB or 5%, whichever is less, so a huge disk keeps no huge reserve)."""

    bytes_: int | None = GiB
    percent: float | None = 5.0

    def floor(self, total_bytes: int) -> int:
        candidates = []
        if self.bytes_ is not None:
            candidates.append(self.bytes_)
        if self.percent is not None:
            candidates.append(int(total_bytes * self.percent / 100))
        return min(candidates) if candidates else 0

    def __str__(self) -> str:
        if self.bytes_ is not None and self.percent is not None:
            return f"auto (min of {exact_bytes(self.bytes_)} and {self.percent:g}%)"
        return f"{self.percent:g}%" if self.percent is not None else exact_bytes(self.bytes_ or 0)
