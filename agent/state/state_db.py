"""The durable cache index: ``<root>/state.db``, SQLite in WAL mode, on one dedicated thread.

It holds what recovery needs to reuse a package after a restart, and nothing else: one row per
installed package (its key, its directory's name, its size, its last use), and one number, the
envs live at the last write (recovery's "N envs forgotten"). Counts are not kept: the previous
clients died with the previous agent (fate sharing), so every count starts at 0.

What must survive ``kill -9`` is committed before the reply that depends on it: a package's row
(``record_install``) before the create that installed it returns. Everything else is noted in
memory (``note_*``, no I/O) and written behind, in one transaction at most every
``flush_interval_s`` or every ``flush_every`` changes: last-use times, the rows of evicted
packages (dropped), the live-env number. A miss awaits only its packages' commits (they carry
the notes, its env among them), and a hit or a delete awaits none. A ``kill -9`` loses the last
window's notes: a little older last uses, an evicted row (recovery drops it: its directory is
gone), a live-env number behind by that window's envs (a summary figure, nothing more).
Every statement runs on the one thread, in submission order, and a
commit carries the batch noted before it: a row deleted behind can never overwrite a row
inserted after it. A batch whose write fails is carried by the thread into its next write (so
the order still holds), and the write-behind task retries it; a bug in that task is logged
with its traceback when it happens and raised again by ``close()``, after the last write.

WAL with ``synchronous=NORMAL``: a commit survives the death of the process (what fate sharing
produces); after a power loss the last commits may be lost, and recovery then drops what it
cannot vouch for, so the index is never ahead of the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.core.errors import StateDBError
from agent.crash import crash_point

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 2
FILE_NAME = "state.db"

# Version 1, as the first agents wrote it. A new file climbs the same steps as an old one.
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

# Version 2 keeps what recovery reads. Dropped: uris.digest (the URI itself carries it, and it
# is the archive's, so it cannot vouch for an unpacked tree), uris.refcount and the envs' rows
# (recovery zeroed and forgot them: their clients died with the agent), uris.installed_ms (never
# read). The envs' rows become one number, for recovery's summary.
_SCHEMA_V2 = """
ALTER TABLE uris RENAME TO uris_v1;
CREATE TABLE uris (
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    dir TEXT NOT NULL,            -- the directory's name under uris/
    size INTEGER NOT NULL,        -- bytes unpacked, for the budget without a walk of the tree
    last_used_ms INTEGER NOT NULL,   -- written behind, the eviction order after a restart
    PRIMARY KEY (kind, uri)
);
INSERT INTO uris (kind, uri, dir, size, last_used_ms)
    SELECT kind, uri, dir, size, last_used_ms FROM uris_v1;
DROP TABLE uris_v1;
CREATE TABLE live (
    id INTEGER PRIMARY KEY CHECK (id = 0),   -- one row
    envs INTEGER NOT NULL         -- envs live at the last write (written behind)
);
INSERT INTO live (id, envs) SELECT 0, count(*) FROM envs;
DROP TABLE envs;
"""

# version -> the script that takes a database from version-1 to version
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2}


_WAY_OUT = "start the agent with --reset-state to move it aside and rebuild from an empty cache"


@dataclass(frozen=True)
class UriRow:
    kind: str
    uri: str
    dir: str
    size: int
    last_used_ms: int


@dataclass(frozen=True)
class Loaded:
    """What a start reads back: the packages' rows, and the envs live at the last write (their
    clients died with the previous agent)."""

    uris: list[UriRow]
    live_envs: int


RowKey = tuple[str, str]  # (kind, uri)


@dataclass
class _Batch:
    """Changes noted behind, the latest per row, written in one transaction.

    Invariant: ``used`` and ``dropped`` share no key (a later note of a key voids an earlier
    one of the other kind)."""

    used: dict[RowKey, int] = field(default_factory=dict)  # -> last_used_ms
    dropped: set[RowKey] = field(default_factory=set)
    live_envs: int | None = None  # None: not noted

    def use(self, key: RowKey, last_used_ms: int) -> None:
        self.used[key] = last_used_ms
        self.dropped.discard(key)  # installed again since: the drop is void

    def drop(self, key: RowKey) -> None:
        self.used.pop(key, None)
        self.dropped.add(key)

    def __len__(self) -> int:
        return len(self.used) + len(self.dropped) + (self.live_envs is not None)

    def then(self, newer: _Batch) -> _Batch:
        """This batch followed by a newer one, as one batch: the same as noting this batch's
        changes and then the newer one's into one (the newer note of a row wins)."""
        used = {key: ms for key, ms in self.used.items() if key not in newer.dropped}
        used.update(newer.used)
        dropped = (self.dropped - newer.used.keys()) | newer.dropped
        live = self.live_envs if newer.live_envs is None else newer.live_envs
        return _Batch(used, dropped, live)

    def check_invariants(self) -> None:
        assert not (self.used.keys() & self.dropped), self.used.keys() & self.dropped


class StateDB:
    def __init__(
        self, path: Path, *, flush_interval_s: float = 0.1, flush_every: int = 1000
    ) -> None:
        self.path = path
        self._flush_interval_s = flush_interval_s
        self._flush_every = flush_every
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-db")
        self._conn: sqlite3.Connection | None = None
        self._notes = _Batch()  # write-behind, on the loop: applied in the next transaction
        # A batch whose transaction failed, kept for the next write. Only the thread touches it
        # (the loop reads whether it is set, after awaiting that write).
        self._carried: _Batch | None = None
        self._dirty = asyncio.Event()  # something is noted
        self._full = asyncio.Event()  # enough is noted to write at once
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False  # close() began: the write-behind task ends after its write

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
        """Write what is noted (and what a failed write left), close the file, end the thread;
        then raise what killed the write-behind task, if anything did: a bug is not hidden."""
        died: BaseException | None = None
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            # Woken and told to end, not cancelled: a cancel could drop a write it has taken
            # its batch for and queued behind another statement on the thread.
            self._closing = True
            self._dirty.set()
            self._full.set()
            await asyncio.wait([flusher])  # never raises the task's own exception
            if not flusher.cancelled():
                died = flusher.exception()
        try:
            if self._conn is not None:
                try:
                    await self.flush()
                finally:
                    await self._run(lambda conn: conn.close())
                    self._conn = None
        finally:
            # joins the thread: off the loop
            await asyncio.to_thread(self._thread.shutdown, wait=True)
        if died is not None:
            raise RuntimeError(
                f"{self.path}: the task writing behind died earlier ({died!r}); what it left "
                "was written at close"
            ) from died

    # -- reads (start-up) -----------------------------------------------------------------
    async def load(self) -> Loaded:
        def read(conn: sqlite3.Connection) -> Loaded:
            uris = [
                UriRow(*row)
                for row in conn.execute("SELECT kind, uri, dir, size, last_used_ms FROM uris")
            ]
            (live,) = conn.execute("SELECT envs FROM live WHERE id = 0").fetchone()
            return Loaded(uris, live)

        return await self._run(read)

    # -- writes, on the thread ------------------------------------------------------------
    def _write(
        self,
        conn: sqlite3.Connection,
        batch: _Batch,
        then: Callable[[sqlite3.Connection], None] | None = None,
        *,
        crash_midway: bool = False,
    ) -> None:
        """One transaction: what a failed write left, then ``batch``, then ``then``. On
        failure nothing is applied and the batches are kept for the next write, which runs
        after this one (one thread): the order of the notes holds."""
        if self._carried is not None:
            batch = self._carried.then(batch)
            self._carried = None
        batch.check_invariants()
        try:
            with _transaction(conn):
                _apply(conn, batch, crash_midway=crash_midway)
                if then is not None:
                    then(conn)
        except BaseException:
            self._carried = batch
            raise

    # -- durable writes (awaited before a reply) ------------------------------------------
    async def record_install(self, row: UriRow) -> None:
        """Commit that a package is installed, with every change noted before it."""
        batch = self._take_batch()

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO uris (kind, uri, dir, size, last_used_ms)"
                " VALUES (?, ?, ?, ?, ?)",
                (row.kind, row.uri, row.dir, row.size, row.last_used_ms),
            )

        try:
            await self._run(lambda conn: self._write(conn, batch, insert))
        except sqlite3.Error:
            self._dirty.set()  # the batch it carried is kept: the write-behind task retries it
            raise

    async def reset_after_recovery(self, dropped: Iterable[RowKey]) -> None:
        """Recovery: drop the rows of missing directories; forget the envs (their clients died
        with the previous agent)."""
        batch = self._take_batch()
        gone = list(dropped)

        def reset(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM uris WHERE kind = ? AND uri = ?", gone)
            conn.execute("UPDATE live SET envs = 0 WHERE id = 0")

        await self._run(lambda conn: self._write(conn, batch, reset))

    # -- write-behind notes (no I/O) ------------------------------------------------------
    def note_uri(self, kind: str, uri: str, last_used_ms: int) -> None:
        self._notes.use((kind, uri), last_used_ms)
        self._mark_dirty()

    def note_uri_dropped(self, kind: str, uri: str) -> None:
        self._notes.drop((kind, uri))
        self._mark_dirty()

    def note_live_envs(self, count: int) -> None:
        """The number of envs the agent holds (creating or ready): recovery's envs forgotten."""
        self._notes.live_envs = count
        self._mark_dirty()

    def pending(self) -> int:
        return len(self._notes)

    def _mark_dirty(self) -> None:
        self._dirty.set()
        if self.pending() >= self._flush_every:
            self._full.set()

    def _take_batch(self) -> _Batch:
        batch, self._notes = self._notes, _Batch()
        return batch

    async def flush(self) -> None:
        """Write every noted change now (and any a failed write left), in one transaction."""
        if self._conn is None or not (self.pending() or self._carried is not None):
            return
        batch = self._take_batch()
        await self._run(lambda conn: self._write(conn, batch, crash_midway=True))

    async def _flush_loop(self) -> None:
        """Write behind: the first note opens a window of ``flush_interval_s``; the batch is
        written when it closes, or as soon as ``flush_every`` changes are noted. A failed
        write (an SQLite error: disk full, I/O) is retried a window later, its changes kept;
        anything else is a bug, logged here and raised by ``close()``."""
        failing = False
        try:
            while not self._closing:
                await self._dirty.wait()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._flush_interval_s)
                self._dirty.clear()
                self._full.clear()
                try:
                    await self.flush()
                except sqlite3.Error:
                    if not failing:
                        log.exception(
                            "writing behind to %s failed; the changes are kept and retried "
                            "every %gs", self.path, self._flush_interval_s,
                        )  # fmt: skip
                    failing = True
                    self._dirty.set()
                    continue
                if failing:
                    log.warning("writing behind to %s works again", self.path)
                failing = False
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.critical(
                "the task writing behind to %s died (a bug): what is noted is now written only "
                "with installs and at close, which raises this", self.path, exc_info=True,
            )  # fmt: skip
            raise


def _apply(conn: sqlite3.Connection, batch: _Batch, *, crash_midway: bool = False) -> None:
    conn.executemany(
        "UPDATE uris SET last_used_ms = ? WHERE kind = ? AND uri = ?",
        [(used, kind, uri) for (kind, uri), used in batch.used.items()],
    )
    if crash_midway:
        crash_point("mid_count_batch")
    conn.executemany("DELETE FROM uris WHERE kind = ? AND uri = ?", list(batch.dropped))
    if batch.live_envs is not None:
        conn.execute("UPDATE live SET envs = ? WHERE id = 0", (batch.live_envs,))


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error, a failed COMMIT included (autocommit
    connection): the next write never finds a transaction left open."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _script(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)
