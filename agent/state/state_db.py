"""The durable cache index: ``<root>/state.db``, SQLite in WAL mode, on one dedicated thread.

What must survive ``kill -9`` is committed before the reply that depends on it: a package's row
(``record_install``) before the create that installed it returns, and an env's row
(``record_env``) before its first create returns. Reference counts and last-use times are noted
in memory (``note_*``, no I/O) and written behind, in one transaction at most every
``flush_interval_s`` or every ``flush_every`` changes. Every statement runs on the one thread,
in submission order, and a commit carries the batch noted before it: a row deleted behind can
never overwrite a row inserted after it.

WAL with ``synchronous=NORMAL``: a commit survives the death of the process (what fate sharing
produces); after a power loss the last commits may be lost, and recovery then drops what it
cannot vouch for, so the index is never ahead of the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agent.core.errors import StateDBError
from agent.crash import crash_point

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
FILE_NAME = "state.db"

_SCHEMA_V1 = """
CREATE TABLE uris (
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    dir TEXT NOT NULL,            -- the directory's name under uris/
    size INTEGER NOT NULL,        -- bytes unpacked
    digest TEXT,                  -- sha256 of the archive, when the URI named one
    last_used_ms INTEGER NOT NULL,
    refcount INTEGER NOT NULL DEFAULT 0,   -- written behind, zeroed on recovery
    installed_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, uri)
);
CREATE TABLE envs (
    env_id TEXT PRIMARY KEY,
    canonical TEXT NOT NULL,
    keys TEXT NOT NULL,           -- JSON [[kind, uri], ...]
    refcount INTEGER NOT NULL DEFAULT 0,   -- written behind
    created_ms INTEGER NOT NULL
);
"""

# version -> the script that takes a database from version-1 to version
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1}


_WAY_OUT = "start the agent with --reset-state to move it aside and rebuild from an empty cache"


@dataclass(frozen=True)
class UriRow:
    kind: str
    uri: str
    dir: str
    size: int
    digest: str | None
    last_used_ms: int


@dataclass(frozen=True)
class EnvRow:
    env_id: str
    canonical: str
    keys: tuple[tuple[str, str], ...]
    created_ms: int


class StateDB:
    def __init__(
        self, path: Path, *, flush_interval_s: float = 0.1, flush_every: int = 1000
    ) -> None:
        self.path = path
        self._flush_interval_s = flush_interval_s
        self._flush_every = flush_every
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-db")
        self._conn: sqlite3.Connection | None = None
        # write-behind: the latest value per row, applied in the next transaction
        self._uri_notes: dict[tuple[str, str], tuple[int, int]] = {}  # -> (refcount, last_used)
        self._uri_drops: set[tuple[str, str]] = set()
        self._env_notes: dict[str, int] = {}  # env_id -> refcount (0: delete the row)
        self._dirty = asyncio.Event()  # something is noted
        self._full = asyncio.Event()  # enough is noted to write at once
        self._flusher: asyncio.Task[None] | None = None

    # -- running statements on the thread -------------------------------------------------
    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            assert self._conn is not None
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def open(self) -> None:
        """Open (or create) the database and bring its schema up to date."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._open_sync)
        self._flusher = asyncio.create_task(self._flush_loop(), name="state-db flush")

    def _open_sync(self) -> None:
        """Check the file before changing anything in it (not even its journal mode), then
        migrate. Any SQLite error, at any step, is a StateDBError naming the way out."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._check(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for target in range(version + 1, SCHEMA_VERSION + 1):
                with _transaction(conn):
                    _script(conn, _MIGRATIONS[target])
                    conn.execute(f"PRAGMA user_version={target}")
                log.info("state.db migrated to schema version %d", target)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StateDBError(f"{self.path} is unreadable ({exc}); {_WAY_OUT}") from exc
            raise
        self._conn = conn

    def _check(self, conn: sqlite3.Connection) -> None:
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateDBError(
                f"{self.path} has schema version {version}, newer than this agent's "
                f"{SCHEMA_VERSION}; run a newer agent, or {_WAY_OUT}"
            )
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if version == 0 and tables:
            raise StateDBError(
                f"{self.path} is an SQLite database this agent did not write (schema version 0 "
                f"with {tables} objects in it); {_WAY_OUT}"
            )

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        if self._conn is not None:
            await self.flush()
            await self._run(lambda conn: conn.close())
            self._conn = None
        self._thread.shutdown(wait=True)

    # -- reads (start-up) -----------------------------------------------------------------
    async def load(self) -> tuple[list[UriRow], list[EnvRow]]:
        def read(conn: sqlite3.Connection) -> tuple[list[UriRow], list[EnvRow]]:
            uris = [
                UriRow(*row)
                for row in conn.execute(
                    "SELECT kind, uri, dir, size, digest, last_used_ms FROM uris"
                )
            ]
            envs = [
                EnvRow(env_id, canonical, tuple(tuple(k) for k in json.loads(keys)), created)
                for env_id, canonical, keys, created in conn.execute(
                    "SELECT env_id, canonical, keys, created_ms FROM envs"
                )
            ]
            return uris, envs

        return await self._run(read)

    # -- durable writes (awaited before a reply) ------------------------------------------
    async def record_install(self, row: UriRow) -> None:
        """Commit that a package is installed, with every change noted before it."""
        batch = self._take_batch()
        now = int(time.time() * 1000)

        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _apply(conn, batch)
                conn.execute(
                    "INSERT OR REPLACE INTO uris (kind, uri, dir, size, digest, last_used_ms,"
                    " refcount, installed_ms) VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
                    (row.kind, row.uri, row.dir, row.size, row.digest, row.last_used_ms, now),
                )

        await self._run(write)

    async def record_env(self, row: EnvRow, refcount: int) -> None:
        """Commit an env and its (kind, URI) pairs, with every change noted before it."""
        batch = self._take_batch()
        self._env_notes.pop(row.env_id, None)  # this write carries the latest count

        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _apply(conn, batch)
                conn.execute(
                    "INSERT OR REPLACE INTO envs (env_id, canonical, keys, refcount, created_ms)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (row.env_id, row.canonical, json.dumps(row.keys), refcount, row.created_ms),
                )

        await self._run(write)

    async def reset_after_recovery(self, dropped: Iterable[tuple[str, str]]) -> None:
        """Recovery: drop the rows of missing directories; zero every count; forget envs (their
        clients died with the previous agent)."""
        gone = list(dropped)

        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.executemany("DELETE FROM uris WHERE kind = ? AND uri = ?", gone)
                conn.execute("UPDATE uris SET refcount = 0 WHERE refcount != 0")
                conn.execute("DELETE FROM envs")

        await self._run(write)

    # -- write-behind notes (no I/O) ------------------------------------------------------
    def note_uri(self, kind: str, uri: str, refcount: int, last_used_ms: int) -> None:
        self._uri_notes[(kind, uri)] = (refcount, last_used_ms)
        self._uri_drops.discard((kind, uri))
        self._mark_dirty()

    def note_uri_dropped(self, kind: str, uri: str) -> None:
        self._uri_notes.pop((kind, uri), None)
        self._uri_drops.add((kind, uri))
        self._mark_dirty()

    def note_env(self, env_id: str, refcount: int) -> None:
        self._env_notes[env_id] = refcount
        self._mark_dirty()

    def pending(self) -> int:
        return len(self._uri_notes) + len(self._uri_drops) + len(self._env_notes)

    def _mark_dirty(self) -> None:
        self._dirty.set()
        if self.pending() >= self._flush_every:
            self._full.set()

    def _take_batch(self) -> _Batch:
        batch = _Batch(self._uri_notes, self._uri_drops, self._env_notes)
        self._uri_notes, self._uri_drops, self._env_notes = {}, set(), {}
        return batch

    async def flush(self) -> None:
        """Write every noted change now, in one transaction."""
        if not self.pending() or self._conn is None:
            return
        batch = self._take_batch()

        def write(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                _apply(conn, batch, crash_midway=True)

        await self._run(write)

    async def _flush_loop(self) -> None:
        """Write behind: the first note opens a window of ``flush_interval_s``; the batch is
        written when it closes, or as soon as ``flush_every`` changes are noted."""
        while True:
            await self._dirty.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._flush_interval_s)
            self._dirty.clear()
            self._full.clear()
            try:
                await self.flush()
            except sqlite3.Error:
                log.exception("writing counts behind failed; they will be retried")


@dataclass
class _Batch:
    uri_notes: dict[tuple[str, str], tuple[int, int]]
    uri_drops: set[tuple[str, str]]
    env_notes: dict[str, int]


def _apply(conn: sqlite3.Connection, batch: _Batch, *, crash_midway: bool = False) -> None:
    conn.executemany(
        "UPDATE uris SET refcount = ?, last_used_ms = ? WHERE kind = ? AND uri = ?",
        [(count, used, kind, uri) for (kind, uri), (count, used) in batch.uri_notes.items()],
    )
    if crash_midway:
        crash_point("mid_count_batch")
    conn.executemany("DELETE FROM uris WHERE kind = ? AND uri = ?", list(batch.uri_drops))
    conn.executemany(
        "UPDATE envs SET refcount = ? WHERE env_id = ?",
        [(count, env_id) for env_id, count in batch.env_notes.items() if count > 0],
    )
    conn.executemany(
        "DELETE FROM envs WHERE env_id = ?",
        [(env_id,) for env_id, count in batch.env_notes.items() if count <= 0],
    )


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error (autocommit connection)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _script(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)
