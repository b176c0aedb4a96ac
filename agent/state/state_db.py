"""The shared cache index: ``<root>/state.db``, SQLite in WAL mode, on one dedicated thread.

Several agents may serve one root at once (``holders``): the index is what they agree on, and
the rules they keep are ``index``'s (R1-R4; its SQL is ``schema``'s). Per package: its key, its
directory's name, its size, its last use, and whether it is ready or being installed (and by
whom: a claim). Per holder: its pid, its start and the envs it holds (written behind: the "N
envs forgotten" of whoever reaps it). Per holder and package: a reference, while that holder's
count of it is above 0. This agent's own counts stay in memory (``RefTables``): the index only
needs to know *whether* a live holder uses a package.

``StateDB`` is this agent's holder of the index: it owns the connection (opened by
``index_file``) and the one thread every statement runs on, in submission order, and the
transactions: each carries the changes noted before it (``notes``, a ``write_behind``, which
also defers the drops of references while the holder is alone on its root), runs one of
``index``'s rules, and lets go the dead holders it reaped after the commit. What must survive
``kill -9`` or be seen by another agent at once is committed before the reply that depends on
it: a reference before the package is used (``obtain``, queued by an ``obtain_queue``),
a package's row before the create that installed it returns (``record_install``). A miss awaits
only its own transactions (they carry the notes, but for the references dropped: those wait
for the next pass or write-behind, and a package taken again meanwhile cancels its drop,
``keep_ref``, with no transaction), and a hit or a delete awaits none.

Writers of every agent take turns (``BEGIN IMMEDIATE``), each waiting up to ``busy_timeout_s``.

``StateDB(":memory:")`` (``--no-state-db``) is the same index, private to one agent.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agent.core.errors import IndexUnavailable, StateDBError
from agent.install.disk.staging import through
from agent.state import index, schema, sweeping
from agent.state.holders import HolderLock
from agent.state.index import KindBudget, Obtained, RowKey
from agent.state.index_file import now_ms, open_index
from agent.state.obtain_queue import ObtainQueue, Wanted
from agent.state.reaping import Reaped
from agent.state.sweeping import Swept
from agent.state.write_behind import DROP_LINGER_S, WriteBehind

log = logging.getLogger(__name__)

T = TypeVar("T")

FILE_NAME = "state.db"  # the index of a root: ``<root>/state.db``
MEMORY = ":memory:"  # --no-state-db: the same index, in memory, private to one agent
BUSY_TIMEOUT_S = 10.0  # another agent's transaction is waited for this long, then UNAVAILABLE

UriRow = index.Row  # a ready package's row


@dataclass(frozen=True)
class Loaded:
    """What a start reads back: the ready packages' rows."""

    uris: list[UriRow]


class StateDB:
    """The index, for this agent: one holder (``holder_id``) of the root. Its parts: ``notes``
    (the write-behind) and the queue of its obtains."""

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
        self._busy_timeout_s = busy_timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-db")
        self._conn: sqlite3.Connection | None = None
        self._holder: HolderLock | None = None
        # the changes noted, written with the next transaction or behind
        self.notes = WriteBehind(
            self.path,
            self.run,
            lambda: self._conn is not None,
            flush_interval_s=flush_interval_s,
            flush_every=flush_every,
            drop_linger_s=drop_linger_s,
            clock=clock,
        )
        self._obtains = ObtainQueue(
            self._obtain_all, taken=self.notes.taken, leftovers=self._hand_leftovers
        )
        # who deletes what a transaction set aside when its caller was cancelled (the store)
        self.on_leftovers: Callable[[list[Path]], None] | None = None
        # packages this holder re-measures now (``measuring``): its passes do not evict them
        # (read on the thread, under ``_guard``)
        self._guard = threading.Lock()
        self._measuring: set[RowKey] = set()

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
    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the index's thread, after every statement submitted before it."""

        def call() -> T:
            assert self._conn is not None
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def open(self) -> None:
        """Become a holder of the root (its lock taken), open (or create) the database, bring
        its schema up to date and register (``index_file.open_index``)."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._open_sync)
        self.notes.start(self.holder_id)

    def _open_sync(self) -> None:
        try:
            self._holder = HolderLock.take(self.root)
        except OSError as exc:
            raise StateDBError(
                f"cannot register this agent under {self.root / 'holders'}: "
                f"{exc.strerror or exc}; fix the folder's ownership or permissions"
            ) from exc
        try:
            self._conn = open_index(
                self.path,
                holder_id=self.holder_id,
                busy_timeout_s=self._busy_timeout_s,
                in_memory=self.in_memory,
            )
        except BaseException:
            self._holder.release()
            self._holder = None
            raise

    async def close(self) -> None:
        """Write what is noted (and what a failed write left), drop this holder's rows, close
        the file, end the thread, let the holder's lock go; then raise what killed the
        write-behind task, if anything did: a bug is not hidden."""
        died = await self.notes.stop()
        try:
            if self._conn is not None:
                try:
                    await self.notes.flush()
                    try:
                        await self.transact(lambda conn, _: index.unregister(conn, self.holder_id))
                    except IndexUnavailable as exc:  # its lock goes below: the next pass of
                        # another agent reaps its rows
                        log.warning("stopping: %s", exc.message, extra={"path": str(self.path)})
                finally:
                    await self.run(lambda conn: conn.close())
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

    async def crash(self) -> None:
        """Stop as ``kill -9`` leaves the root, for crash tests run in one process: the
        write-behind task cancelled and what is noted lost, the connection closed with no
        transaction open, the thread ended, the lock let go but its file left in place (a
        peer's pass reaps this holder's rows)."""
        await self.notes.crash()
        if self._conn is not None:
            await self.run(lambda conn: conn.close())
            self._conn = None
        await asyncio.to_thread(self._thread.shutdown, wait=True)
        self.lose_lock()

    def lose_lock(self) -> None:
        """Let the holder's lock go as the kernel does for a killed process: its file and its
        rows stay, and the connection stays open (peers take this holder for dead)."""
        if self._holder is not None:
            self._holder.lose()

    # -- reads ----------------------------------------------------------------------------
    async def load(self) -> Loaded:
        def read(conn: sqlite3.Connection) -> Loaded:
            return Loaded([UriRow(*row) for row in conn.execute(schema.READY_ROWS)])

        return await self.run(read)

    async def installs_ended(self, keys: list[RowKey]) -> dict[RowKey, UriRow | None]:
        """Of ``keys``, the packages whose install is no longer in flight, as the index says
        now: each one's row if it is ready, None if it is gone. One read, no write lock (WAL:
        it waits for no writer). Its failure is IndexUnavailable."""

        def read(conn: sqlite3.Connection) -> dict[RowKey, UriRow | None]:
            ended: dict[RowKey, UriRow | None] = {}
            for kind, uri in keys:
                row = conn.execute(schema.URI_ROW, (kind, uri)).fetchone()
                if row is None:
                    ended[(kind, uri)] = None
                elif row[3] == "ready":
                    ended[(kind, uri)] = UriRow(kind, uri, row[0], row[1], row[2])
            return ended

        try:
            return await self.run(read)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the cache index {self.path} failed: {exc}") from exc

    # -- transactions, on the thread ------------------------------------------------------
    async def transact(
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
        references dropped stay noted (``WriteBehind.take``)."""
        batch = self.notes.take(refs=refs)

        def call() -> T:
            assert self._conn is not None
            reaped = Reaped()
            try:
                result = self.notes.carry(self._conn, batch, lambda conn: fn(conn, reaped))
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
            self.notes.retry()  # the batch it carried is kept: the write-behind task retries it
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise IndexUnavailable(
                    f"the cache index {self.path} stayed locked by another agent of the root "
                    f"for {self._busy_timeout_s:g}s (its busy timeout); try again"
                ) from exc
            raise IndexUnavailable(f"the cache index {self.path} failed: {exc}") from exc
        finally:
            self.notes.written(batch)

    def _hand_leftovers(self, paths: list[Path]) -> None:
        if self.on_leftovers:
            self.on_leftovers(paths)

    # -- obtains, queued: one transaction for those asked for meanwhile ---------------------
    async def obtain(self, key: RowKey, dir_name: str, *, take_ref: bool) -> Obtained:
        """R1, R3 (``index.obtain``): take this holder's reference and find the package ready,
        claimed for this holder, or installed by a live peer now (``obtain_queue``)."""
        return await self._obtains.obtain(key, dir_name, take_ref=take_ref)

    async def _obtain_all(self, batch: list[Wanted]) -> list[Obtained]:
        """The obtains queued, in one transaction, in order."""

        def run(conn: sqlite3.Connection, reaped: Reaped) -> list[Obtained]:
            return [
                index.obtain(
                    conn,
                    self.root,
                    self.holder_id,
                    w.key,
                    w.dir_name,
                    now_ms(),
                    self.trash,
                    reaped,
                    take_ref=w.take_ref,
                )
                for w in batch
            ]

        return await self.transact(run, lambda got: got[0].reaped.aside if got else [], refs=False)

    async def record_install(self, row: UriRow) -> bool:
        """Commit that a claimed package is installed, with every change noted before it; False
        (nothing committed but the notes) if the claim is no longer this holder's."""
        return await self.transact(
            lambda conn, _: index.commit_install(conn, self.holder_id, row), refs=False
        )

    async def resize(self, key: RowKey, directory: str, ident: tuple[int, int], size: int) -> bool:
        """A re-measured package's size committed (``index.resize``): False if nothing changed
        (the same size, or the package is no longer that folder). Its failure is
        IndexUnavailable."""
        return await self.transact(
            lambda conn, _: index.resize(conn, self.root, key, directory, ident, size),
            refs=False,
        )

    def measuring(self, key: RowKey, now: bool) -> None:
        """This holder re-measures the package (``now``), or is done: meanwhile its passes keep
        it (counted used), so it is never evicted by the size it had before."""
        with self._guard:
            if now:
                self._measuring.add(key)
            else:
                self._measuring.discard(key)

    def _may_evict_now(self, key: RowKey) -> bool:
        """Asked by a pass, on the thread: not while re-measured, nor if taken again."""
        with self._guard:
            if key in self._measuring:
                return False
        return self.notes.may_evict(key)

    async def sweep(
        self,
        budget_bytes: int,
        needed_bytes: int = 0,
        *,
        since: int = -1,
        kind_budgets: Sequence[KindBudget] = (),
    ) -> Swept:
        """R2, R4 (``sweeping.sweep``): reap dead holders, evict over the budget (and for
        ``needed_bytes``); the changes of the ready packages after ``since``. The packages
        whose references this holder deferred count as unused: one taken again while the pass
        is in flight is kept by it, unless it was being evicted (``keep_ref`` then says so)."""

        def run(conn: sqlite3.Connection, reaped: Reaped) -> Swept:
            return sweeping.sweep(
                conn,
                self.root,
                self.holder_id,
                self.trash,
                budget_bytes=budget_bytes,
                needed_bytes=needed_bytes,
                since=since,
                reaped=reaped,
                may_evict=self._may_evict_now,
                kind_budgets=kind_budgets,
            )

        def leftovers(swept: Swept) -> list[Path]:
            evicted = [e.trashed for e in swept.evicted if e.trashed is not None]
            return [*evicted, *swept.reaped.aside]

        with self.notes.evicting_pass():
            swept = await self.transact(run, leftovers)
        for evicted in swept.evicted:  # its reference went with it
            self.notes.evicted((evicted.row.kind, evicted.row.uri))
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

        return await self.transact(run, lambda r: [*r.reaped.aside, *r.orphans])
