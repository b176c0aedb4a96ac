"""R4, a dead holder holds nothing: reaping the dead holders the index names, and setting
aside (into the reaping holder's trash, for deletion after the commit) what they left.

Runs inside a transaction of the index (``index``'s passes, obtains and recovery), on the
index's thread; besides the rows, its side effects are a few file-system calls made in that
transaction: renames into the trash, lock tests and takes (``holders``), and the kill of the
installer process groups a dead holder left running (``agent.install.venvs.build``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.install.disk.modes import make_dir
from agent.install.venvs.build import kill_orphaned_installers
from agent.plant import planted
from agent.state import schema, sockets
from agent.state.holders import (
    Reaping,
    begin_reaping,
    is_alive,
    is_holder_id,
    lock_files,
    remove_stale_making,
)

log = logging.getLogger(__name__)


@dataclass
class Reaped:
    """What reaping dead holders took back (``Swept``, ``Obtained``): to finish after commit."""

    holders: list[tuple[str, int]] = field(default_factory=list)  # (id, envs it held)
    aside: list[Path] = field(default_factory=list)  # their staging and trash, to delete
    orphans: int = 0  # of ``aside``: packages they placed in uris/ and never committed
    locks: list[Reaping] = field(default_factory=list)  # released after the commit

    @property
    def envs(self) -> int:
        return sum(envs for _, envs in self.holders)

    def finish(self) -> None:
        """After the commit: remove the dead holders' lock files and let them go."""
        locks, self.locks = self.locks, []
        _each(locks, Reaping.done)

    def abandon(self) -> None:
        """The transaction failed: let the locks go, keep the files (the next pass retries)."""
        locks, self.locks = self.locks, []
        _each(locks, Reaping.abandon)


def _each(locks: list[Reaping], step: Callable[[Reaping], None]) -> None:
    """``step`` on every lock even if one fails (each closes its descriptor whatever happens:
    a lock kept open would make its dead holder look alive for this process's life); the first
    failure is raised after."""
    failure: BaseException | None = None
    for lock in locks:
        try:
            step(lock)
        except BaseException as exc:  # raised below, once every lock is let go
            failure = failure or exc
    if failure is not None:
        raise failure


def drop_holder_rows(conn: sqlite3.Connection, holder: str) -> int:
    """Delete a holder's references, claims and row; return the envs it held."""
    conn.execute(schema.DELETE_REFS_OF, (holder,))
    conn.execute(schema.DELETE_CLAIMS_OF, (holder,))
    found = conn.execute(schema.LIVE_ENVS_OF, (holder,)).fetchone()
    conn.execute(schema.DELETE_HOLDER, (holder,))
    return int(found[0]) if found else 0


def reap_dead(conn: sqlite3.Connection, root: Path, me: str, trash: Path, reaped: Reaped) -> Reaped:
    """R4: every holder the index names that is dead, reaped; and every folder under tmp/ and
    trash/ of no live holder (a dead holder's, or an older agent's) set aside into ``trash``."""
    named = {
        holder
        for (holder,) in conn.execute(schema.NAMED_HOLDERS)
        if isinstance(holder, str)  # a NULL or a number (a hand-edited index) names nobody
    }
    for holder in sorted(named - {me}):
        if not is_alive(root, holder):
            reap(conn, root, holder, trash, reaped)
        elif planted("reap_live_holder"):  # the chaos oracle's proof: R4 broken on purpose
            drop_holder_rows(conn, holder)
    # a holder reaped above is locked by this pass (``begin_reaping``), so ``is_alive`` would
    # find it alive: its folders go by name
    reaping = {holder for holder, _ in reaped.holders}
    for sub in ("tmp", "trash"):
        for name in _names(root / sub):
            if name in reaping or (
                name != me and not (is_holder_id(name) and is_alive(root, name))
            ):
                set_aside(root / sub / name, trash, reaped)
    for holder in lock_files(root):  # an agent killed between its lock and its row
        if holder not in named and holder != me and not is_alive(root, holder):
            lock = begin_reaping(root, holder)
            if lock is not None:
                reaped.locks.append(lock)
    remove_stale_making(root)  # an agent killed between creating its lock file and its lock
    locked = set(lock_files(root))
    for holder in sockets.noted(root):  # a socket noted by a holder whose lock is gone (dead)
        if holder != me and holder not in locked and is_holder_id(holder):
            sockets.reap(root, holder)
    return reaped


def reap(conn: sqlite3.Connection, root: Path, holder: str, trash: Path, reaped: Reaped) -> None:
    """Reap one holder found dead: its installers killed, the packages it placed and never
    committed set aside, its rows dropped; unless it is alive after all, or another agent
    reaps it now."""
    lock = begin_reaping(root, holder)
    if lock is None:  # alive after all, or another agent reaps it now
        return
    reaped.locks.append(lock)
    # its folders are named by its id: a value read from the index names one only if it is an id
    killed = kill_orphaned_installers(root / "tmp" / holder) if is_holder_id(holder) else 0
    for (directory,) in conn.execute(  # renamed into place, not committed: nobody vouches
        schema.CLAIMED_DIRS_OF, (holder,)
    ).fetchall():
        if plain_name(directory):
            before = len(reaped.aside)
            set_aside(root / "uris" / directory, trash, reaped)
            reaped.orphans += len(reaped.aside) - before
    envs = drop_holder_rows(conn, holder)
    reaped.holders.append((holder, envs))
    log.warning(
        "reaped holder %s (an agent that died): its references and claims dropped, %d env(s) "
        "forgotten%s",
        holder,
        envs,
        f", {killed} installer process group(s) it left running killed" if killed else "",
        extra={"holder": holder, "envs": envs, "killed": killed},
    )


def set_aside(path: Path, trash: Path, reaped: Reaped) -> None:
    """Rename ``path`` into ``trash``, noted in ``reaped.aside``; a failure is logged (the next
    pass tries again)."""
    try:
        aside = into_trash(path, trash)
    except OSError as exc:
        log.warning(
            "cannot set %s aside for deletion: %s",
            path,
            exc.strerror or exc,
            extra={"path": str(path), "error": str(exc.strerror or exc)},
        )
        return
    if aside is not None:
        reaped.aside.append(aside)


def into_trash(path: Path, trash: Path) -> Path | None:
    """Rename ``path`` into ``trash`` (this holder's) under a fresh name: where it went, or None
    if it was gone already. ENOENT also means a missing trash (a close removes it, a peer may
    set it aside): then the trash is made and the rename tried again, so a missing trash never
    makes a present folder look gone."""
    aside = trash / uuid.uuid4().hex
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        if not os.path.lexists(path):
            return None
        make_dir(trash.parent)
        trash.mkdir(mode=0o700, exist_ok=True)
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            if os.path.lexists(path):
                raise
            return None
    return aside


def plain_name(name: object) -> bool:
    """A folder name read from the index names a folder of uris/ only if it is one plain name
    (text: SQLite stores whatever it is given, a blob or a number included)."""
    return (
        isinstance(name, str)
        and bool(name)
        and "/" not in name
        and name not in (".", "..")
        and "\0" not in name
    )


def _names(folder: Path) -> list[str]:
    try:
        return [name for name in os.listdir(folder) if not name.startswith(".")]
    except FileNotFoundError:
        return []
