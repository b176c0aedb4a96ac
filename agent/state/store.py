"""The URI store: packages on disk, one install per URI at a time across every agent of the
root, eviction of what no agent uses under one budget.

Layout under the root (``state_db``, ``holders``)::

    uris/<kind>-<hash>/   a complete package: it exists whole or not at all
    tmp/<holder>/<random>/  this agent's staging: download, extraction, one rename into uris/
    trash/<holder>/<random>/  packages this agent evicted, deleted in a thread

Lifecycle of one (kind, URI) key, in this agent::

    absent --ensure--> INSTALLING --ok--> READY, held --(count 0)--> READY, not held
                           |                                            |    |
                           |        ensure: taken again (INSTALLING) <--+    |
                           |                   a pass evicts it: absent <----+
                           +--error--> absent (every waiter gets the error; the next ensure retries)

INSTALLING is *obtaining*: the reference is taken in the index, then the package is found
ready (a hit), or claimed and installed here, or waited for while a peer installs it.

*Held*: this agent's reference to the package is committed in the index (``index`` R1), so no
agent of the root evicts it. The store does not count references: it asks ``refcount`` (the
reference tables) and is told by the service when a key is released (count 1 -> 0); a key whose
count went 0 -> 1 is taken again by ``ensure`` (one transaction), so a create may use it only
once it is held. A create of an env that is ready (the hot path) touches none of this.

Evictions are passes over the index (``index.sweep``: reap the dead holders, evict the root's
unused packages over the budget, least recently used first), run after a release and after an
install (one at a time, coalesced: a pass asked for waits ``pass_window_s`` for more changes to
carry, unless someone waits for it), every ``sweep_interval_s``, and when the disk room lacks
bytes (at once). A pass's result is also how this agent's view follows the index: packages
other agents installed appear, packages they evicted go.

Blocking work (copy, hash, unzip, rmtree, SQLite) runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from agent.core.errors import AgentError, DiskExhausted, IndexUnavailable, echo_label
from agent.core.packages import Package
from agent.core.uris import UriKey, UriKind
from agent.crash import crash_point
from agent.install.disk import (
    DiskFloor,
    move_to_trash,
    package_dir,
    remove_all,
    remove_tree,
)
from agent.install.installers import Installer, InstallJob
from agent.install.modes import make_dir
from agent.install.staging import place_package, prepare_staging, through
from agent.install.wheel_cache import WheelCache
from agent.state.index import Found, RowKey, Swept
from agent.state.room import Claim, DiskRoom
from agent.state.state_db import StateDB, UriRow

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_WAIT_FIRST_S, _WAIT_MAX_S = 0.01, 0.25  # polling a peer's install: doubling, capped
# Meanwhile one read of the index per tick, for every package this agent waits on, wakes the
# waiters whose peer's install ended (ready: used at once, or gone: obtained again): the poll's
# cap is then only how soon a claim of a dead peer is found (an obtain reaps it)
PEER_TICK_S = 0.01
# A pass asked for waits this long for more changes to carry (one pass for the releases of a
# busy moment, not one each), unless someone waits for it (``caught_up``, ``settle``): unused
# bytes may stay over the budget for that long, never longer than the pass takes after it
PASS_WINDOW_S = 0.01


class UriState(Enum):
    INSTALLING = "installing"  # being obtained: referenced in the index, then found or installed
    READY = "ready"


@dataclass
class UriEntry:
    key: UriKey
    path: Path
    state: UriState = UriState.INSTALLING
    size: int = 0  # bytes unpacked, measured once at install
    last_used_ms: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    waiters: int = 0  # ensure() calls awaiting the install
    abandoned: bool = False  # INSTALLING, its task cancelled as its last waiter left: nobody
    # joins it (its end is a cancellation), an ensure waits for it to end and obtains anew
    held: bool = False  # this agent's reference is committed in the index
    was_ready: bool = False  # READY before its current obtain began
    committed: bool = False  # its install's commit went through, then it was cancelled: the
    # package is the root's (``_install`` makes it READY here, not forgotten)
    dropping: bool = False  # READY, released while held: the drop of its committed reference
    # is noted for the index; while the note is not taken by a transaction, or the drop is
    # deferred (its row kept: this agent alone on the root), ``ensure`` holds it again by
    # cancelling the drop (``StateDB.keep_ref``), no transaction


@dataclass
class StoreStats:
    used_bytes: int
    unused_bytes: int
    budget_bytes: int
    downloads: int
    extractions: int
    evictions: int
    hits: int


class UriStore:
    """Invariants (``check_invariants``):
    S1. a READY entry is held iff ``refcount(key) > 0``, between steps (a key whose count
        went 0 -> 1 is held again by its ``ensure``, started in the same step).
    S2. an INSTALLING entry has a running task.
    S3. a held READY entry's directory exists (no agent evicts a held package).
    S4. after ``settle()``, the root's unused bytes fit the budget (the last pass enforced
        it), and this agent's view of the ready packages is the index's.
    """

    def __init__(
        self,
        root: Path,
        installers: Mapping[UriKind, Installer],
        *,
        db: StateDB,
        refcount: Callable[[UriKey], int],
        budget_bytes: int,
        disk_floor: DiskFloor | None = None,
        install_slots: int = 8,
        on_install: Callable[[bool, int, float], None] | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        sweep_interval_s: float = 10.0,
        pass_window_s: float = PASS_WINDOW_S,
        wheel_cache: WheelCache | None = None,
    ) -> None:
        """``installers``: how each kind is made, one per kind (``build_installers``: the
        store only knows that a package is made in a staging folder, never how). ``db``: the
        root's index, opened (this agent a holder of it). ``wheel_cache``: the cache uv links
        venvs from, its own bytes counted as unused and cleared after the packages (the rule:
        ``agent.install.wheel_cache``)."""
        self.root = root
        self.wheel_cache = wheel_cache
        self._db = db
        self._refcount = refcount
        self._install_slots = asyncio.Semaphore(install_slots)  # more installs wait here
        self._on_install = on_install
        self._installers = dict(installers)
        self._clock = clock
        self._sleep = sleep
        self._sweep_interval_s = sweep_interval_s
        self.budget_bytes = budget_bytes  # the root's unused bytes kept; enforced by passes
        self._entries: dict[UriKey, UriEntry] = {}
        self._room = DiskRoom(root, disk_floor, self._evict_for)  # the floor, installs' claims
        self._background: set[asyncio.Task[None]] = set()
        self._sweeping: asyncio.Task[None] | None = None  # the pass running, if any
        self._sweep_again = False  # a pass was asked for while one ran
        self._pass_window_s = pass_window_s
        self._hurry = asyncio.Event()  # someone waits for the next pass: no window before it
        self._periodic: asyncio.Task[None] | None = None
        # packages a peer installs, this agent's obtain waiting on each: woken (the future
        # done) by the watcher when the index no longer shows the install in flight
        self._peer_installs: dict[RowKey, asyncio.Future[UriRow | None]] = {}
        self._watcher: asyncio.Task[None] | None = None  # while there are any
        self._closing = False  # close() began: no pass is started any more
        self._last_release_ms = 0  # strictly increasing over this agent's releases
        self._root_bytes = (0, 0)  # the root's ready and unused bytes, as of the last pass
        self._seen_gen = -1  # the index's last change of the ready packages this view follows
        # (-1: none yet, or the view lost one (``_forget``): the next pass reads them all)
        self._resets = 0  # full reads asked for (``_forget``): a pass started before the last
        # one may have read the index before the view lost the package, so it cannot answer it
        self.downloads = 0
        self.extractions = 0
        self.evictions = 0
        self.hits = 0
        self.passes = 0  # over the index, run by this agent
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for sub in ("uris", "tmp", "trash"):
            make_dir(root / sub)  # 0755 whatever the umask; loose modes of an earlier run fixed
        for own in (db.staging, db.trash):
            own.mkdir(mode=0o700, exist_ok=True)
        db.on_leftovers = self.delete_in_background  # what a cancelled transaction set aside

    def adopt(self, key: UriKey, size: int, last_used_ms: int) -> None:
        """A package the index vouches for and the disk holds, not used by this agent."""
        if key in self._entries:
            return
        entry = UriEntry(key, self.path_for(key), UriState.READY, size, last_used_ms)
        self._entries[key] = entry

    # -- paths -----------------------------------------------------------------------------
    def path_for(self, key: UriKey) -> Path:
        """Where a key's package lives once installed: a pure function of the key (an entry's
        path is it, made once: a create's context asks again for every package it names)."""
        entry = self._entries.get(key)
        return entry.path if entry is not None else package_dir(self.root, key)

    # -- installs --------------------------------------------------------------------------
    async def ensure(self, package: Package) -> Path:
        """Return the package's directory, held (referenced in the index), installing it first
        if no agent of the root has (single-flight, here and across the root), by the installer
        of its kind, from the recipe it carries.

        An install runs for as long as someone waits for it: cancelling one caller leaves it to
        the others; when the last one leaves (a cancelled create, a setup timeout), the install
        is cancelled too, its download stopped and its files removed. A create arriving while
        such an install ends (its commit may wait for the index) waits for that end, then uses
        the package if it was committed after all, or obtains it anew.
        """
        key = package.key
        installer = self._installer_for(key.kind)
        installer.check(package, key.label)  # today's settings, even for a package cached before
        entry = self._entries.get(key)
        while entry is not None and entry.abandoned:
            await self._outlive(entry)
            entry = self._entries.get(key)
        if entry is not None and entry.state is UriState.READY and entry.held:
            self.hits += 1
            entry.last_used_ms = self._now_ms()
            return entry.path
        if (
            entry is not None and entry.state is UriState.READY and entry.dropping
            and self._db.keep_ref(key.kind.value, key.uri)
        ):  # fmt: skip
            # released moments ago, its reference still in the index (the drop only noted):
            # held again as it was, without a transaction (R1 holds: committed before)
            entry.held, entry.dropping = True, False
            self.hits += 1
            entry.last_used_ms = self._now_ms()
            return entry.path
        if entry is None or entry.state is UriState.READY:
            if entry is None:
                entry = UriEntry(key=key, path=self.path_for(key))
                self._entries[key] = entry
            else:  # ready, not held: taken again. If that fails, the next pass reads every
                entry.was_ready = True  # ready package (the change log would not bring it back)
            entry.state = UriState.INSTALLING
            entry.task = asyncio.create_task(
                self._obtain(entry, package, installer), name=f"install {key.label}"
            )
            entry.task.add_done_callback(_retrieve_exception)
        task = entry.task
        assert task is not None
        entry.waiters += 1
        try:
            await asyncio.shield(task)
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and not task.done():
                entry.abandoned = True
                task.cancel()
        return entry.path

    async def _outlive(self, entry: UriEntry) -> None:
        """Wait for an abandoned install to end (its claim and reference given back, or its
        package ready), without taking on its cancellation."""
        assert entry.task is not None
        await asyncio.wait([entry.task])
        # it ended READY or forgotten (``_ready``, ``_forget``): never waited for twice
        assert self._entries.get(entry.key) is not entry or entry.state is UriState.READY

    def touch(self, keys: Iterable[UriKey], *, note: bool = False) -> None:
        """A create of a ready env used these keys: count the hits, refresh their last use, and
        with ``note`` note it for the index too (as ``note`` does, in the same pass).

        A hit is a key a create needed that was already installed (here or in ``ensure``)."""
        now = self._now_ms()
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self.hits += 1
                entry.last_used_ms = now
                if note:
                    self._db.note_uri(key.kind.value, key.uri, now)

    def _installer_for(self, kind: UriKind) -> Installer:
        installer = self._installers.get(kind)
        if installer is None:  # the table is complete: a kind without an installer is a bug
            raise AssertionError(f"no installer for package kind {kind.value!r}")
        return installer

    async def _obtain(self, entry: UriEntry, package: Package, installer: Installer) -> None:
        """Take the reference in the index, then use the package if it is ready, install it
        under this agent's claim, or wait for the peer installing it (polling, doubling up to
        ``_WAIT_MAX_S``, for as long as someone waits here). On any failure (or cancellation)
        the entry is forgotten, and the claim and the reference, if nobody counts it, given
        back behind."""
        key = entry.key
        row_key = (key.kind.value, key.uri)
        started, delay = time.monotonic(), _WAIT_FIRST_S
        try:
            while True:
                obtained = await self._db.obtain(row_key, entry.path.name, take_ref=True)
                self.delete_in_background(obtained.reaped.aside)
                if obtained.found is Found.READY:
                    assert obtained.row is not None
                    entry.size, entry.last_used_ms = obtained.row.size, self._now_ms()
                    self.hits += 1
                    self._ready(entry, None, started)
                    return
                if obtained.found is Found.CLAIMED:
                    break
                row = await self._wait_for_peer(row_key, delay)
                if row is not None and row.dir == entry.path.name and entry.path.is_dir():
                    # the peer's install is ready, and this agent's reference was committed by
                    # the obtain that found it in flight (R1): used without another transaction
                    entry.size, entry.last_used_ms = row.size, self._now_ms()
                    self.hits += 1
                    self._ready(entry, None, started)
                    return
                delay = min(delay * 2, _WAIT_MAX_S)
        except BaseException:
            self._forget(entry, None, started)
            raise
        await self._install(entry, package, installer, started)

    async def _wait_for_peer(self, row_key: RowKey, delay: float) -> UriRow | None:
        """Sleep ``delay``, or less: until the watcher reads that the peer's install of the
        package ended. Its row if the watcher read it ready, else None (obtain again: ready,
        or claim it)."""
        ended: asyncio.Future[UriRow | None] = asyncio.get_running_loop().create_future()
        self._peer_installs[row_key] = ended  # single-flight: one obtain per key waits here
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_peers(), name="peer installs")
        sleep: asyncio.Future[None] = asyncio.ensure_future(self._sleep(delay))
        try:
            either: list[asyncio.Future[Any]] = [sleep, ended]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleep.cancel()
            if self._peer_installs.get(row_key) is ended:
                del self._peer_installs[row_key]
        return ended.result() if ended.done() else None

    async def _watch_peers(self) -> None:
        """While this agent waits on peers' installs: every ``PEER_TICK_S``, one read of the
        index for them all; the waiters whose install is no longer in flight are woken. A
        failed read wakes nobody (their own polls go on)."""
        try:
            while self._peer_installs:
                await asyncio.sleep(PEER_TICK_S)
                waited = [key for key, ended in self._peer_installs.items() if not ended.done()]
                if not waited:
                    continue
                try:
                    rows = await self._db.installs_ended(waited)
                except (AgentError, OSError) as exc:
                    log.debug("reading the peers' installs failed: %s", exc)
                    continue
                for key, row in rows.items():
                    ended = self._peer_installs.get(key)
                    if ended is not None and not ended.done():
                        ended.set_result(row)
        finally:
            self._watcher = None

    async def _install(
        self, entry: UriEntry, package: Package, installer: Installer, started: float
    ) -> None:
        """One install under this agent's claim, from the queue to READY: a slot, a private
        staging folder, room on the disk, the kind's installer, the rename into place, the
        commit. On any failure (or cancellation) the entry is forgotten and the staging folder
        goes."""
        label = entry.key.label  # the URI cut once: every message and log line below names it
        staging = self._db.staging / uuid.uuid4().hex
        fetched, queued, claim, cleared = 0, True, Claim(), False

        def downloaded(size: int) -> None:
            nonlocal fetched
            fetched = size
            self.downloads += 1

        try:
            await self._install_slots.acquire()  # a queue, not a failure
            queued = False
            self._room.claims.add(claim)
            prepare = asyncio.to_thread(prepare_staging, staging, installer.prepare)
            await through(asyncio.ensure_future(prepare))
            log.info("installing %s", label, extra={"uri": label})
            await self._room.make_room(0, label, claim)
            space = self._room.space(claim, label)
            job = InstallJob(staging, entry.path, label, space, downloaded, self._unpacked)
            installed = await installer.install(package, job)
            crash_point("after_extract")
            await self._place(installed.path, entry.path, staging)
            cleared = True  # what the install left in its staging went in the same hop
            crash_point("after_rename_before_commit")
            entry.size, entry.last_used_ms = installed.size, self._now_ms()
            await self._commit(entry)
        except BaseException as exc:
            if entry.committed:  # cancelled after its commit: installed, for every agent; this
                entry.committed = False  # view knows it (no pass may come to adopt it), and its
                self._ready(entry, fetched, started)  # reference goes if nobody counts it
                raise
            self._forget(entry, fetched, started)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise DiskExhausted(_disk_full(label)) from exc
            raise
        finally:
            self._room.claims.discard(claim)
            if not queued:
                self._install_slots.release()
            # in the background: an await here could be cancelled between the commit and READY,
            # leaving the package installed on disk and "installing" for ever in the store
            if not cleared:
                self.delete_in_background([staging], trash=False)
        self._ready(entry, fetched, started)

    def _unpacked(self) -> None:
        self.extractions += 1

    def _forget(self, entry: UriEntry, fetched: int | None, started: float) -> None:
        """A failed or cancelled obtain: the key is absent again (the next ensure retries); its
        claim, if it took one, and its reference, if nobody counts it, are given back behind."""
        key = entry.key
        if self._entries.get(key) is entry:
            del self._entries[key]
            if entry.was_ready:  # still ready in the index, maybe: a full read brings it back
                self._seen_gen = -1
                self._resets += 1
                self._schedule_sweep()
        self._db.note_claim_dropped(key.kind.value, key.uri)
        if self._refcount(key) == 0:
            self._db.note_ref_dropped(key.kind.value, key.uri)
        if fetched is not None and self._on_install is not None:
            self._on_install(False, fetched, time.monotonic() - started)

    def _ready(self, entry: UriEntry, fetched: int | None, started: float) -> None:
        """Held and READY (installed here when ``fetched`` is not None: counted and logged);
        released at once if every create that wanted it went away meanwhile."""
        entry.state = UriState.READY
        entry.task = None
        entry.abandoned = False  # an abandoned install that committed anyway: ready to join
        entry.held = True
        entry.dropping = False
        if fetched is not None:
            seconds = time.monotonic() - started
            if self._on_install is not None:
                self._on_install(True, fetched, seconds)
            label, size = entry.key.label, entry.size
            log.info(
                "installed %s: %d bytes fetched, %d bytes unpacked, %.2fs", label, fetched,
                size, seconds, extra={"uri": label, "fetched_bytes": fetched,
                                      "unpacked_bytes": size, "seconds": round(seconds, 3)},
            )  # fmt: skip
        self._schedule_sweep()  # the root's figures (and its budget, after an install)
        if self._refcount(entry.key) == 0:
            self.release([entry.key])

    async def _place(self, unpacked: Path, final: Path, staging: Path) -> None:
        """Rename the package into place (``place_package``), then delete what is left of the
        staging folder (the download), in one thread hop. The hop ends even if the install is
        cancelled meanwhile; a package it placed then goes again, as no commit will vouch for it
        (nothing in uris/ without a row)."""
        trash = self._db.trash
        step = asyncio.ensure_future(asyncio.to_thread(_place_and_clear, trash, unpacked, final,
                                                       staging))  # fmt: skip
        try:
            leftover = await through(step)
        except asyncio.CancelledError:
            if not step.cancelled() and step.exception() is None:
                left = step.result()
                self.delete_in_background([self._to_trash(final), *([left] if left else [])])
            raise
        if leftover is not None:
            self.delete_in_background([leftover])

    async def _commit(self, entry: UriEntry) -> None:
        """Make the install durable, and known to every agent, before anyone is told of it;
        undo the rename if that fails. If the claim is no longer this agent's, raise
        IndexUnavailable (the create may try again) and leave the folder alone."""
        row = UriRow(
            entry.key.kind.value, entry.key.uri, entry.path.name, entry.size, entry.last_used_ms
        )  # fmt: skip
        step = asyncio.create_task(self._db.record_install(row), name=f"commit {entry.key.label}")
        try:
            # a cancellation waits for the commit, to know its outcome
            committed = await through(step)
        except BaseException:
            if step.cancelled() or step.exception() is not None:  # not committed: nobody
                self.delete_in_background([self._to_trash(entry.path)])  # vouches for it
            else:  # committed: the package stays, ready for every agent
                entry.committed = step.result()
            raise
        if not committed:  # the claim was taken from this agent: a peer may have placed and
            # committed its own install at entry.path since, so the folder is left to the
            # next claim (place_package sets a leftover aside) or to a start's recovery
            raise IndexUnavailable(
                f"{entry.key.label}: another agent of the root took over this install (it "
                "found this agent's claim dead); nothing was committed; try again"
            )

    def note(self, keys: Iterable[UriKey]) -> None:
        """Note these keys' last use for the index, written behind (no I/O)."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self._db.note_uri(key.kind.value, key.uri, entry.last_used_ms)

    # -- references ------------------------------------------------------------------------
    def release(self, keys: Iterable[UriKey]) -> None:
        """These keys' counts reached 0: their references in the index go (behind), and a
        pass will evict what the root no longer needs over the budget."""
        keys = list(keys)
        if not keys:  # a delete that left every count above 0: no pass, no index work
            return
        now = self._release_stamp()
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.INSTALLING:
                # released when it ends, if its count is 0 then: a create may join it before,
                # and its reference must still be in the index when it is handed out (R1)
                continue
            self._db.note_ref_dropped(key.kind.value, key.uri)
            if entry is None:
                continue
            entry.dropping = entry.held  # the drop noted is of a reference committed before
            entry.held = False
            entry.last_used_ms = now
            self._db.note_uri(key.kind.value, key.uri, now)
        self._schedule_sweep()

    # -- passes ----------------------------------------------------------------------------
    def start(self) -> None:
        """Begin the periodic passes (after recovery): a dead agent's references are taken
        back, and the budget kept, even when this agent is idle."""
        if self._periodic is None and self._sweep_interval_s > 0:
            self._periodic = asyncio.create_task(self._every_interval(), name="sweeps")

    async def _every_interval(self) -> None:
        while True:
            await self._sleep(self._sweep_interval_s)
            self._schedule_sweep()

    def _schedule_sweep(self) -> None:
        """A pass soon: at once if none runs, else once more after the one running (none once
        the store closes: an install its close cancels must not start one)."""
        if self._closing:
            return
        if self._sweeping is not None:
            self._sweep_again = True
            return
        self._sweeping = asyncio.create_task(self._sweep_loop(), name="sweep")
        self._sweeping.add_done_callback(_retrieve_exception)

    async def _sweep_loop(self) -> None:
        try:
            while True:
                await self._window()
                self._sweep_again = False
                # with a wheel cache, the evicted are deleted before it is measured (looked at
                # before the sweep: nothing may await between the sweep and its _apply)
                cache = self.wheel_cache is not None and await asyncio.to_thread(
                    self.wheel_cache.path.is_dir
                )
                try:
                    self.passes += 1
                    resets = self._resets
                    swept = await self._db.sweep(self.budget_bytes, since=self._seen_gen)
                except AgentError as exc:  # busy or failing: retried at the next pass
                    log.warning("a pass over the cache index failed (%s); retried at the next",
                                exc.message)  # fmt: skip
                    return
                except Exception:  # a bug: logged with its traceback, the next pass runs
                    log.exception("a pass over the cache index failed (a bug)")
                    return
                trashed = self._apply(swept, resets, delete=not cache)
                if cache:
                    await self._keep_cache_in_budget(trashed, swept.unused_bytes)
                if not self._sweep_again:
                    return
        finally:
            self._sweeping = None

    async def _window(self) -> None:
        """Before a pass: let the changes of the next ``pass_window_s`` join it, unless someone
        waits for the pass (``caught_up``, ``settle``); a wait that comes during the window
        ends it."""
        if self._pass_window_s > 0 and not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), self._pass_window_s)
        self._hurry.clear()

    async def enforce_budget(self) -> None:
        """Run a pass now (after any running) and wait for it: the budget holds after it."""
        self._schedule_sweep()
        await self.settle()

    async def caught_up(self, timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) for the pass running or asked for, so ``stats()``
        counts every change this agent made before the call (other agents' as of that pass).
        A pass that runs longer (a busy index) leaves the figures of the one before."""
        task = self._sweeping
        if task is not None:
            self._hurry.set()
            await asyncio.wait([task], timeout=timeout_s)

    async def settle(self) -> None:
        """Wait until no pass runs or is asked for and background deletions are done (tests,
        recovery, shutdown)."""
        for _ in range(1000):
            task = self._sweeping
            if task is None and not self._background:
                return
            if task is not None:
                self._hurry.set()
                await asyncio.wait([task])
            if self._background:
                await asyncio.gather(*self._background, return_exceptions=True)
        raise AssertionError("the store did not settle after 1000 rounds")

    async def _keep_cache_in_budget(self, trashed: list[Path], unused: int) -> None:
        """After a pass: the evicted packages deleted first (their files the cache shares become
        its own), then the cache measured, and cleared if the root's unused bytes and its own
        are over the budget."""
        cache = self.wheel_cache
        assert cache is not None
        if trashed:
            await asyncio.to_thread(remove_all, trashed)
        if await cache.measure() and unused + cache.own_bytes > self.budget_bytes:
            log.info(
                "the wheel cache's own %d bytes and %d unused bytes are over the budget of %d",
                cache.own_bytes, unused, self.budget_bytes,
            )  # fmt: skip
            await cache.clear()

    async def _evict_for(self, needed: int) -> list[Path]:
        """The disk room lacks ``needed`` bytes: a pass that frees them (none if all the
        unused bytes of the root would not); return the trashed paths, still to be deleted.
        When the pass can free none, the wheel cache is cleared (its own bytes freed: the room
        measures again)."""
        self.passes += 1
        resets = self._resets
        swept = await self._db.sweep(self.budget_bytes, needed, since=self._seen_gen)
        trashed = self._apply(swept, resets, delete=False)
        if not trashed and self.wheel_cache is not None and await self.wheel_cache.measure():
            await self.wheel_cache.clear()
        return trashed

    def _apply(self, swept: Swept, resets: int, *, delete: bool) -> list[Path]:
        """A pass's result (``resets``: the count of full reads asked for when it started):
        count and log this agent's evictions, have the dead holders' folders deleted, and make
        this agent's view of the ready packages follow the index's changes. Return the evicted
        packages' trashed paths (deleted here when ``delete``)."""
        trashed = []
        for evicted in swept.evicted:
            row = evicted.row
            label = echo_label(f"{row.kind}:{row.uri}")  # as UriKey.label, any kind
            self.evictions += 1
            if evicted.trashed is None:
                log.warning("evicting %s: its folder was gone already", label)
            else:
                trashed.append(evicted.trashed)
            log.info(
                "evicted %s (%d bytes, unused)", label, row.size,
                extra={"uri": label, "bytes": row.size},
            )  # fmt: skip
        if delete and trashed:
            self.delete_in_background(trashed)
        self.delete_in_background(swept.reaped.aside)
        if swept.gen >= self._seen_gen or swept.full:  # an older pass's result changes nothing
            self._follow(swept, resets)
        self._root_bytes = (swept.ready_bytes, swept.unused_bytes)
        return trashed

    def _follow(self, swept: Swept, resets: int) -> None:
        """This agent's view of the ready packages, made the index's: those another agent
        installed appear (not held), those evicted go. Held entries and installs in flight are
        this agent's own: no other agent evicts or installs them. A full read asked for after
        the pass started stays asked for."""
        changed = {}
        for (kind, uri), row in swept.changes:
            try:
                changed[UriKey(UriKind(kind), uri)] = row
            except ValueError:  # a kind this agent does not know (a newer peer's)
                continue
        if swept.full:
            for key, entry in list(self._entries.items()):
                if key not in changed and entry.state is UriState.READY and not entry.held:
                    del self._entries[key]
        for key, row in changed.items():
            known = self._entries.get(key)
            if row is None:
                if known is not None and known.state is UriState.READY and not known.held:
                    del self._entries[key]
            elif known is None:
                self.adopt(key, row.size, row.last_used_ms)
        self._seen_gen = swept.gen if resets == self._resets else -1

    def _to_trash(self, path: Path) -> Path:
        return move_to_trash(self._db.trash, path)

    def delete_in_background(self, paths: list[Path], *, trash: bool = True) -> None:
        """Delete ``paths`` in a thread. ``trash``: evicted packages (a crash point for tests);
        otherwise staging left by an install."""
        if not paths:
            return
        task = asyncio.create_task(asyncio.to_thread(remove_all, paths, trash), name="delete")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve_exception)

    async def drain(self) -> None:
        """Wait for background deletions to finish (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Stop: end the passes, cancel installs in flight, finish deletions."""
        self._closing = True
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in (self._periodic, self._sweeping, self._watcher, *tasks):
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in (self._periodic, self._sweeping, self._watcher, *tasks) if t is not None),
            return_exceptions=True,
        )
        self._periodic = None
        await self.drain()
        # this agent's own folders, empty now (a crash leaves them to whoever reaps it)
        await asyncio.to_thread(remove_all, [self._db.staging, self._db.trash], False)

    # -- views -----------------------------------------------------------------------------
    def installs_in_flight(self) -> int:
        """Installs running or queued (and references being taken)."""
        return sum(1 for e in self._entries.values() if e.state is UriState.INSTALLING)

    def entries(self) -> Iterator[UriEntry]:
        return iter(self._entries.values())

    def entry(self, key: UriKey) -> UriEntry | None:
        return self._entries.get(key)

    def is_unused(self, key: UriKey) -> bool:
        """Ready, and used by no env of this agent (other agents of the root may use it)."""
        entry = self._entries.get(key)
        return entry is not None and entry.state is UriState.READY and not entry.held

    def stats(self) -> StoreStats:
        """The root's bytes in use (by any of its agents) and unused, as of the last pass
        (this agent's own changes all counted after ``caught_up()``); this agent's counters."""
        ready, unused = self._root_bytes
        return StoreStats(
            used_bytes=ready - unused,
            unused_bytes=unused,
            budget_bytes=self.budget_bytes,
            downloads=self.downloads,
            extractions=self.extractions,
            evictions=self.evictions,
            hits=self.hits,
        )

    def check_invariants(self) -> None:
        for key, entry in self._entries.items():
            if entry.state is UriState.READY:
                assert entry.held == (self._refcount(key) > 0), f"S1: {key} held={entry.held}"
                if entry.held:
                    assert entry.path.is_dir(), f"S3: {entry.path} missing"
            else:
                assert entry.task is not None, f"S2: {key} installing without a task"
                assert not entry.task.done(), f"S2: {key} installing with a finished task"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _release_stamp(self) -> int:
        """The last use noted at a release: the clock's millisecond, but always after this
        agent's previous release, so the index's LRU order (by last use) is this agent's
        release order even for releases within one millisecond."""
        self._last_release_ms = max(self._now_ms(), self._last_release_ms + 1)
        return self._last_release_ms


def _place_and_clear(trash: Path, unpacked: Path, final: Path, staging: Path) -> Path | None:
    """``place_package``, then the staging folder removed (its download and anything else the
    installer left: the package is out of it). Blocking: one thread hop."""
    leftover = place_package(trash, unpacked, final)
    remove_tree(staging)
    return leftover


def _retrieve_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("%s ended with %s: %s", task.get_name(), type(exc).__name__, exc)


def _disk_full(label: str) -> str:
    return (
        f"{label}: no space left on the agent's disk during the install (its partial files are "
        "removed); free space, or lower cache-budget"
    )
