"""The agent's root on disk: where a package lives, how big things are, how much room is left.
Blocking helpers: the store calls them in threads (statvfs excepted: one quick call)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import zipfile
from pathlib import Path

from agent.archive import ArchiveLimits, remove_tree
from agent.crash import crash_point
from agent.runtime_env import UriKey


def disk_space(path: Path) -> tuple[int, int]:
    """(total, free for us) bytes of the file system holding ``path``: one statvfs call."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed). Blocking: call it in a thread."""
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def declared_size(archive: Path) -> int:
    """Bytes a zip says it unpacks to (its central directory); 0 if it is no zip (the extraction
    then says so). Blocking: call it in a thread."""
    try:
        with zipfile.ZipFile(archive) as zf:
            return sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, UnicodeDecodeError):
        return 0  # what zipfile raises on a damaged or unsupported central directory


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
