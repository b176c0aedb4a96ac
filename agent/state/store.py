"""The URI store: packages on disk, one install per URI at a time across every agent of the
root, eviction of what no agent uses under one budget.

Layout under the root (``state_db``, ``holders``)::

    uris/<kind>-<hash>/   a complete package: it exists whole or not at all
    tmp/<holder>/<random>/  this agent's staging: download, extraction, one rename into uris/
    trash/<holder>/<random>/  packages this agent evicted, deleted in a thread

The lifecycle of one key is in ``entries``; peers' installs are waited on through
``peer_watch``; an install is placed and committed by ``placing``; passes over the index (the
evictions, and how this view follows the root) are ``passes``; a released package's folder is
measured again (what its users wrote there counted) by ``remeasure``.

One concept: a package's life in this agent, from the ``ensure`` that obtains it (single-flight,
here and across the root: a hit, this agent's install under its claim, or a peer's awaited) to
the ``release`` that hands its reference back. The steps of an install share one entry, its
waiters and its cancellation, and stay together so that what each step gives back on a failure
is read in one place; the rest of the store's work lives in the modules above.

*Held*: this agent's reference to the package is committed in the index (``index`` R1), so no
agent of the root evicts it. The store does not count references: it asks ``refcount`` (the
reference tables) and is told by the service when a key is released (count 1 -> 0); a key whose
count went 0 -> 1 is taken again by ``ensure`` (one transaction), so a create may use it only
once it is held. A create of an env that is ready (the hot path) touches none of this.

Blocking work (copy, hash, unzip, rmtree, SQLite) runs in threads.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path

from agent.core.errors import DiskExhausted
from agent.core.packages import Package
from agent.core.uris import UriKey, UriKind
from agent.crash import crash_point
from agent.install.disk.modes import make_dir
from agent.install.disk.root import (
    DiskFloor,
    package_dir,
    remove_all,
)
from agent.install.disk.staging import prepare_staging, through
from agent.install.installers import Installer, InstallJob
from agent.install.venvs.wheel_cache import WheelCache
from agent.state import ray_folders
from agent.state.entries import StoreStats, UriEntry, UriState
from agent.state.index import Found
from agent.state.passes import PASS_WINDOW_S, Passes, retrieve_exception
from agent.state.peer_watch import PeerWatch
from agent.state.placing import commit, place
from agent.state.remeasure import Remeasure
from agent.state.room import Claim, DiskRoom
from agent.state.state_db import StateDB

log = logging.getLogger(__name__)
STOP_MEASURE_S = 10.0  # at stop, for the re-measures of what this agent still held

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_WAIT_FIRST_S, _WAIT_MAX_S = 0.01, 0.25  # polling a peer's install: doubling, capped (the
# peer watch wakes a waiter as soon as the install ends: the cap is how soon a dead peer's
# claim is found)


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
        ``agent.install.venvs.wheel_cache``)."""
        self.root = root
        self._db = db
        self._refcount = refcount
        self._install_slots = asyncio.Semaphore(install_slots)  # more installs wait here
        self._on_install = on_install
        self._installers = dict(installers)
        self._clock = clock
        self._entries: dict[UriKey, UriEntry] = {}
        self._background: set[asyncio.Task[None]] = set()  # deletions in threads
        self.pass_loop = Passes(
            db, self._entries, adopt=self.adopt, delete=self.delete_in_background,
            budget_bytes=budget_bytes, wheel_cache=wheel_cache, sleep=sleep,
            interval_s=sweep_interval_s, window_s=pass_window_s,
        )  # fmt: skip
        self._room = DiskRoom(root, disk_floor, self.pass_loop.evict_for)  # the floor, claims
        self._peers = PeerWatch(db, sleep)
        self.remeasures = Remeasure(db, self._entries.get, after=self.pass_loop.ask)
        self._last_release_ms = 0  # strictly increasing over this agent's releases
        self.downloads = 0
        self.extractions = 0
        self.hits = 0
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for sub in ("uris", "tmp", "trash"):
            make_dir(root / sub)  # 0755 whatever the umask; loose modes of an earlier run fixed
        for own in (db.staging, db.trash):
            own.mkdir(mode=0o700, exist_ok=True)
        db.on_leftovers = self.delete_in_background  # what a cancelled transaction set aside

    @property
    def budget_bytes(self) -> int:
        """The root's unused bytes kept; enforced by the passes."""
        return self.pass_loop.budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self.pass_loop.budget_bytes = value

    @property
    def wheel_cache(self) -> WheelCache | None:
        return self.pass_loop.wheel_cache

    @property
    def passes(self) -> int:
        """Passes over the index run by this agent."""
        return self.pass_loop.count

    @property
    def evictions(self) -> int:
        return self.pass_loop.evictions

    def adopt(self, key: UriKey, size: int, last_used_ms: int) -> None:
        """A package the index vouches for and the disk holds, not used by this agent."""
        if key in self._entries:
            return
        entry = UriEntry(key, self.path_for(key), UriState.READY, size, last_used_ms)
        self._entries[key] = entry

    # -- paths -----------------------------------------------------------------------------
    def scratch_folder(self) -> Path:
        """A new folder's name in this agent's own staging area (not made): a create's scratch
        (a uv run project planned there), removed by its caller; what a crash leaves there goes
        with the staging at the next start."""
        return self._db.staging / f"plan-{uuid.uuid4().hex}"

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
            entry.task.add_done_callback(retrieve_exception)
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
                row = await self._peers.wait(row_key, delay)
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
            await place(
                self._db.trash, installed.path, entry.path, staging, self.delete_in_background
            )
            cleared = True  # what the install left in its staging went in the same hop
            crash_point("after_rename_before_commit")
            entry.size, entry.last_used_ms = installed.size, self._now_ms()
            await commit(self._db, entry, self.delete_in_background)
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
                self.pass_loop.lost()
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
        self.pass_loop.ask()  # the root's figures (and its budget, after an install)
        if self._refcount(entry.key) == 0:
            self.release([entry.key])

    def note(self, keys: Iterable[UriKey]) -> None:
        """Note these keys' last use for the index, written behind (no I/O)."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self._db.note_uri(key.kind.value, key.uri, entry.last_used_ms)

    # -- references ------------------------------------------------------------------------
    def release(self, keys: Iterable[UriKey]) -> None:
        """These keys' counts reached 0: their references in the index go (behind), their
        folders are measured again (``remeasure``: what workers wrote there counted), and a
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
            self.remeasures.ask(key)  # what its users wrote in its folder, counted
        self.pass_loop.ask()

    # -- passes and deletions ----------------------------------------------------------------
    def start(self) -> None:
        """Begin the periodic passes (after recovery)."""
        self.pass_loop.start()

    async def enforce_budget(self) -> None:
        """Run a pass now (after any running) and wait for it: the budget holds after it."""
        self.pass_loop.ask()
        await self.settle()

    async def caught_up(self, timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) for the pass running or asked for, so ``stats()``
        counts every change this agent made before the call (other agents' as of that pass).
        A pass that runs longer (a busy index) leaves the figures of the one before."""
        await self.pass_loop.caught_up(timeout_s)

    def mirror_into(self, base: Path) -> None:
        """From now on, after each pass, ``base`` (Ray's ``runtime_resources``) shows each ready
        package in its kind's Ray folder (``ray_folders``: a tree of hard links, or a link for
        a venv), and no package of this agent's that is not ready."""
        folders = ray_folders.Mirror(base)

        async def mirror() -> None:
            ready = [
                (key.kind, entry.path)
                for key, entry in self._entries.items()
                if entry.state is UriState.READY
            ]
            await asyncio.to_thread(folders.sync, ray_folders.plan(ready))

        self.pass_loop.after_pass = mirror
        self.pass_loop.ask()  # Ray's folders made at once, even empty

    async def settle(self) -> None:
        """Wait until no pass runs or is asked for and background deletions are done (tests,
        recovery, shutdown)."""
        for _ in range(1000):
            task = self.pass_loop.running
            measuring = self.remeasures.tasks()
            if task is None and not self._background and not measuring:
                return
            if measuring:  # each asks for a pass when done
                await asyncio.wait(measuring)
            task = self.pass_loop.running
            if task is not None:
                self.pass_loop.hurry()
                await asyncio.wait([task])
            if self._background:
                await asyncio.gather(*self._background, return_exceptions=True)
        raise AssertionError("the store did not settle after 1000 rounds")

    def delete_in_background(self, paths: list[Path], *, trash: bool = True) -> None:
        """Delete ``paths`` in a thread. ``trash``: evicted packages (a crash point for tests);
        otherwise staging left by an install."""
        if not paths:
            return
        task = asyncio.create_task(asyncio.to_thread(remove_all, paths, trash), name="delete")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(retrieve_exception)

    async def drain(self) -> None:
        """Wait for background deletions to finish (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Stop: end the passes, cancel installs in flight, finish deletions. The packages this
        agent still holds lose its references as it stops (a raylet ended, its envs never
        deleted): each is measured again first, as at a release, within ``STOP_MEASURE_S``."""
        for key, entry in self._entries.items():
            if entry.held and entry.state is UriState.READY:
                self.remeasures.ask(key)
        await self.remeasures.close(grace_s=STOP_MEASURE_S)
        passes = self.pass_loop.halt()
        installs = [e.task for e in self._entries.values() if e.task is not None]
        reader = self._peers.task()
        tasks = [*passes, *([reader] if reader is not None else []), *installs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        ready, unused = self.pass_loop.root_bytes
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


def _disk_full(label: str) -> str:
    return (
        f"{label}: no space left on the agent's disk during the install (its partial files are "
        "removed); free space, or lower cache-budget"
    )
