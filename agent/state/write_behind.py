"""The index's write-behind: what a holder notes in memory (no I/O) and writes later, in one
transaction, and the drops of references it defers while alone on its root.

What must survive ``kill -9`` or be seen by another agent at once is committed before the reply
that depends on it (``state_db``: a reference before the package is used, a package's row
before the create that installed it returns). Everything else is noted here (``note_*``) and
written behind, in one transaction at most every ``flush_interval_s`` or every ``flush_every``
changes: last-use times, the holder's live envs, references and claims dropped (a late drop
only delays an eviction, or another agent's install by one window). Every transaction of the
index carries the batch noted before it (``obtain`` discards the drop of the reference it
takes): a reference dropped behind can never overwrite one taken after it. A batch whose write
fails is carried by the thread into its next write (so the order still holds), and the
write-behind task retries it; a bug in that task is logged with its traceback when it happens
and raised again by ``close()``, after the last write.

Alone on its root (no other holder registered, as its last transaction saw), a holder *defers*
the drop of a reference: the transaction that takes it keeps the row and lists the key in its
connection's ``temp.released`` (``index``), so the holder's own passes count the package unused
and evict it if the budget asks, deleting the reference with it. A package created again
meanwhile (churn's commonest miss: cached, released moments ago) is held again with no
transaction (``keep_ref``): its reference never left the index (R1). A pass in flight is told
of such a take (``may_evict``) and keeps the package, unless it had chosen to evict it, and
then the create obtains it anew. The write-behind writes a deferred drop once it is
``drop_linger_s`` old, or at once once another holder is registered (it counts the row as a
reference), and ``flush`` writes them all.

``WriteBehind`` is a part of ``StateDB`` (``StateDB.notes``): the notes, the batch each of the
holder's transactions carries (``take``, ``carry``, ``written``) and the task writing them; the
transactions themselves, the connection and its thread are ``StateDB``'s, handed in as ``run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

from agent.crash import crash_point
from agent.state import index, schema
from agent.state.batch import Batch
from agent.state.index import RowKey
from agent.state.index_file import transaction

log = logging.getLogger(__name__)

T = TypeVar("T")

# Alone on its root, a holder defers the drop of a reference this long at most: its row stays in
# the index (the holder's own passes count the package unused, and evict it if the budget asks),
# so a package created again meanwhile is held again with no transaction. Past it, the drop is
# written behind (a reader of the index, a peer that comes, sees the references as they are).
DROP_LINGER_S = 1.0


class WriteBehind:
    """The notes of one holder of the index (``StateDB.notes``), the batches its transactions
    carry, and the task writing them behind. ``run``: a statement on the index's thread, after
    those submitted before it; ``is_open``: whether the index's connection is open."""

    def __init__(
        self,
        path: Path,
        run: Callable[[Callable[[sqlite3.Connection], None]], Awaitable[None]],
        is_open: Callable[[], bool],
        *,
        flush_interval_s: float,
        flush_every: int,
        drop_linger_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.path = path  # the index's file, for messages
        self._run = run
        self._is_open = is_open
        self._me = ""  # this holder's id (``start``)
        self._flush_interval_s = flush_interval_s
        self._flush_every = flush_every
        self._drop_linger_s = drop_linger_s
        self._clock = clock
        # A batch whose transaction failed, kept for the next write. Only the thread touches it
        # (the loop reads whether it is set, after awaiting that write).
        self._carried: Batch | None = None
        # Deferred drops (``keep_ref``): this holder's references released, their rows kept in the
        # index and listed in ``temp.released``, each with when it was deferred (oldest first).
        self._deferred: dict[RowKey, float] = {}
        self._deferring: dict[RowKey, Batch] = {}  # in a transaction in flight that defers it
        self._alone = False  # no other holder on the root, as of the last transaction
        self._alone_seen = False  # written by the thread in each transaction
        # Passes in flight may evict deferred ones: one taken again meanwhile (``keep_ref``) is
        # kept (its pass is told, ``may_evict``), unless its pass chose to evict it first.
        self._evicting = 0
        self._guard = threading.Lock()  # the two sets below, between the loop and the thread
        self._kept: set[RowKey] = set()  # deferred ones taken again while a pass is in flight
        self._evicted: set[RowKey] = set()  # those its passes chose to evict meanwhile
        self._flushing = 0  # flush() in progress: nothing is deferred until it is done
        self._notes = Batch()  # write-behind, on the loop: applied in the next transaction
        self._dirty = asyncio.Event()  # something is noted
        self._full = asyncio.Event()  # enough is noted to write at once
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False  # stop() began: the write-behind task ends after its write

    # -- the task -------------------------------------------------------------------------
    def start(self, holder_id: str) -> None:
        """Start writing behind, for the holder ``holder_id`` (the index open)."""
        self._me = holder_id
        self._flusher = asyncio.create_task(self._flush_loop(), name="state-db flush")

    async def stop(self) -> BaseException | None:
        """End the write-behind task after its write; what killed it, if anything did."""
        flusher, self._flusher = self._flusher, None
        if flusher is None:
            return None
        # Woken and told to end, not cancelled: a cancel could drop a write it has taken its
        # batch for and queued behind another statement on the thread.
        self._closing = True
        self._dirty.set()
        self._full.set()
        await asyncio.wait([flusher])  # never raises the task's own exception
        return None if flusher.cancelled() else flusher.exception()

    async def crash(self) -> None:
        """The task cancelled and the notes lost, as ``kill -9`` leaves them (``StateDB.crash``)."""
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        self._notes = Batch()

    # -- write-behind notes (no I/O) ------------------------------------------------------
    def note_uri(self, kind: str, uri: str, last_used_ms: int) -> None:
        self._notes.use((kind, uri), last_used_ms)
        self._mark_dirty()

    def note_ref_dropped(self, kind: str, uri: str) -> None:
        """This holder's count of the package reached 0."""
        self._notes.refs_dropped.add((kind, uri))
        self._mark_dirty()

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
        """Changes noted and not yet taken by a transaction."""
        return len(self._notes)

    @property
    def noted(self) -> bool:
        """Something was noted since the write-behind task last woke."""
        return self._dirty.is_set()

    def _mark_dirty(self) -> None:
        self._dirty.set()
        if self.pending() >= self._flush_every:
            self._full.set()

    # -- deferred drops -------------------------------------------------------------------
    def taken(self, key: RowKey) -> None:
        """This holder takes the reference again (``obtain``): a drop of it noted or deferred
        is cancelled (the reference is (re)inserted by the obtain, and a deferred drop of it
        cancelled there)."""
        self._notes.refs_dropped.discard(key)
        self._deferred.pop(key, None)
        self._deferring.pop(key, None)

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

    def deferred(self) -> list[RowKey]:
        """References released whose drop is deferred (their rows still in the index), oldest
        first."""
        return list(self._deferred)

    def is_deferring(self, key: RowKey) -> bool:
        """A transaction in flight defers the drop of this reference."""
        return key in self._deferring

    # -- passes ---------------------------------------------------------------------------
    @property
    def evicting(self) -> int:
        """Passes in flight (``evicting_pass``)."""
        return self._evicting

    @contextlib.contextmanager
    def evicting_pass(self) -> Iterator[None]:
        """Around a pass in flight, which may evict packages whose drop is deferred: each asked
        first (``may_evict``), so a take of it meanwhile (``keep_ref``) keeps it."""
        self._evicting += 1
        try:
            yield
        finally:
            self._evicting -= 1
            if not self._evicting:
                with self._guard:
                    self._kept.clear()
                    self._evicted.clear()

    def may_evict(self, key: RowKey) -> bool:
        """Asked by a pass, on the thread, before it evicts a package: False if this holder
        took it again (a deferred drop cancelled since the pass began)."""
        with self._guard:
            if key in self._kept:
                return False
            self._evicted.add(key)
            return True

    def evicted(self, key: RowKey) -> None:
        """A pass evicted the package: its deferred reference went with it."""
        self._deferred.pop(key, None)

    # -- the batch each transaction carries -----------------------------------------------
    def take(self, *, refs: bool = True, defer: bool = True) -> Batch:
        """What is noted, for a transaction to carry. ``refs=False`` (an install's
        transactions): the references dropped stay noted for the next pass or the write-behind
        (a late drop only delays an eviction; ``obtain`` discards the note of a reference it
        takes again, so a drop is never written after a later take of the same reference),
        and may meanwhile be cancelled (``keep_ref``). Otherwise, alone on the root (as of the
        last transaction) and with ``defer``, the drops are deferred, and the deferred drops
        older than the linger written; else every drop is written, the deferred ones too."""
        batch, self._notes = self._notes, Batch()
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

    def carry(
        self,
        conn: sqlite3.Connection,
        batch: Batch,
        then: Callable[[sqlite3.Connection], T] | None = None,
        *,
        crash_midway: bool = False,
    ) -> T | None:
        """One transaction, on the thread: what a failed write left, then ``batch``, then
        ``then`` (its value returned). On failure nothing is applied and the batches are kept
        for the next write, which runs after this one (one thread): the order of the notes
        holds."""
        mine = batch
        if self._carried is not None:
            batch = self._carried.then(batch)
            self._carried = None
        try:
            with transaction(conn):
                mine.deferred = self._apply(conn, batch, crash_midway=crash_midway)
                result = then(conn) if then is not None else None
        except BaseException:
            mine.deferred = []
            self._carried = batch.carried()
            raise
        mine.committed = True
        return result

    def _apply(self, conn: sqlite3.Connection, batch: Batch, *, crash_midway: bool) -> list[RowKey]:
        conn.executemany(
            schema.NOTE_USED, [(used, kind, uri) for (kind, uri), used in batch.used.items()]
        )
        if crash_midway:
            crash_point("mid_count_batch")
        if batch.live_envs is not None:
            conn.execute(schema.SET_LIVE_ENVS, (batch.live_envs, self._me))
        index.undefer(conn, batch.undefer)
        index.drop_refs(conn, self._me, batch.refs_dropped)
        index.drop_claims(conn, self._me, batch.claims_dropped)
        self._alone_seen = index.alone(conn, self._me)
        return index.defer_drops(conn, self._me, batch.defer)

    def written(self, batch: Batch) -> None:
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

    def retry(self) -> None:
        """A transaction failed: the batch it carried is kept, and the write-behind task woken
        to retry it."""
        self._dirty.set()

    # -- writing ------------------------------------------------------------------------------
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
            if not self._is_open() or not (
                self.pending() or self._carried is not None or self._deferred
            ):
                return
            await self._write_notes(self.take(defer=False))
        finally:
            self._flushing -= 1

    async def write_behind(self) -> None:
        """What the write-behind task writes, now: every noted change, drops deferred (alone)
        and the deferred ones past the linger written."""
        if not self._is_open() or not (
            self.pending() or self._carried is not None or self._drops_due()
        ):
            return
        await self._write_notes(self.take())

    async def _write_notes(self, batch: Batch) -> None:
        try:
            await self._run(lambda conn: self.carry(conn, batch, crash_midway=True))
        finally:
            self.written(batch)

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
                    await self.write_behind()
                except sqlite3.Error:
                    if not failing:
                        log.exception(
                            "writing behind to %s failed; the changes are kept and retried "
                            "every %gs",
                            self.path,
                            self._flush_interval_s,
                            extra={"path": str(self.path), "seconds": self._flush_interval_s},
                        )
                    failing = True
                    self._dirty.set()
                    continue
                if failing:
                    log.warning(
                        "writing behind to %s works again",
                        self.path,
                        extra={"path": str(self.path)},
                    )
                failing = False
                if self._deferred:  # looked at again a window later: written past the linger
                    self._dirty.set()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.critical(
                "the task writing behind to %s died (a bug): what is noted is now written only "
                "with installs and at close, which raises this",
                self.path,
                exc_info=True,
                extra={"path": str(self.path)},
            )
            raise
