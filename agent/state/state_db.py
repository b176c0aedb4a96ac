"""The shared cache index: ``<root>/state.db``, SQLite in WAL mode, on one dedicated thread.

Several agents may serve one root at once (``holders``): the index is what they agree on, and
the rules they keep are ``index``'s (R1-R4). Per package: its key, its directory's name, its
size, its last use, and whether it is ready or being installed (and by whom: a claim). Per
holder: its pid, its start and the envs it holds (written behind: the "N envs forgotten" of
whoever reaps it). Per holder and package: a reference, while that holder's count of it is
above 0. This agent's own counts stay in memory (``RefTables``): the index only needs to know
*whether* a live holder uses a package.

What must survive ``kill -9`` or be seen by another agent at once is committed before the reply
that depends on it: a reference before the package is used (``obtain``), a package's row before
the create that installed it returns (``record_install``). Everything else is noted in memory
(``note_*``, no I/O) and written behind, in one transaction at most every ``flush_interval_s``
or every ``flush_every`` changes: last-use times, the holder's live envs, references and claims
dropped (a late drop only delays an eviction, or another agent's install by one window). A
miss awaits only its own transactions (they carry the notes, but for the references dropped:
those wait for the next pass or write-behind, and a package taken again meanwhile cancels its
drop, ``keep_ref``, with no transaction), and a hit or a delete awaits none.
Every statement runs on the one thread, in submission order, and a transaction carries the
batch noted before it (``obtain`` discards the drop of the reference it takes): a reference
dropped behind can never overwrite one taken after it. A
batch whose write fails is carried by the thread into its next write (so the order still
holds), and the write-behind task retries it; a bug in that task is logged with its traceback
when it happens and raised again by ``close()``, after the last write.

Alone on its root (no other holder registered, as its last transaction saw), a holder *defers*
the drop of a reference: the transaction that takes it keeps the row and lists the key in its
connection's ``temp.released`` (``index``), so the holder's own passes count the package unused
and evict it if the budget asks, deleting the reference with it. A package created again
meanwhile (churn's commonest miss: cached, released moments ago) is held again with no
transaction (``keep_ref``): its reference never left the index (R1). A pass in flight is told
of such a take (``_may_evict``) and keeps the package, unless it had chosen to evict it, and
then the create obtains it anew. The write-behind writes a deferred drop once it is
``drop_linger_s`` old, or at once once another holder is registered (it counts the row as a
reference), and ``flush`` writes them all.

Writers of every agent take turns (``BEGIN IMMEDIATE``), each waiting up to ``busy_timeout_s``.
WAL with ``synchronous=NORMAL``: a commit survives the death of the process (what fate sharing
produces); after a power loss the last commits may be lost, and recovery then drops what it
cannot vouch for, so the index is never ahead of the disk.

``StateDB(":memory:")`` (``--no-state-db``) is the same index, private to one agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.core.errors import IndexUnavailable, StateDBError
from agent.crash import crash_point
from agent.install.staging import through
from agent.state import index
from agent.state.holders import HolderLock
from agent.state.index import Obtained, Reaped, RowKey, Swept

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 3
FILE_NAME = "state.db"
MEMORY = ":memory:"  # --no-state-db: the same index, in memory, private to one agent
BUSY_TIMEOUT_S = 10.0  # another agent's transaction is waited for this long, then UNAVAILABLE
# Alone on its root, a holder defers the drop of a reference this long at most: its row stays in
# the index (the holder's own passes count the package unused, and evict it if the budget asks),
# so a package created again meanwhile is held again with no transaction. Past it, the drop is
# written behind (a reader of the index, a peer that comes, sees the references as they are).
DROP_LINGER_S = 1.0

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

# Version 3: several agents share the root. A package's row says whether it is ready or being
# installed, and by whom (a claim); each agent is a holder (its live envs move here from
# ``live``); a holder's references are rows of ``refs``. The agent that wrote version 2 is gone:
# it becomes a dead holder, reaped (and its envs counted as forgotten) by the first pass.
_SCHEMA_V3 = """
ALTER TABLE uris ADD COLUMN state TEXT NOT NULL DEFAULT 'ready';
ALTER TABLE uris ADD COLUMN holder TEXT;
CREATE TABLE holders (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    live_envs INTEGER NOT NULL DEFAULT 0   -- envs it holds (written behind)
);
CREATE TABLE refs (
    holder TEXT NOT NULL,
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    PRIMARY KEY (holder, kind, uri)
);
CREATE INDEX refs_by_uri ON refs (kind, uri);
CREATE INDEX uris_by_use ON uris (state, last_used_ms);
CREATE TABLE changes (         -- ready packages that appeared (1) or went (0), in order: how an
    gen INTEGER PRIMARY KEY AUTOINCREMENT,   -- agent's view follows the index (index.sweep)
    kind TEXT NOT NULL,
    uri TEXT NOT NULL,
    ready INTEGER NOT NULL
);
CREATE TRIGGER ready_inserted AFTER INSERT ON uris WHEN new.state = 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (new.kind, new.uri, 1); END;
CREATE TRIGGER ready_updated AFTER UPDATE OF state ON uris
    WHEN new.state = 'ready' AND old.state != 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (new.kind, new.uri, 1); END;
CREATE TRIGGER ready_deleted AFTER DELETE ON uris WHEN old.state = 'ready'
    BEGIN INSERT INTO changes (kind, uri, ready) VALUES (old.kind, old.uri, 0); END;
INSERT INTO holders (id, pid, started_ms, live_envs)
    SELECT 'schema-v2', 0, 0, envs FROM live WHERE envs > 0;
DROP TABLE live;
"""

# version -> the script that takes a database from version-1 to version
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3}


_WAY_OUT = "start the agent with --reset-state to move it aside and rebuild from an empty cache"

UriRow = index.Row  # a ready package's row


@dataclass(frozen=True)
class Loaded:
    """What a start reads back: the ready packages' rows."""

    uris: list[UriRow]


@dataclass
class _Batch:
    """Changes noted behind, the latest per row, written in one transaction. A ready row is
    never deleted from here: only a pass evicts, after checking its references (R2)."""

    used: dict[RowKey, int] = field(default_factory=dict)  # -> last_used_ms
    live_envs: int | None = None  # None: not noted
    refs_dropped: set[RowKey] = field(default_factory=set)  # this holder's count reached 0
    claims_dropped: set[RowKey] = field(default_factory=set)  # its install failed
    # drops to defer (the rows stay, ``temp.released`` says so), and deferred drops cancelled
    defer: set[RowKey] = field(default_factory=set)
    undefer: set[RowKey] = field(default_factory=set)
    deferred: list[RowKey] = field(default_factory=list)  # set by the thread: what it deferred
    committed: bool = False  # set by the thread: its transaction committed
    done: asyncio.Future[None] | None = None  # a batch that defers: done once ``_written``

    def use(self, key: RowKey, last_used_ms: int) -> None:
        self.used[key] = last_used_ms

    def __len__(self) -> int:
        return (
            len(self.used) + (self.live_envs is not None) + len(self.refs_dropped)
            + len(self.claims_dropped) + len(self.defer) + len(self.undefer)
        )  # fmt: skip

    def then(self, newer: _Batch) -> _Batch:
        """This batch followed by a newer one, as one batch: the same as noting this batch's
        changes and then the newer one's into one (the newer note of a row wins). Dropping a
        reference or a claim twice is dropping it once: those are unions. A failed batch is
        carried with nothing to defer (``written_out``), so only the newer one defers."""
        used = {**self.used, **newer.used}
        live = self.live_envs if newer.live_envs is None else newer.live_envs
        return _Batch(
            used, live, self.refs_dropped | newer.refs_dropped,
            self.claims_dropped | newer.claims_dropped, self.defer | newer.defer,
            self.undefer | newer.undefer,
        )  # fmt: skip

    def carried(self) -> _Batch:
        """What a failed write carries: this batch but its drops to defer, which the loop notes
        again (``StateDB._written``): their rows are still there, rolled back."""
        return _Batch(
            self.used, self.live_envs, self.refs_dropped, self.claims_dropped, set(),
            self.undefer,
        )  # fmt: skip


@dataclass
class _Obtain:
    """One ``obtain`` queued: what it asks, and where its answer goes."""

    key: RowKey
    dir_name: str
    take_ref: bool
    done: asyncio.Future[Obtained]


class StateDB:
    """The index, for this agent: one holder (``holder_id``) of the root."""

    def __init__(
        self,
        path: Path | str,
        *,
        root: Path | None = None,
        flush_interval_s: float = 0.1,
        flush_every: int = 1000,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        drop_linger_s: float = DROP_LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``path``: the file, or ``MEMORY``; ``root``: the root it indexes (default: the
        file's folder), where the holder's lock, staging and trash are. ``drop_linger_s``: how
        long a holder alone on the root defers the drop of a reference (0: never), by
        ``clock``."""
        self.path = Path(path)
        self.in_memory = str(path) == MEMORY
        if root is None and self.in_memory:
            raise ValueError("an index in memory needs the root it indexes")
        self.root = root if root is not None else self.path.parent
        self._flush_interval_s = flush_interval_s
        self._flush_every = flush_every
        self._busy_timeout_s = busy_timeout_s
        self._drop_linger_s = drop_linger_s
        self._clock = clock
        # Deferred drops (``keep_ref``): this holder's references released, their rows kept in the
        # index and listed in ``temp.released``, each with when it was deferred (oldest first).
        self._deferred: dict[RowKey, float] = {}
        self._deferring: dict[RowKey, _Batch] = {}  # in a transaction in flight that defers it
        self._alone = False  # no other holder on the root, as of the last transaction
        self._alone_seen = False  # written by the thread in each transaction
        # Passes in flight may evict deferred ones: one taken again meanwhile (``keep_ref``) is
        # kept (its pass is told, ``_may_evict``), unless its pass chose to evict it first.
        self._evicting = 0
        self._guard = threading.Lock()  # the two sets below, between the loop and the thread
        self._kept: set[RowKey] = set()  # deferred ones taken again while a pass is in flight
        self._evicted: set[RowKey] = set()  # those its passes chose to evict meanwhile
        self._flushing = 0  # flush() in progress: nothing is deferred until it is done
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-db")
        self._conn: sqlite3.Connection | None = None
        self._holder: HolderLock | None = None
        self._notes = _Batch()  # write-behind, on the loop: applied in the next transaction
        # A batch whose transaction failed, kept for the next write. Only the thread touches it
        # (the loop reads whether it is set, after awaiting that write).
        self._carried: _Batch | None = None
        self._dirty = asyncio.Event()  # something is noted
        self._full = asyncio.Event()  # enough is noted to write at once
        self._flusher: asyncio.Task[None] | None = None
        # obtains asked for while one transaction of them is in flight: the next one runs them
        # all (a transaction of a root's index waits for the other agents' writers: one wait
        # for many, as when eight agents create the same envs at once on one root)
        self._obtains: list[_Obtain] = []
        self._obtaining: asyncio.Task[None] | None = None
        self._closing = False  # close() began: the write-behind task ends after its write
        # who deletes what a transaction set aside when its caller was cancelled (the store)
        self.on_leftovers: Callable[[list[Path]], None] | None = None

    @property
    def holder_id(self) -> str:
        """This agent's id among the root's holders (set by ``open``)."""
        assert self._holder is not None, "StateDB.open() first"
        return self._holder.holder_id

    @property
    def staging(self) -> Path:
        """This holder's staging folder: ``<root>/tmp/<holder>``."""
        return self.root / "tmp" / self.holder_id

    @property
    def trash(self) -> Path:
        """This holder's trash: ``<root>/trash/<holder>``."""
        return self.root / "trash" / self.holder_id

    # -- running statements on the thread -------------------------------------------------
    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            assert self._conn is not None
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def open(self) -> None:
        """Become a holder of the root (its lock taken), open (or create) the database, bring
        its schema up to date and register."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._open_sync)
        self._flusher = asyncio.create_task(self._flush_loop(), name="state-db flush")

    def _open_sync(self) -> None:
        """Check the file before changing anything in it (not even its journal mode), then
        migrate (each step re-reads the version inside its transaction: another agent may have
        taken it first). Any SQLite error, at any step, is a StateDBError naming the way out."""
        try:
            self._holder = HolderLock.take(self.root)
        except OSError as exc:
            raise StateDBError(
                f"cannot register this agent under {self.root / 'holders'}: "
                f"{exc.strerror or exc}; fix the folder's ownership or permissions"
            ) from exc
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False,
            timeout=self._busy_timeout_s,
        )  # fmt: skip
        try:
            self._check(conn)
            _set_wal(conn, self._busy_timeout_s)
            conn.execute("PRAGMA synchronous=NORMAL")
            # a REPLACE that removes a ready row logs it gone (``changes``), as a DELETE does
            conn.execute("PRAGMA recursive_triggers=ON")
            while True:
                with _transaction(conn):
                    version = conn.execute("PRAGMA user_version").fetchone()[0]
                    if version >= SCHEMA_VERSION:
                        break
                    _script(conn, _MIGRATIONS[version + 1])
                    conn.execute(f"PRAGMA user_version={version + 1}")
                if not self.in_memory:  # --no-state-db: an index in memory, no state.db
                    log.info("state.db migrated to schema version %d", version + 1)
            conn.execute("PRAGMA temp_store=MEMORY")
            index.create_released(conn)
            with _transaction(conn):
                index.register(conn, self.holder_id, os.getpid(), _now_ms())
        except BaseException as exc:
            conn.close()
            self._holder.release()
            self._holder = None
            if _busy(exc):  # not damaged: --reset-state would throw away every holder's index
                raise StateDBError(
                    f"{self.path} stayed locked by another agent of the root for "
                    f"{self._busy_timeout_s:g}s (the busy timeout) while this agent opened it; "
                    "start it again"
                ) from exc
            if isinstance(exc, sqlite3.Error):
                raise StateDBError(f"{self.path} is unreadable ({exc}); {_WAY_OUT}") from exc
            raise
        self._conn = conn

    def _check(self, conn: sqlite3.Connection) -> None:
        # One read transaction, one snapshot: read apart, the version and the tables could
        # straddle another agent's migration step (version 0 read, then its tables), and a
        # fresh shared root looked like a database this agent did not write.
        conn.execute("BEGIN")
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:  # a read: nothing to keep, and an error above is not hidden by a COMMIT's
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        if check != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check}")
        if version > SCHEMA_VERSION:
            raise StateDBError(
                f"{self.path} has schema version {version}, newer than this agent's "
                f"{SCHEMA_VERSION}; run a newer agent, or {_WAY_OUT}"
            )
        if version == 0 and tables:
            raise StateDBError(
                f"{self.path} is an SQLite database this agent did not write (schema version 0 "
                f"with {tables} objects in it); {_WAY_OUT}"
            )

    async def close(self) -> None:
        """Write what is noted (and what a failed write left), drop this holder's rows, close
        the file, end the thread, let the holder's lock go; then raise what killed the
        write-behind task, if anything did: a bug is not hidden."""
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
                    try:
                        await self._transact(lambda conn, _: index.unregister(conn, self.holder_id))
                    except IndexUnavailable as exc:  # its lock goes below: the next pass of
                        # another agent reaps its rows
                        log.warning("stopping: %s", exc.message)
                finally:
                    await self._run(lambda conn: conn.close())
                    self._conn = None
        finally:
            # joins the thread: off the loop
            await asyncio.to_thread(self._thread.shutdown, wait=True)
            if self._holder is not None:  # rows dropped or not, the lock goes with the agent
                self._holder.release()
        if died is not None:
            raise RuntimeError(
                f"{self.path}: the task writing behind died earlier ({died!r}); what it left "
                "was written at close"
            ) from died

    # -- reads ----------------------------------------------------------------------------
    async def load(self) -> Loaded:
        def read(conn: sqlite3.Connection) -> Loaded:
            return Loaded(
                [
                    UriRow(*row)
                    for row in conn.execute(
                        "SELECT kind, uri, dir, size, last_used_ms FROM uris WHERE state = 'ready'"
                    )
                ]
            )

        return await self._run(read)

    async def installs_ended(self, keys: list[RowKey]) -> dict[RowKey, UriRow | None]:
        """Of ``keys``, the packages whose install is no longer in flight, as the index says
        now: each one's row if it is ready, None if it is gone. One read, no write lock (WAL:
        it waits for no writer). Its failure is IndexUnavailable."""

        def read(conn: sqlite3.Connection) -> dict[RowKey, UriRow | None]:
            ended: dict[RowKey, UriRow | None] = {}
            for kind, uri in keys:
                row = conn.execute(
                    "SELECT dir, size, last_used_ms, state FROM uris WHERE kind = ? AND uri = ?",
                    (kind, uri),
                ).fetchone()
                if row is None:
                    ended[(kind, uri)] = None
                elif row[3] == "ready":
                    ended[(kind, uri)] = UriRow(kind, uri, row[0], row[1], row[2])
            return ended

        try:
            return await self._run(read)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the cache index {self.path} failed: {exc}") from exc

    # -- transactions, on the thread ------------------------------------------------------
    def _write(
        self,
        conn: sqlite3.Connection,
        batch: _Batch,
        then: Callable[[sqlite3.Connection], T] | None = None,
        *,
        crash_midway: bool = False,
    ) -> T | None:
        """One transaction: what a failed write left, then ``batch``, then ``then`` (its value
        returned). On failure nothing is applied and the batches are kept for the next write,
        which runs after this one (one thread): the order of the notes holds."""
        mine = batch
        if self._carried is not None:
            batch = self._carried.then(batch)
            self._carried = None
        try:
            with _transaction(conn):
                mine.deferred = self._apply(conn, batch, crash_midway=crash_midway)
                result = then(conn) if then is not None else None
        except BaseException:
            mine.deferred = []
            self._carried = batch.carried()
            raise
        mine.committed = True
        return result

    def _apply(
        self, conn: sqlite3.Connection, batch: _Batch, *, crash_midway: bool
    ) -> list[RowKey]:
        conn.executemany(
            "UPDATE uris SET last_used_ms = max(last_used_ms, ?) WHERE kind = ? AND uri = ?",
            [(used, kind, uri) for (kind, uri), used in batch.used.items()],
        )
        if crash_midway:
            crash_point("mid_count_batch")
        if batch.live_envs is not None:
            conn.execute(
                "UPDATE holders SET live_envs = ? WHERE id = ?", (batch.live_envs, self.holder_id)
            )
        index.undefer(conn, batch.undefer)
        index.drop_refs(conn, self.holder_id, batch.refs_dropped)
        index.drop_claims(conn, self.holder_id, batch.claims_dropped)
        self._alone_seen = index.alone(conn, self.holder_id)
        return index.defer_drops(conn, self.holder_id, batch.defer)

    async def _transact(
        self,
        fn: Callable[[sqlite3.Connection, Reaped], T],
        leftovers: Callable[[T], list[Path]] = lambda _: [],
        *,
        refs: bool = True,
    ) -> T:
        """``fn`` in one transaction with every change noted before it, awaited. The job runs
        whatever happens to the caller: a cancelled caller waits for it (``through``), so the
        notes it carries are never lost, and what it set aside for deletion (``leftovers``) is
        handed to ``on_leftovers``. The dead holders ``fn`` reaped (into the ``Reaped`` it is
        given) are let go in the thread right after the commit, or abandoned if the transaction
        failed (the next pass reaps them again). SQLite's failures are IndexUnavailable: a
        root that stays busy says for how long it was waited for. ``refs=False``: the
        references dropped stay noted (``_take_batch``)."""
        batch = self._take_batch(refs=refs)

        def call() -> T:
            assert self._conn is not None
            reaped = Reaped()
            try:
                result = self._write(self._conn, batch, lambda conn: fn(conn, reaped))
            except BaseException:
                reaped.abandon()
                raise
            reaped.finish()
            return result  # type: ignore[return-value]

        job = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(self._thread, call))
        try:
            return await through(job)
        except asyncio.CancelledError:
            if not job.cancelled() and job.exception() is None and self.on_leftovers:
                self.on_leftovers(leftovers(job.result()))  # the caller is gone
            raise
        except sqlite3.Error as exc:
            self._dirty.set()  # the batch it carried is kept: the write-behind task retries it
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise IndexUnavailable(
                    f"the cache index {self.path} stayed locked by another agent of the root "
                    f"for {self._busy_timeout_s:g}s (its busy timeout); try again"
                ) from exc
            raise IndexUnavailable(f"the cache index {self.path} failed: {exc}") from exc
        finally:
            self._written(batch)

    # -- durable writes (awaited before a reply) ------------------------------------------
    async def obtain(self, key: RowKey, dir_name: str, *, take_ref: bool) -> Obtained:
        """R1, R3 (``index.obtain``): take this holder's reference and find the package ready,
        claimed for this holder, or installed by a live peer now."""

        if take_ref:  # dropped then taken again is taken: the reference is (re)inserted here
            self._notes.refs_dropped.discard(key)  # (and a deferred drop of it cancelled there)
            self._deferred.pop(key, None)
            self._deferring.pop(key, None)
        want = _Obtain(key, dir_name, take_ref, asyncio.get_running_loop().create_future())
        self._obtains.append(want)
        if self._obtaining is None:
            self._obtaining = asyncio.create_task(self._obtain_queued(), name="state-db obtain")
        try:
            return await through(want.done)
        except asyncio.CancelledError:  # it ran all the same: what it set aside is deleted
            done = want.done
            if not done.cancelled() and done.exception() is None and self.on_leftovers:
                self.on_leftovers(done.result().reaped.aside)
            raise

    def _obtain_all(
        self, batch: list[_Obtain], conn: sqlite3.Connection, reaped: Reaped
    ) -> list[Obtained]:
        """``index.obtain`` for each of ``batch``, in order, in the transaction open. On the
        thread."""
        return [
            index.obtain(
                conn,
                self.root,
                self.holder_id,
                w.key,
                w.dir_name,
                _now_ms(),
                self.trash,
                reaped,
                take_ref=w.take_ref,
            )
            for w in batch
        ]

    async def _obtain_queued(self) -> None:
        """The obtains queued, all in one transaction (in the order asked), then those queued
        meanwhile, until none is left. A failed transaction fails each of its obtains."""
        batch: list[_Obtain] = []
        try:
            while self._obtains:
                batch, self._obtains = self._obtains, []

                run = functools.partial(self._obtain_all, batch)
                try:
                    results = await self._transact(
                        run, lambda got: got[0].reaped.aside if got else [], refs=False
                    )
                except Exception as exc:
                    for w in batch:
                        if not w.done.done():
                            w.done.set_exception(exc)
                    continue
                for i, (w, got) in enumerate(zip(batch, results, strict=True)):
                    if i:  # what the transaction reaped is told once, with the first
                        got.reaped = Reaped()
                    if not w.done.done():
                        w.done.set_result(got)
        finally:
            self._obtaining = None
            for w in [*batch, *self._obtains]:  # cancelled (a close): nobody is left waiting
                if not w.done.done():
                    w.done.cancel()
            self._obtains = []

    async def record_install(self, row: UriRow) -> bool:
        """Commit that a claimed package is installed, with every change noted before it; False
        (nothing committed but the notes) if the claim is no longer this holder's."""
        return await self._transact(
            lambda conn, _: index.commit_install(conn, self.holder_id, row), refs=False
        )

    async def sweep(self, budget_bytes: int, needed_bytes: int = 0, *, since: int = -1) -> Swept:
        """R2, R4 (``index.sweep``): reap dead holders, evict over the budget (and for
        ``needed_bytes``); the changes of the ready packages after ``since``. The packages
        whose references this holder deferred count as unused: one taken again while the pass
        is in flight is kept by it, unless it was being evicted (``keep_ref`` then says so)."""

        def run(conn: sqlite3.Connection, reaped: Reaped) -> Swept:
            return index.sweep(
                conn, self.root, self.holder_id, self.trash, budget_bytes=budget_bytes,
                needed_bytes=needed_bytes, since=since, reaped=reaped, may_evict=self._may_evict,
            )  # fmt: skip

        def leftovers(swept: Swept) -> list[Path]:
            evicted = [e.trashed for e in swept.evicted if e.trashed is not None]
            return [*evicted, *swept.reaped.aside]

        self._evicting += 1
        try:
            swept = await self._transact(run, leftovers)
        finally:
            self._evicting -= 1
            if not self._evicting:
                with self._guard:
                    self._kept.clear()
                    self._evicted.clear()
        for evicted in swept.evicted:  # its reference went with it
            self._deferred.pop((evicted.row.kind, evicted.row.uri), None)
        return swept

    async def reconcile(
        self, scan: Callable[[], index.Scan], expected_dir: Callable[[RowKey], str | None]
    ) -> index.Reconciled:
        """Recovery (``index.reconcile``): the disk and the index made to agree; ``scan`` is
        read in the transaction."""

        def run(conn: sqlite3.Connection, reaped: Reaped) -> index.Reconciled:
            return index.reconcile(
                conn, self.root, self.holder_id, self.trash, scan(), expected_dir, reaped
            )

        return await self._transact(run, lambda r: [*r.reaped.aside, *r.orphans])

    # -- write-behind notes (no I/O) ------------------------------------------------------
    def note_uri(self, kind: str, uri: str, last_used_ms: int) -> None:
        self._notes.use((kind, uri), last_used_ms)
        self._mark_dirty()

    def note_ref_dropped(self, kind: str, uri: str) -> None:
        """This holder's count of the package reached 0."""
        self._notes.refs_dropped.add((kind, uri))
        self._mark_dirty()

    def keep_ref(self, kind: str, uri: str) -> bool:
        """Cancel a drop of this holder's reference noted and not yet taken by a transaction, or
        deferred (its row kept in the index), or being deferred by a transaction in flight,
        unless a pass in flight is evicting the package: True if it was (the reference the
        caller knows committed is still in the index, and now stays); False if there was none
        left to cancel (take the reference with ``obtain``)."""
        key = (kind, uri)
        if key in self._notes.refs_dropped:
            self._notes.refs_dropped.discard(key)
            return True
        if key not in self._deferred and key not in self._deferring:
            return False
        # deferred, or being deferred by a transaction in flight (which keeps its row whatever
        # happens: a failed one is rolled back, and its completion will not note it again)
        if self._evicting:
            with self._guard:
                if key in self._evicted:  # a pass in flight is evicting it
                    return False
                self._kept.add(key)  # and no pass in flight will
        self._deferred.pop(key, None)
        self._deferring.pop(key, None)
        self._notes.undefer.add(key)  # before any later pass: it must not count it unused
        return True

    def _may_evict(self, key: RowKey) -> bool:
        """Asked by a pass, on the thread, before it evicts a package: False if this holder
        took it again (a deferred drop cancelled since the pass began)."""
        with self._guard:
            if key in self._kept:
                return False
            self._evicted.add(key)
            return True

    def deferred(self) -> int:
        """References released whose drop is deferred (their rows still in the index)."""
        return len(self._deferred)

    def note_claim_dropped(self, kind: str, uri: str) -> None:
        """This holder's install of the package failed or was cancelled."""
        self._notes.claims_dropped.add((kind, uri))
        self._mark_dirty()

    def note_live_envs(self, count: int) -> None:
        """The number of envs the agent holds (creating or ready): the envs forgotten of
        whoever reaps this holder if it dies."""
        self._notes.live_envs = count
        self._mark_dirty()

    def pending(self) -> int:
        return len(self._notes)

    def _mark_dirty(self) -> None:
        self._dirty.set()
        if self.pending() >= self._flush_every:
            self._full.set()

    def _take_batch(self, *, refs: bool = True, defer: bool = True) -> _Batch:
        """What is noted, for a transaction to carry. ``refs=False`` (an install's
        transactions): the references dropped stay noted for the next pass or the write-behind
        (a late drop only delays an eviction; ``obtain`` discards the note of a reference it
        takes again, so a drop is never written after a later take of the same reference),
        and may meanwhile be cancelled (``keep_ref``). Otherwise, alone on the root (as of the
        last transaction) and with ``defer``, the drops are deferred, and the deferred drops
        older than the linger written; else every drop is written, the deferred ones too."""
        batch, self._notes = self._notes, _Batch()
        if not refs:
            self._notes.refs_dropped, batch.refs_dropped = batch.refs_dropped, set()
            return batch
        deferring = defer and self._alone and self._drop_linger_s > 0 and not self._flushing
        if self._deferred:
            cutoff = self._clock() - self._drop_linger_s
            due = []
            for key, since in self._deferred.items():  # oldest first
                if deferring and since > cutoff:
                    break
                due.append(key)
            for key in due:
                del self._deferred[key]
        else:
            due = []
        if deferring:
            batch.defer, batch.refs_dropped = batch.refs_dropped, set(due)
            batch.done = asyncio.get_running_loop().create_future()
            for key in batch.defer:
                self._deferring[key] = batch
        else:
            batch.refs_dropped.update(due)
        return batch

    def _written(self, batch: _Batch) -> None:
        """After the transaction that carried ``batch``: the drops it deferred are deferred, and
        if it failed, the drops it was to defer are noted again (their rows are still there);
        but none whose reference was taken again meanwhile (``obtain``, ``keep_ref``)."""
        self._alone = self._alone_seen
        now = self._clock()
        deferred = set(batch.deferred)
        for key in batch.defer:
            if self._deferring.get(key) is not batch:
                continue
            del self._deferring[key]
            if not batch.committed:
                self._notes.refs_dropped.add(key)
                self._mark_dirty()
            elif key in deferred:
                self._deferred[key] = now
        if self._deferred and not self._alone:  # a peer came: the deferred drops go soon
            self._mark_dirty()
        if batch.done is not None and not batch.done.done():
            batch.done.set_result(None)

    def _drops_due(self) -> bool:
        """Deferred drops the write-behind must write now."""
        if not self._deferred:
            return False
        oldest = next(iter(self._deferred.values()))
        return not self._alone or oldest <= self._clock() - self._drop_linger_s

    async def flush(self) -> None:
        """Write every noted change now (and any a failed write left), the deferred drops of
        references too, in one transaction."""
        self._flushing += 1
        try:
            # what a transaction in flight defers is deferred once it is done: written here
            deferring = {b.done for b in self._deferring.values() if b.done is not None}
            if deferring:
                await asyncio.wait(deferring)
            if self._conn is None or not (
                self.pending() or self._carried is not None or self._deferred
            ):
                return
            await self._write_notes(self._take_batch(defer=False))
        finally:
            self._flushing -= 1

    async def _write_behind(self) -> None:
        """What the write-behind task writes: every noted change, drops deferred (alone) and
        the deferred ones past the linger written."""
        if self._conn is None or not (
            self.pending() or self._carried is not None or self._drops_due()
        ):
            return
        await self._write_notes(self._take_batch())

    async def _write_notes(self, batch: _Batch) -> None:
        try:
            await self._run(lambda conn: self._write(conn, batch, crash_midway=True))
        finally:
            self._written(batch)

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
                    await self._write_behind()
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
                if self._deferred:  # looked at again a window later: written past the linger
                    self._dirty.set()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.critical(
                "the task writing behind to %s died (a bug): what is noted is now written only "
                "with installs and at close, which raises this", self.path, exc_info=True,
            )  # fmt: skip
            raise


def _busy(exc: BaseException) -> bool:
    """SQLITE_BUSY, of any flavour: another connection holds the lock ("database is locked")."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF == 5


def _set_wal(conn: sqlite3.Connection, busy_timeout_s: float) -> None:
    """The file in WAL mode (kept in the file: a later opener finds it so and changes nothing).
    Switching takes the file's exclusive lock, and SQLite answers BUSY at once, not after the
    busy timeout, while another opener of a fresh shared root reads it: retried until then."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")  # a file system without WAL keeps
            return  # its mode, as SQLite decides
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)  # on the database's own thread, never the event loop


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
    """Each statement of the script ends a line with ";" (a trigger's body is on one line)."""
    for statement in script.split(";\n"):
        if statement.strip():
            conn.execute(statement)


def _now_ms() -> int:
    return int(time.time() * 1000)
