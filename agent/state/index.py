"""The shared index's transactions: what agents serving one root agree on, in SQL.

Each function runs inside one transaction its caller opened (``BEGIN IMMEDIATE``: one writer
at a time across every agent of the root, each waiting its turn under SQLite's busy timeout), on
the index's thread. They are synchronous, and their only side effects besides the rows are the
few file-system calls named below (a rename, a ``stat``, a lock test), made inside the
transaction so that the index and the disk change together.

The rules (schema in ``state_db``; the docstring of ``holders`` says what a holder is):

R1. A package's references are the ``refs`` rows naming it whose holder is alive. A holder
    inserts its row, committed, before it uses the package (``obtain``), and deletes it behind,
    once its own count is 0: a late delete only delays an eviction.
R2. A package is evicted only in ``sweep``, in the transaction that checks it has no reference,
    and its directory is renamed into the evicting holder's trash in that same transaction. So
    a holder taking a reference concurrently either comes first (the package stays) or finds
    no row and installs it again: a package in use is never deleted.
R3. One install per package across the root: a holder installs only under its claim (the row
    in state 'installing' naming it); others wait for the row to become 'ready' (use it) or to
    vanish (claim it). A claim whose holder is dead is reaped, and the next holder that wants
    the package installs it.
R4. A dead holder holds nothing: any pass that meets one (its id in ``holders``, ``refs`` or a
    claim, its lock free) deletes its rows and sets its staging and trash aside for deletion.

A holder alone on the root may *defer* the drop of a reference (``state_db``): its row stays in
``refs`` and its key goes into the connection's private table ``temp.released``. That holder's
own passes count such a package as unused and may evict it (the row and the reference go in
that transaction, R2 as before); every other holder sees a reference, so at worst an eviction
waits (a late drop, as R1 allows). ``obtain`` takes a deferred reference back by deleting its
``temp.released`` row.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from agent.core.errors import echo_label
from agent.install.modes import make_dir
from agent.install.venv import kill_orphaned_installers
from agent.state.holders import (
    Reaping,
    begin_reaping,
    is_alive,
    is_holder_id,
    lock_files,
    remove_stale_making,
)

log = logging.getLogger(__name__)

RowKey = tuple[str, str]  # (kind, uri)


@dataclass(frozen=True)
class Row:
    """A ready package as the index holds it."""

    kind: str
    uri: str
    dir: str
    size: int
    last_used_ms: int


class Found(Enum):
    READY = "ready"  # installed: use ``Obtained.row``
    CLAIMED = "claimed"  # this holder installs it now
    WAIT = "wait"  # another live holder installs it: ask again later


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


@dataclass
class Obtained:
    found: Found
    row: Row | None = None  # READY: the package
    installer: str = ""  # WAIT: the holder installing it
    reaped: Reaped = field(default_factory=Reaped)


@dataclass(frozen=True)
class Evicted:
    row: Row
    trashed: Path | None  # None: its directory was gone already


@dataclass
class Swept:
    evicted: list[Evicted]
    ready_bytes: int  # of the root's ready packages, after the pass
    unused_bytes: int  # of those no live holder references, after the pass
    gen: int  # the last change of the ready packages the caller now knows of
    full: bool  # ``changes`` lists every ready package (the caller's view was too old)
    changes: list[tuple[RowKey, Row | None]]  # since ``since``: ready now (its row) or gone
    reaped: Reaped


KEEP_CHANGES = 10_000  # of the change log; an agent further behind reads every ready row


# -- holders --------------------------------------------------------------------------------
def register(conn: sqlite3.Connection, me: str, pid: int, now_ms: int) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO holders (id, pid, started_ms, live_envs) VALUES (?, ?, ?, 0)",
        (me, pid, now_ms),
    )


def unregister(conn: sqlite3.Connection, me: str) -> None:
    """A clean stop: this holder's references, claims and row go."""
    _drop_holder_rows(conn, me)


def _drop_holder_rows(conn: sqlite3.Connection, holder: str) -> int:
    """Delete a holder's references, claims and row; return the envs it held."""
    conn.execute("DELETE FROM refs WHERE holder = ?", (holder,))
    conn.execute("DELETE FROM uris WHERE state = 'installing' AND holder = ?", (holder,))
    found = conn.execute("SELECT live_envs FROM holders WHERE id = ?", (holder,)).fetchone()
    conn.execute("DELETE FROM holders WHERE id = ?", (holder,))
    return int(found[0]) if found else 0


def reap_dead(conn: sqlite3.Connection, root: Path, me: str, trash: Path, reaped: Reaped) -> Reaped:
    """R4: every holder the index names that is dead, reaped; and every folder under tmp/ and
    trash/ of no live holder (a dead holder's, or an older agent's) set aside into ``trash``."""
    named = {
        holder
        for (holder,) in conn.execute(
            "SELECT id FROM holders UNION SELECT holder FROM refs"
            " UNION SELECT holder FROM uris WHERE state = 'installing'"
        )
        if isinstance(holder, str)  # a NULL or a number (a hand-edited index) names nobody
    }
    for holder in sorted(named - {me}):
        if not is_alive(root, holder):
            _reap(conn, root, holder, trash, reaped)
    # a holder reaped above is locked by this pass (``begin_reaping``), so ``is_alive`` would
    # find it alive: its folders go by name
    reaping = {holder for holder, _ in reaped.holders}
    for sub in ("tmp", "trash"):
        for name in _names(root / sub):
            if name in reaping or (
                name != me and not (is_holder_id(name) and is_alive(root, name))
            ):
                _set_aside(root / sub / name, trash, reaped)
    for holder in lock_files(root):  # an agent killed between its lock and its row
        if holder not in named and holder != me and not is_alive(root, holder):
            lock = begin_reaping(root, holder)
            if lock is not None:
                reaped.locks.append(lock)
    remove_stale_making(root)  # an agent killed between creating its lock file and its lock
    return reaped


def _reap(conn: sqlite3.Connection, root: Path, holder: str, trash: Path, reaped: Reaped) -> None:
    lock = begin_reaping(root, holder)
    if lock is None:  # alive after all, or another agent reaps it now
        return
    reaped.locks.append(lock)
    # its folders are named by its id: a value read from the index names one only if it is an id
    killed = kill_orphaned_installers(root / "tmp" / holder) if is_holder_id(holder) else 0
    for (directory,) in conn.execute(  # renamed into place, not committed: nobody vouches
        "SELECT dir FROM uris WHERE state = 'installing' AND holder = ?", (holder,)
    ).fetchall():
        if _plain_name(directory):
            before = len(reaped.aside)
            _set_aside(root / "uris" / directory, trash, reaped)
            reaped.orphans += len(reaped.aside) - before
    envs = _drop_holder_rows(conn, holder)
    reaped.holders.append((holder, envs))
    log.warning(
        "reaped holder %s (an agent that died): its references and claims dropped, %d env(s) "
        "forgotten%s", holder, envs,
        f", {killed} installer process group(s) it left running killed" if killed else "",
        extra={"holder": holder},
    )  # fmt: skip


def _set_aside(path: Path, trash: Path, reaped: Reaped) -> None:
    try:
        aside = _into_trash(path, trash)
    except OSError as exc:
        log.warning("cannot set %s aside for deletion: %s", path, exc.strerror or exc)
        return
    if aside is not None:
        reaped.aside.append(aside)


def _into_trash(path: Path, trash: Path) -> Path | None:
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


def _plain_name(name: object) -> bool:
    """A folder name read from the index names a folder of uris/ only if it is one plain name
    (text: SQLite stores whatever it is given, a blob or a number included)."""
    return (
        isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")
        and "\0" not in name
    )  # fmt: skip


def _names(folder: Path) -> list[str]:
    try:
        return [name for name in os.listdir(folder) if not name.startswith(".")]
    except FileNotFoundError:
        return []


# -- one package --------------------------------------------------------------------------
def obtain(
    conn: sqlite3.Connection,
    root: Path,
    me: str,
    key: RowKey,
    dir_name: str,
    now_ms: int,
    trash: Path,
    reaped: Reaped,
    *,
    take_ref: bool,
) -> Obtained:
    """R1, R3: take this holder's reference (``take_ref``), then say whether the package is
    ready, claimed by this holder now, or being installed by a live peer."""
    kind, uri = key
    if take_ref:
        conn.execute("INSERT OR IGNORE INTO refs (holder, kind, uri) VALUES (?, ?, ?)", (me, *key))
        conn.execute("DELETE FROM temp.released WHERE kind = ? AND uri = ?", key)  # deferred drop
    found = conn.execute(
        "SELECT dir, size, last_used_ms, state, holder FROM uris WHERE kind = ? AND uri = ?", key
    ).fetchone()
    if found is not None:
        directory, size, last_used_ms, state, installer = found
        if state == "ready":
            if _plain_name(directory) and (root / "uris" / directory).is_dir():
                return Obtained(
                    Found.READY, Row(kind, uri, directory, size, last_used_ms), reaped=reaped
                )
            log.warning(
                "%s: the index names %s, which is gone; installed again",
                echo_label(f"{kind}:{uri}"), echo_label(repr(directory)),
            )  # fmt: skip
        elif installer != me and isinstance(installer, str) and is_alive(root, installer):
            return Obtained(Found.WAIT, installer=installer, reaped=reaped)
        elif installer != me and isinstance(installer, str):
            _reap(conn, root, installer, trash, reaped)
            for sub in ("tmp", "trash") if is_holder_id(installer) else ():
                _set_aside(root / sub / installer, trash, reaped)
    conn.execute(
        "INSERT OR REPLACE INTO uris (kind, uri, dir, size, last_used_ms, state, holder)"
        " VALUES (?, ?, ?, 0, ?, 'installing', ?)",
        (kind, uri, dir_name, now_ms, me),
    )
    return Obtained(Found.CLAIMED, reaped=reaped)


def commit_install(conn: sqlite3.Connection, me: str, row: Row) -> bool:
    """The claimed package is in place: ready, for every holder. False, and nothing written,
    if the claim is no longer this holder's (a peer took this holder for dead and reaped it,
    or the index was edited): whatever is at ``row.dir`` is then not this holder's to vouch
    for (R3: only the claim's holder commits)."""
    return (
        conn.execute(
            "UPDATE uris SET dir = ?, size = ?, last_used_ms = ?, state = 'ready', holder = NULL"
            " WHERE kind = ? AND uri = ? AND state = 'installing' AND holder = ?",
            (row.dir, row.size, row.last_used_ms, row.kind, row.uri, me),
        ).rowcount
        == 1
    )


def drop_claims(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> None:
    """Installs that failed or were cancelled: their claims go (others may install them)."""
    conn.executemany(
        "DELETE FROM uris WHERE kind = ? AND uri = ? AND state = 'installing' AND holder = ?",
        [(kind, uri, me) for kind, uri in keys],
    )


def drop_refs(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> None:
    keys = list(keys)
    conn.executemany(
        "DELETE FROM refs WHERE holder = ? AND kind = ? AND uri = ?",
        [(me, kind, uri) for kind, uri in keys],
    )
    conn.executemany("DELETE FROM temp.released WHERE kind = ? AND uri = ?", keys)


def create_released(conn: sqlite3.Connection) -> None:
    """This connection's private table of the references whose drop it deferred."""
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS released (kind TEXT NOT NULL, uri TEXT NOT NULL,"
        " PRIMARY KEY (kind, uri)) WITHOUT ROWID"
    )


def defer_drops(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> list[RowKey]:
    """Release these references of ``me`` without deleting their rows (``me`` alone on the
    root): the keys deferred, those whose reference row is there (a drop of a reference that is
    not in the index has nothing to defer)."""
    deferred = []
    for kind, uri in keys:
        held = conn.execute(
            "SELECT 1 FROM refs WHERE holder = ? AND kind = ? AND uri = ?", (me, kind, uri)
        ).fetchone()
        if held is not None:
            conn.execute("INSERT OR IGNORE INTO temp.released VALUES (?, ?)", (kind, uri))
            deferred.append((kind, uri))
    return deferred


def undefer(conn: sqlite3.Connection, keys: Iterable[RowKey]) -> None:
    """Deferred drops cancelled: the references are this holder's again (their rows stayed)."""
    conn.executemany("DELETE FROM temp.released WHERE kind = ? AND uri = ?", list(keys))


def alone(conn: sqlite3.Connection, me: str) -> bool:
    """No other holder is registered on the root (alive or not yet reaped)."""
    return conn.execute("SELECT 1 FROM holders WHERE id != ? LIMIT 1", (me,)).fetchone() is None


# -- the pass -------------------------------------------------------------------------------
_PAGE = 64  # unused rows read per query of an eviction
# no reference but the caller's own deferred ones (one "?": the caller's holder id)
_UNREFERENCED = (
    "NOT EXISTS (SELECT 1 FROM refs r WHERE r.kind = u.kind AND r.uri = u.uri AND NOT ("
    "r.holder = ? AND EXISTS (SELECT 1 FROM temp.released x WHERE x.kind = r.kind"
    " AND x.uri = r.uri)))"
)


def sweep(
    conn: sqlite3.Connection,
    root: Path,
    me: str,
    trash: Path,
    *,
    budget_bytes: int,
    needed_bytes: int = 0,
    since: int = -1,
    reaped: Reaped | None = None,
    may_evict: Callable[[RowKey], bool] | None = None,
) -> Swept:
    """R2, R4: reap the dead, then evict unused packages, least recently used first, until the
    root's unused bytes fit ``budget_bytes`` and, if ``needed_bytes``, until that much is freed
    (or, if evicting every unused package would not free it, only what the budget asks). Then
    the changes of the ready packages after ``since`` (every ready package when ``since`` is
    -1, nothing seen yet, or when the log no longer reaches back that far). Costs: one
    aggregate scan in SQLite, the unused rows read in LRU order only as far as evictions go,
    the log read from ``since``. ``may_evict``: asked before each eviction; a package it
    refuses (its holder took it again meanwhile) is kept, and counted used."""
    reaped = reap_dead(conn, root, me, trash, reaped if reaped is not None else Reaped())
    ready_bytes, unused = conn.execute(
        f"SELECT coalesce(sum(size), 0), coalesce(sum(CASE WHEN {_UNREFERENCED} THEN size END), 0)"
        " FROM uris u WHERE u.state = 'ready'",
        (me,),
    ).fetchone()
    target = plan_target(unused, budget_bytes, needed_bytes)
    evicted = []
    if target > 0:
        freed, kept = 0, 0  # kept: rows that could not be moved, skipped by the next page
        while freed < target:
            page = conn.execute(
                f"SELECT kind, uri, dir, size, last_used_ms FROM uris u WHERE u.state = 'ready'"
                f" AND {_UNREFERENCED} ORDER BY u.last_used_ms, u.kind, u.uri LIMIT ? OFFSET ?",
                (me, _PAGE, kept),
            ).fetchall()  # a page at a time: the deletes below change the table
            if not page:
                break
            for kind, uri, directory, size, used in page:
                if freed >= target:
                    break
                if may_evict is not None and not may_evict((kind, uri)):
                    kept += 1
                    unused -= size  # in use after all: what is over the budget is less
                    target = plan_target(unused, budget_bytes, needed_bytes)
                    continue
                row = Row(kind, uri, directory, size, used)
                trashed = _evict(conn, root, me, trash, row)
                if trashed is False:
                    kept += 1
                    continue
                evicted.append(Evicted(row, trashed))  # type: ignore[arg-type]
                freed += size
        ready_bytes, unused = ready_bytes - freed, unused - freed
    full, changes, gen = _changes_since(conn, since)
    return Swept(evicted, ready_bytes, unused, gen, full, changes, reaped)


def plan_target(unused: int, budget: int, needed: int) -> int:
    """Bytes of unused packages to evict: what is over the budget, or ``needed`` if more and if
    all the unused bytes would free it (the over-budget evictions count toward it). Pure."""
    over = max(unused - budget, 0)
    if needed > over and unused >= needed:
        return needed
    return over


def _evict(
    conn: sqlite3.Connection, root: Path, me: str, trash: Path, row: Row
) -> Path | bool | None:
    """Move the package into the trash and delete its row (and ``me``'s deferred reference to
    it, if it was one), in this transaction. The trashed
    path; None if its folder was gone already (the row goes all the same), or if the row names
    no folder of uris/ (a hostile or corrupt ``dir``: the row goes, the disk is not touched);
    False if it could not be moved (kept, row and folder: the next pass tries again)."""
    if not _plain_name(row.dir):  # an absolute path, "", "..": never a folder of this root's
        log.warning(
            "evicting %s: the index names %s as its folder, which is no folder of uris/; its "
            "row is dropped and nothing on disk is touched",
            echo_label(f"{row.kind}:{row.uri}"), echo_label(repr(row.dir)),
        )  # fmt: skip
        _drop_row(conn, me, row)
        return None
    try:
        trashed = _into_trash(root / "uris" / row.dir, trash)
    except OSError as exc:
        log.warning(
            "evicting %s: cannot move %s: %s", echo_label(f"{row.kind}:{row.uri}"),
            echo_label(row.dir), exc.strerror or exc,
        )  # fmt: skip
        return False
    _drop_row(conn, me, row)
    return trashed


def _drop_row(conn: sqlite3.Connection, me: str, row: Row) -> None:
    """An evicted package's row, and ``me``'s deferred reference to it (the only kind of
    reference an evicted package may have: ``_UNREFERENCED``)."""
    key = (row.kind, row.uri)
    conn.execute("DELETE FROM uris WHERE kind = ? AND uri = ?", key)
    conn.execute("DELETE FROM refs WHERE holder = ? AND kind = ? AND uri = ?", (me, *key))
    conn.execute("DELETE FROM temp.released WHERE kind = ? AND uri = ?", key)


def _changes_since(
    conn: sqlite3.Connection, since: int
) -> tuple[bool, list[tuple[RowKey, Row | None]], int]:
    """(full, changes, gen): the ready packages that appeared or went after ``since``, the
    latest state of each, in order; or, if the log was trimmed past ``since`` (or ``since`` is
    -1), every ready package (``full``). The log is trimmed to ``KEEP_CHANGES`` here."""
    (gen,) = conn.execute("SELECT coalesce(max(gen), 0) FROM changes").fetchone()
    conn.execute("DELETE FROM changes WHERE gen <= ?", (gen - KEEP_CHANGES,))
    (oldest,) = conn.execute("SELECT coalesce(min(gen), 0) FROM changes").fetchone()
    if since < 0 or since < oldest - 1:
        rows = conn.execute(
            "SELECT kind, uri, dir, size, last_used_ms FROM uris WHERE state = 'ready'"
        ).fetchall()
        return True, [((r[0], r[1]), Row(*r)) for r in rows], gen
    latest: dict[RowKey, Row | None] = {}
    for kind, uri, directory, size, used in conn.execute(
        "SELECT c.kind, c.uri, u.dir, u.size, u.last_used_ms FROM changes c LEFT JOIN uris u"
        " ON u.kind = c.kind AND u.uri = c.uri AND u.state = 'ready'"
        " WHERE c.gen > ? ORDER BY c.gen",
        (since,),
    ):
        latest[(kind, uri)] = None if directory is None else Row(kind, uri, directory, size, used)
    return False, list(latest.items()), gen


# -- recovery at start ----------------------------------------------------------------------
@dataclass(frozen=True)
class Scan:
    """The folders under uris/, read inside the reconciling transaction."""

    dirs: frozenset[str]
    loose: frozenset[str]  # those others may have written to (``archive.is_loose``)


@dataclass
class Reconciled:
    kept: list[Row]  # ready packages whose folders are there
    dropped: int  # rows whose folder is missing, misnamed or loose
    orphans: list[Path]  # folders no row vouches for, set aside into the trash
    reaped: Reaped


def reconcile(
    conn: sqlite3.Connection,
    root: Path,
    me: str,
    trash: Path,
    scan: Scan,
    expected_dir: Callable[[RowKey], str | None],
    reaped: Reaped | None = None,
) -> Reconciled:
    """A start: reap the dead (R4); drop the rows of ready packages whose folder is missing,
    and those whose folder is not named as its key says or is loose unless a live holder
    references it (it is not pulled from under a peer: kept as it is, and adopted only if
    named as this agent names it); keep, untouched, those of a kind this agent cannot read
    (``expected_dir`` None: a newer peer's, which it may be using); set aside every
    folder under uris/ that no row vouches for (a crash between rename and commit). A folder
    claimed by a live peer's install is vouched for: it may be renamed into place any moment.
    ``scan`` must be read inside this transaction: no peer commits or evicts meanwhile."""
    reaped = reap_dead(conn, root, me, trash, reaped if reaped is not None else Reaped())
    referenced = {(kind, uri) for kind, uri in conn.execute("SELECT kind, uri FROM refs")}
    rows = conn.execute("SELECT kind, uri, dir, size, last_used_ms, state FROM uris").fetchall()
    kept, vouched, drop = [], set(), []
    for kind, uri, directory, size, used, state in rows:
        key = (kind, uri)
        if state == "installing":
            vouched.add(directory)
            continue
        expected = expected_dir(key)
        if expected is None:  # a kind this agent cannot read (a newer peer's): kept, untouched
            vouched.add(directory)
            continue
        if directory not in scan.dirs:  # gone (or no plain name: the scan lists only those)
            drop.append(key)
            continue
        if key in referenced:  # a live holder uses it (the dead were reaped above): its row and
            vouched.add(directory)  # folder stay as they are, misnamed or loose
            if expected == directory:
                kept.append(Row(kind, uri, directory, size, used))
            # else a peer that names folders its own way (another version): not adopted here,
            # as this agent would look for it under ``expected``
            continue
        if expected != directory or directory in scan.loose:
            drop.append(key)
            continue
        kept.append(Row(kind, uri, directory, size, used))
        vouched.add(directory)
    conn.executemany("DELETE FROM uris WHERE kind = ? AND uri = ?", drop)
    if untrusted := len(scan.loose - vouched):  # rows dropped above, or none: orphans below
        log.warning(
            "%d package directories are another user's or writable by others; they are deleted "
            "and will be installed again", untrusted,
        )  # fmt: skip
    orphans = []
    for name in sorted(scan.dirs - vouched):
        moved = Reaped()
        _set_aside(root / "uris" / name, trash, moved)
        orphans.extend(moved.aside)
    return Reconciled(kept, len(drop), orphans, reaped)
