"""Recovery at start, before the agent reports SERVING: make the index and the disk agree,
without disturbing the other agents serving the root.

In one transaction of the index (``index.reconcile``), with ``uris/`` scanned inside it:
1. Every dead holder is reaped (``index`` R4): its references and claims dropped, its staging
   and trash (and any folder under ``tmp/`` or ``trash/`` no live holder owns, such as an older
   agent's) set aside for deletion, the installers it left running killed. A live peer's are
   never touched.
2. A ready package's row whose directory is missing or malformed is dropped, and so is one
   whose directory is not the agent's own or may have been written by others since (group or
   other writable: an agent started under ``umask 000`` before modes were set explicitly),
   unless a live peer uses it: its files cannot be vouched for, so it is deleted and installed
   again when next needed. A row a live peer references is kept as it is, even one named
   otherwise than this agent names it (a peer of another version): it is not adopted.
3. A directory under ``uris/`` that no row vouches for (a crash between rename and commit) is
   deleted: the next create of its URI installs it again. One a live peer is installing is
   vouched for by its claim.
4. The dead holders' envs are forgotten (their number, written behind, is the summary's
   ``envs_forgotten``): their clients died with them (fate sharing).
5. The ready packages are adopted as not held, and a pass enforces the budget.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.core.units import human_bytes, plural
from agent.core.uris import UriKey, UriKind
from agent.install.disk.modes import is_loose
from agent.install.disk.root import du
from agent.state.index import Scan
from agent.state.state_db import StateDB, UriRow
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


async def recover(store: UriStore, db: StateDB) -> RecoverySummary:
    started = time.monotonic()
    root = store.root
    reconciled = await db.reconcile(lambda: _scan(root), lambda key: _dir_of(store, key))
    if reconciled.reaped.holders:
        reaped = len(reconciled.reaped.holders)
        log.info("reaped %d dead holder(s) of the root", reaped, extra={"holders": reaped})
    aside = [*reconciled.reaped.aside, *reconciled.orphans]
    freed = await asyncio.to_thread(_du_all, aside)
    for row in sorted(reconciled.kept, key=lambda row: row.last_used_ms):
        key = _key_of(row)
        if key is not None:
            store.adopt(key, row.size, row.last_used_ms)
    store.delete_in_background(aside)
    before = sum(e.size for e in store.entries())
    await store.enforce_budget()
    freed += before - sum(e.size for e in store.entries())
    summary = RecoverySummary(
        rows_kept=len(reconciled.kept),
        rows_dropped=reconciled.dropped,
        orphans_deleted=len(reconciled.orphans) + reconciled.reaped.orphans,
        bytes_freed=freed,
        envs_forgotten=reconciled.reaped.envs,
        seconds=time.monotonic() - started,
    )
    log.info("%s", summary.line(), extra=asdict(summary))
    return summary


def _scan(root: Path) -> Scan:
    """The folders under uris/ (probes, named with a leading dot, skipped), and which of them
    are loose. In the index's thread, inside its transaction."""
    found: dict[str, os.stat_result] = {}
    for entry in os.scandir(root / "uris"):
        if entry.name.startswith(".") or not (
            entry.is_dir(follow_symlinks=False) or entry.is_symlink()
        ):
            continue
        try:
            found[entry.name] = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # a live peer's rename (a cancelled install's folder to its
            continue  # trash, a leftover moved aside) between the listing and the stat
    loose = frozenset(name for name, info in found.items() if is_loose(info))  # a link too: the
    # agent never makes one there
    return Scan(frozenset(found), loose)


def _dir_of(store: UriStore, row_key: tuple[str, str]) -> str | None:
    try:
        key = UriKey(UriKind(row_key[0]), row_key[1])
    except ValueError:
        return None
    return store.path_for(key).name


def _key_of(row: UriRow) -> UriKey | None:
    try:
        return UriKey(UriKind(row.kind), row.uri)
    except ValueError:
        return None


def _du_all(paths: list[Path]) -> int:
    return sum(du(path) for path in paths)
