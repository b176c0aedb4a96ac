"""The shared index's transactions: what agents serving one root agree on, in SQL.

The rules R1 to R4 below are kept by the transactions here and by the pass (``sweeping``: R2's
evictions, R4's reaping in a pass); the SQL text is ``schema``'s.

Each function runs inside one transaction its caller opened (``BEGIN IMMEDIATE``: one writer
at a time across every agent of the root, each waiting its turn under SQLite's busy timeout), on
the index's thread. They are synchronous, and their only side effects besides the rows are the
few file-system calls named below (a rename, a ``stat``, a lock test), made inside the
transaction so that the index and the disk change together.

The rules (the schema and every statement's text in ``schema``; the docstring of ``holders``
says what a holder is; R4's reaping is ``reaping``'s):

R1. A package's references are the ``refs`` rows naming it whose holder is alive. A holder
    inserts its row, committed, before it uses the package (``obtain``), and deletes it behind,
    once its own count is 0: a late delete only delays an eviction.
R2. A package is evicted only in ``sweeping.sweep``, in the transaction that checks it has no
    reference, and its directory is renamed into the evicting holder's trash in that same
    transaction. So a holder taking a reference concurrently either comes first (the package
    stays) or finds no row and installs it again: a package in use is never deleted.
R3. One install per package across the root: a holder installs only under its claim (the row
    in state 'installing' naming it); others wait for the row to become 'ready' (use it) or to
    vanish (claim it). A claim whose holder is dead is reaped, and the next holder that wants
    the package installs it.
R4. A dead holder holds nothing: any pass that meets one (its id in ``holders``, ``refs`` or a
    claim, its lock free) deletes its rows and sets its staging and trash aside for deletion.

A holder alone on the root may *defer* the drop of a reference (``write_behind``): its row stays in
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from agent.core.errors import echo_label
from agent.state import schema
from agent.state.holders import is_alive, is_holder_id
from agent.state.reaping import (
    Reaped,
    drop_holder_rows,
    plain_name,
    reap,
    reap_dead,
    set_aside,
)

log = logging.getLogger(__name__)

RowKey = tuple[str, str]  # (kind, uri)


@dataclass(frozen=True)
class KindBudget:
    """A cap on the bytes of some kinds of packages, used or not, kept besides the root's
    budget by evicting their unused ones (Ray's per-plugin cache sizes,
    ``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``, as Ray's URI cache counts them: what is in use
    counts, and is never evicted)."""

    name: str  # what sets it, for messages
    kinds: frozenset[str]
    budget_bytes: int


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
class Obtained:
    found: Found
    row: Row | None = None  # READY: the package
    installer: str = ""  # WAIT: the holder installing it
    reaped: Reaped = field(default_factory=Reaped)


# -- holders --------------------------------------------------------------------------------
def register(conn: sqlite3.Connection, me: str, pid: int, now_ms: int) -> None:
    conn.execute(schema.REGISTER, (me, pid, now_ms))


def unregister(conn: sqlite3.Connection, me: str) -> None:
    """A clean stop: this holder's references, claims and row go."""
    drop_holder_rows(conn, me)


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
        conn.execute(schema.TAKE_REF, (me, *key))
        conn.execute(schema.UNDEFER, key)  # a deferred drop of it cancelled
    found = conn.execute(schema.URI_ROW, key).fetchone()
    if found is not None:
        directory, size, last_used_ms, state, installer = found
        if state == "ready":
            if plain_name(directory) and (root / "uris" / directory).is_dir():
                return Obtained(
                    Found.READY, Row(kind, uri, directory, size, last_used_ms), reaped=reaped
                )
            log.warning(
                "%s: the index names %s, which is gone; installed again",
                echo_label(f"{kind}:{uri}"),
                echo_label(repr(directory)),
                extra={"uri": f"{kind}:{uri}", "dir": str(directory)},
            )
        elif installer != me and isinstance(installer, str) and is_alive(root, installer):
            return Obtained(Found.WAIT, installer=installer, reaped=reaped)
        elif installer != me and isinstance(installer, str):
            reap(conn, root, installer, trash, reaped)
            for sub in ("tmp", "trash") if is_holder_id(installer) else ():
                set_aside(root / sub / installer, trash, reaped)
    conn.execute(schema.CLAIM, (kind, uri, dir_name, now_ms, me))
    return Obtained(Found.CLAIMED, reaped=reaped)


def commit_install(conn: sqlite3.Connection, me: str, row: Row) -> bool:
    """The claimed package is in place: ready, for every holder. False, and nothing written,
    if the claim is no longer this holder's (a peer took this holder for dead and reaped it,
    or the index was edited): whatever is at ``row.dir`` is then not this holder's to vouch
    for (R3: only the claim's holder commits)."""
    return (
        conn.execute(
            schema.COMMIT_INSTALL, (row.dir, row.size, row.last_used_ms, row.kind, row.uri, me)
        ).rowcount
        == 1
    )


def resize(
    conn: sqlite3.Connection,
    root: Path,
    key: RowKey,
    directory: str,
    ident: tuple[int, int],
    size: int,
) -> bool:
    """A ready package's folder was re-measured (``disk.measure_tree``): its row's size made
    ``size``, if the row still names ``directory`` and that folder still is the one measured
    (``ident``: its device and inode, read in this transaction, where no holder evicts or
    places it). A package evicted meanwhile (its row gone, or made again by a new install,
    another folder) is left as it is: a re-measure never writes a row back. True if changed."""
    if not plain_name(directory):
        return False
    try:
        st = os.lstat(root / "uris" / directory)
    except OSError:
        return False
    if (st.st_dev, st.st_ino) != ident:
        return False
    return conn.execute(schema.RESIZE, (size, *key, directory, size)).rowcount == 1


def drop_claims(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> None:
    """Installs that failed or were cancelled: their claims go (others may install them)."""
    conn.executemany(schema.DROP_CLAIM, [(kind, uri, me) for kind, uri in keys])


def drop_refs(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> None:
    keys = list(keys)
    conn.executemany(schema.DROP_REF, [(me, kind, uri) for kind, uri in keys])
    conn.executemany(schema.UNDEFER, keys)


def create_released(conn: sqlite3.Connection) -> None:
    """This connection's private table of the references whose drop it deferred."""
    conn.execute(schema.CREATE_RELEASED)


def defer_drops(conn: sqlite3.Connection, me: str, keys: Iterable[RowKey]) -> list[RowKey]:
    """Release these references of ``me`` without deleting their rows (``me`` alone on the
    root): the keys deferred, those whose reference row is there (a drop of a reference that is
    not in the index has nothing to defer)."""
    deferred = []
    for kind, uri in keys:
        held = conn.execute(schema.HAS_REF, (me, kind, uri)).fetchone()
        if held is not None:
            conn.execute(schema.DEFER_DROP, (kind, uri))
            deferred.append((kind, uri))
    return deferred


def undefer(conn: sqlite3.Connection, keys: Iterable[RowKey]) -> None:
    """Deferred drops cancelled: the references are this holder's again (their rows stayed)."""
    conn.executemany(schema.UNDEFER, list(keys))


def alone(conn: sqlite3.Connection, me: str) -> bool:
    """No other holder is registered on the root (alive or not yet reaped)."""
    return conn.execute(schema.OTHER_HOLDER, (me,)).fetchone() is None


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
    referenced = {(kind, uri) for kind, uri in conn.execute(schema.REFERENCED_KEYS)}
    rows = conn.execute(schema.ALL_URIS).fetchall()
    kept, vouched, drop = [], set(), []
    for kind, uri, directory, size, used, state, _ in rows:
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
    conn.executemany(schema.DELETE_URI, drop)
    if untrusted := len(scan.loose - vouched):  # rows dropped above, or none: orphans below
        log.warning(
            "%d package directories are another user's or writable by others; they are deleted "
            "and will be installed again",
            untrusted,
            extra={"dirs": untrusted},
        )
    orphans = []
    for name in sorted(scan.dirs - vouched):
        moved = Reaped()
        set_aside(root / "uris" / name, trash, moved)
        orphans.extend(moved.aside)
    return Reconciled(kept, len(drop), orphans, reaped)
