"""The index's file: opening it (checked, WAL, migrated, this holder registered) and its
transactions. Synchronous: run on the index's thread (``state_db``).

A file is checked before anything in it changes (not even its journal mode): damaged, of a
newer agent, or an SQLite database no agent wrote is a ``StateDBError`` naming the way out
(``--reset-state``). Migrations climb one version per transaction, each re-reading the version
inside it (another agent of the root may have taken the step first). WAL with
``synchronous=NORMAL``: a commit survives the death of the process; after a power loss the
last commits may be lost, and recovery then drops what it cannot vouch for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from agent.core.errors import StateDBError
from agent.state import index, schema

log = logging.getLogger(__name__)

WAY_OUT = "start the agent with --reset-state to move it aside and rebuild from an empty cache"


def open_index(
    path: Path, *, holder_id: str, busy_timeout_s: float, in_memory: bool
) -> sqlite3.Connection:
    """Open (or create) the file, bring its schema up to date and register ``holder_id``: the
    connection, autocommit (transactions are ``transaction``'s), usable from any one thread.
    Any SQLite error, at any step, is a StateDBError naming the way out."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
    )
    try:
        found = _check(conn, path)
        set_wal(conn, busy_timeout_s)
        conn.execute(schema.SYNCHRONOUS_NORMAL)
        conn.execute(schema.RECURSIVE_TRIGGERS)
        _migrate(conn, path, found=found, in_memory=in_memory)
        conn.execute(schema.TEMP_IN_MEMORY)
        index.create_released(conn)
        with transaction(conn):
            index.register(conn, holder_id, os.getpid(), now_ms())
    except BaseException as exc:
        conn.close()
        if is_busy(exc):  # not damaged: --reset-state would throw away every holder's index
            raise StateDBError(
                f"{path} stayed locked by another agent of the root for {busy_timeout_s:g}s "
                "(the busy timeout) while this agent opened it; start it again"
            ) from exc
        if isinstance(exc, sqlite3.Error):
            raise StateDBError(f"{path} is unreadable ({exc}); {WAY_OUT}") from exc
        raise
    return conn


def _check(conn: sqlite3.Connection, path: Path) -> int:
    """The file's schema version, once the file is found usable (0: a new file)."""
    # One read transaction, one snapshot: read apart, the version and the tables could
    # straddle another agent's migration step (version 0 read, then its tables), and a
    # fresh shared root looked like a database this agent did not write.
    conn.execute(schema.BEGIN)
    try:
        check = conn.execute(schema.QUICK_CHECK).fetchone()[0]
        version = conn.execute(schema.VERSION).fetchone()[0]
        tables = conn.execute(schema.OBJECTS).fetchone()[0]
    finally:  # a read: nothing to keep, and an error above is not hidden by a COMMIT's
        if conn.in_transaction:
            conn.execute(schema.ROLLBACK)
    if check != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {check}")
    if version > schema.SCHEMA_VERSION:
        raise StateDBError(
            f"{path} has schema version {version}, newer than this agent's "
            f"{schema.SCHEMA_VERSION}; run a newer agent, or {WAY_OUT}"
        )
    if version == 0 and tables:
        raise StateDBError(
            f"{path} is an SQLite database this agent did not write (schema version 0 "
            f"with {tables} objects in it); {WAY_OUT}"
        )
    return int(version)


def _migrate(conn: sqlite3.Connection, path: Path, *, found: int, in_memory: bool) -> None:
    """Climb to ``SCHEMA_VERSION``, one step per transaction. Logged (but for an index in
    memory, ``--no-state-db``, which makes no state.db): a file ``found`` new (version 0) as
    created at the schema's version, once; an older file's every step as its migration."""
    climbed = False
    while True:
        with transaction(conn):
            version = conn.execute(schema.VERSION).fetchone()[0]
            if version >= schema.SCHEMA_VERSION:
                break
            for statement in schema.statements(schema.MIGRATIONS[version + 1]):
                conn.execute(statement)
            conn.execute(schema.set_version(version + 1))
        climbed = True
        if found and not in_memory:
            log.info(
                "state.db migrated from schema version %d to %d",
                version,
                version + 1,
                extra={"path": str(path), "version": version + 1},
            )
    if climbed and not found and not in_memory:
        log.info(
            "state.db created at schema version %d",
            schema.SCHEMA_VERSION,
            extra={"path": str(path), "version": schema.SCHEMA_VERSION},
        )


def is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY, of any flavour: another connection holds the lock ("database is locked")."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF == 5


def set_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """The file in WAL mode (kept in the file: a later opener finds it so and changes nothing).
    Switching takes the file's exclusive lock, and SQLite answers BUSY at once, not after the
    busy timeout, while another opener of a fresh shared root reads it: retried until then."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            if conn.execute(schema.JOURNAL_MODE).fetchone()[0].lower() != "wal":
                conn.execute(schema.WAL)  # a file system without WAL keeps
            return  # its mode, as SQLite decides
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)  # on the database's own thread, never the event loop


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error, a failed COMMIT included (autocommit
    connection): the next write never finds a transaction left open."""
    conn.execute(schema.BEGIN_IMMEDIATE)
    try:
        yield
        conn.execute(schema.COMMIT)
    except BaseException:
        if conn.in_transaction:
            conn.execute(schema.ROLLBACK)
        raise


def now_ms() -> int:
    return int(time.time() * 1000)
