"""Recovery at start, before the agent reports SERVING: make the index and the disk agree.

1. ``tmp/`` and ``trash/`` hold nothing anyone can use: renamed aside, deleted in a thread.
   Every file system call runs in a thread; the loop only compares names.
2. A row whose directory is missing (or malformed) is dropped, and so is one whose directory is
   not the agent's own or may have been written by others since (group or other writable: an
   agent started under ``umask 000`` before modes were set explicitly): its files cannot be
   vouched for, so it is deleted and installed again when next needed.
3. A directory under ``uris/`` that no row vouches for (a crash between rename and commit) is
   deleted: the next create of its URI installs it again.
4. Every env is forgotten (their number, written behind, is the summary's ``envs_forgotten``):
   the previous clients died with the previous agent (fate sharing), so every count starts at 0.
5. The kept packages are adopted as unused, least recently used first, and the budget enforced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.core.units import human_bytes, plural
from agent.core.uris import UriKey, UriKind
from agent.install.archive import is_loose, make_dir
from agent.install.disk import du, move_to_trash
from agent.install.venv import kill_orphaned_installers
from agent.state.state_db import Loaded, StateDB, UriRow
from agent.state.store import UriStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoverySummary:
    rows_kept: int = 0
    rows_dropped: int = 0
    orphans_deleted: int = 0
    bytes_freed: int = 0  # orphans, staging and trash left by the previous run, evictions
    envs_forgotten: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"recovery: {plural(self.rows_kept, 'package')} kept, "
            f"{plural(self.rows_dropped, 'row')} dropped, "
            f"{plural(self.orphans_deleted, 'orphan directory', 'orphan directories')} deleted, "
            f"{human_bytes(self.bytes_freed)} freed, "
            f"{plural(self.envs_forgotten, 'env')} forgotten, in {self.seconds:.3f}s"
        )


async def recover(store: UriStore, db: StateDB | None) -> RecoverySummary:
    started = time.monotonic()
    root = store.root
    loaded = await db.load() if db is not None else Loaded([], 0)
    orphans_killed = await asyncio.to_thread(kill_orphaned_installers, root / "tmp")
    if orphans_killed:
        log.warning("killed %d installer process group(s) a crash left running", orphans_killed)
    scan = await asyncio.to_thread(_scan, root)
    kept: list[tuple[UriKey, UriRow]] = []
    dropped: list[tuple[str, str]] = []
    for row in loaded.uris:
        key = _key_of(row)
        if (
            key is None
            or row.dir != store.path_for(key).name
            or row.dir not in scan.dirs
            or row.dir in scan.loose
        ):
            dropped.append((row.kind, row.uri))
        else:
            kept.append((key, row))
    if scan.loose:
        log.warning(
            "%d package directories are another user's or writable by others; they are deleted "
            "and will be installed again",
            len(scan.loose),
        )
    vouched = {row.dir for _, row in kept}
    orphans = [root / "uris" / name for name in scan.dirs if name not in vouched]
    freed = scan.leftover_bytes + await asyncio.to_thread(_du_all, orphans)
    aside = await asyncio.to_thread(_set_aside, root, orphans)
    if db is not None:
        await db.reset_after_recovery(dropped)
    for key, row in sorted(kept, key=lambda kr: kr[1].last_used_ms):
        store.adopt(key, row.size, row.last_used_ms)
    unused_before = store.stats().unused_bytes
    store.enforce_budget()
    freed += unused_before - store.stats().unused_bytes
    if aside:
        store.delete_in_background(aside)
    summary = RecoverySummary(
        rows_kept=len(kept),
        rows_dropped=len(dropped),
        orphans_deleted=len(orphans),
        bytes_freed=freed,
        envs_forgotten=loaded.live_envs,
        seconds=time.monotonic() - started,
    )
    log.info("%s", summary.line(), extra=asdict(summary))
    return summary


@dataclass(frozen=True)
class _Scan:
    dirs: frozenset[str]  # names under uris/
    loose: frozenset[str]  # those of dirs that others may have written to (``is_loose``)
    leftover_bytes: int  # in tmp/, trash/ and earlier set-asides


def _scan(root: Path) -> _Scan:
    found = [entry for entry in os.scandir(root / "uris") if entry.is_dir()]
    loose = frozenset(e.name for e in found if is_loose(e.stat(follow_symlinks=False)))  # a link
    # too: the agent never makes one there
    leftovers = [root / "tmp", root / "trash", *root.glob(".old-*")]
    return _Scan(frozenset(e.name for e in found), loose, _du_all(leftovers))


def _key_of(row: UriRow) -> UriKey | None:
    try:
        return UriKey(UriKind(row.kind), row.uri)
    except ValueError:
        return None


def _set_aside(root: Path, orphans: list[Path]) -> list[Path]:
    """Rename tmp/ and trash/ aside (one rename each) and make them anew, then move the orphans
    into trash/; return what to delete: all that, with whatever an earlier start had set aside
    and not finished deleting. In a thread: each is a system call."""
    for sub in ("tmp", "trash"):
        directory = root / sub
        if any(directory.iterdir()):
            os.rename(directory, root / f".old-{sub}-{uuid.uuid4().hex}")
            make_dir(directory)
    return [*sorted(root.glob(".old-*")), *(move_to_trash(root, path) for path in orphans)]


def _du_all(paths: list[Path]) -> int:
    return sum(du(path) for path in paths)
