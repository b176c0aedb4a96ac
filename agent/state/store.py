"""The URI store: packages on disk, one install per URI at a time across every agent of the
root, eviction of what no agent uses under one budget.

Layout under the root (``state_db``, ``holders``)::

    uris/<kind>-<hash>/   a complete package: it exists whole or not at all
    tmp/<holder>/<random>/  this agent's staging: download, extraction, one rename into uris/
    trash/<holder>/<random>/  packages this agent evicted, deleted in a thread

A package's life in this agent runs from the ``ensure`` that starts it (single-flight, here
and across the root) to the ``release`` that hands its reference back. The lifecycle of one key
is in ``entries``; its way in (its reference taken, then a hit, this agent's install under its
claim, or a peer's awaited: ``peer_watch``) is ``installing``'s, placed and committed by
``placing``; passes over the index (the evictions, and how this view follows the root) are
``passes``; a released package's folder is measured again (what its users wrote there counted)
by ``remeasure``; what is evicted or left over is deleted by ``deletions``.

*Held*: this agent's reference to the package is committed in the index (``index`` R1), so no
agent of the root evicts it. The store does not count references: it asks ``refcount`` (the
reference tables) and is told by the service when a key is released (count 1 -> 0); a key whose
count went 0 -> 1 is taken again by ``ensure`` (one transaction), so a create may use it only
once it is held. A create of an env that is ready (the hot path) touches none of this.

Blocking work (copy, hash, unzip, rmtree, SQLite) runs in threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path

from agent.core.packages import Package
from agent.core.uris import UriKey, UriKind
from agent.install.disk.modes import make_dir
from agent.install.disk.root import (
    DiskFloor,
    package_dir,
    remove_all,
)
from agent.install.installers import Installer
from agent.install.venvs.wheel_cache import WheelCache
from agent.plant import planted
from agent.state import ray_folders
from agent.state.builds import Builds
from agent.state.deletions import Deletions
from agent.state.entries import StoreStats, UriEntry, UriState
from agent.state.installing import Installing
from agent.state.passes import PASS_WINDOW_S, Passes, retrieve_exception
from agent.state.peer_watch import PeerWatch
from agent.state.remeasure import Remeasure
from agent.state.room import DiskRoom
from agent.state.state_db import StateDB

log = logging.getLogger(__name__)
STOP_MEASURE_S = 10.0  # at stop, for the re-measures of what this agent still held

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


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
        self._installers = dict(installers)
        self._clock = clock
        self._entries: dict[UriKey, UriEntry] = {}
        self.deletions = Deletions()  # in threads
        self.pass_loop = Passes(
            db,
            self._entries,
            adopt=self.adopt,
            delete=self.delete_in_background,
            budget_bytes=budget_bytes,
            wheel_cache=wheel_cache,
            sleep=sleep,
            interval_s=sweep_interval_s,
            window_s=pass_window_s,
        )
        room = DiskRoom(root, disk_floor, self.pass_loop.evict_for)  # the floor, claims
        self._peers = PeerWatch(db, sleep)
        self.installing = Installing(
            db,
            room,
            self._peers,
            self.pass_loop,
            self.delete_in_background,
            self._now_ms,
            entries=self._entries,
            refcount=refcount,
            release=self.release,
            on_install=on_install,
            install_slots=install_slots,
        )
        self.builds = Builds(self._entries, max_kept=install_slots, sleep=sleep)  # kept going
        self.remeasures = Remeasure(db, self._entries.get, after=self.pass_loop.ask)
        self._last_release_ms = 0  # strictly increasing over this agent's releases
        self._hits = 0  # of ensure and touch; those of an obtain are ``installing``'s
        self._ray_folders: ray_folders.RayFolders | None = None  # under Ray (``mirror_into``)
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for sub in ("uris", "tmp", "trash"):
            make_dir(root / sub)  # 0755 whatever the umask; loose modes of an earlier run fixed
        for own in (db.staging, db.trash):
            own.mkdir(mode=0o700, exist_ok=True)
        db.on_leftovers = self.delete_in_background  # what a cancelled transaction set aside

    @property
    def db(self) -> StateDB:
        """The root's index, this agent a holder of it."""
        return self._db

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
    def hits(self) -> int:
        """Keys a create needed that were installed already (here, or by any agent of the
        root)."""
        return self._hits + self.installing.hits

    @property
    def downloads(self) -> int:
        return self.installing.downloads

    @property
    def extractions(self) -> int:
        return self.installing.extractions

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
        is cancelled too, its download stopped and its files removed, unless it was kept going
        (``builds``: past a setup timeout), when it runs to its end for the next create. A
        create arriving while such an install ends (its commit may wait for the index) waits for
        that end, then uses the package if it was committed after all, or obtains it anew.
        """
        key = package.key
        installer = self._installer_for(key.kind)
        installer.check(package, key.label)  # today's settings, even for a package cached before
        entry = self._entries.get(key)
        while entry is not None and entry.abandoned:
            await self._outlive(entry)
            entry = self._entries.get(key)
        if entry is not None:
            entry.used_here = True  # under Ray, its Ray folder shows it (``ray_folders``)
        if entry is not None and entry.state is UriState.READY and entry.held:
            self._hits += 1
            entry.last_used_ms = self._now_ms()
            if planted("drop_ref_early"):  # the chaos oracle's proof: R1 broken on purpose
                self._db.notes.note_ref_dropped(key.kind.value, key.uri)
            return entry.path
        if (
            entry is not None
            and entry.state is UriState.READY
            and entry.dropping
            and self._db.notes.keep_ref(key.kind.value, key.uri)
        ):
            # released moments ago, its reference still in the index (the drop only noted):
            # held again as it was, without a transaction (R1 holds: committed before)
            entry.held, entry.dropping = True, False
            self._hits += 1
            entry.last_used_ms = self._now_ms()
            return entry.path
        if entry is None or entry.state is UriState.READY:
            if entry is None:
                entry = UriEntry(key=key, path=self.path_for(key), used_here=True)
                self._entries[key] = entry
            else:  # ready, not held: taken again. If that fails, the next pass reads every
                entry.was_ready = True  # ready package (the change log would not bring it back)
            entry.state = UriState.INSTALLING
            entry.task = asyncio.create_task(
                self.installing.run(entry, package, installer), name=f"install {key.label}"
            )
            entry.task.add_done_callback(retrieve_exception)
        task = entry.task
        assert task is not None
        entry.waiters += 1
        try:
            await asyncio.shield(task)
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and not task.done() and not self.builds.left(entry):
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
                self._hits += 1
                entry.last_used_ms = now
                if note:
                    self._db.notes.note_uri(key.kind.value, key.uri, now)

    def _installer_for(self, kind: UriKind) -> Installer:
        installer = self._installers.get(kind)
        if installer is None:  # the table is complete: a kind without an installer is a bug
            raise AssertionError(f"no installer for package kind {kind.value!r}")
        return installer

    def note(self, keys: Iterable[UriKey]) -> None:
        """Note these keys' last use for the index, written behind (no I/O)."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self._db.notes.note_uri(key.kind.value, key.uri, entry.last_used_ms)

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
            self._db.notes.note_ref_dropped(key.kind.value, key.uri)
            if entry is None:
                continue
            entry.dropping = entry.held  # the drop noted is of a reference committed before
            entry.held = False
            entry.last_used_ms = now
            self._db.notes.note_uri(key.kind.value, key.uri, now)
            self.remeasures.ask(key)  # what its users wrote in its folder, counted
        self.pass_loop.ask()

    # -- passes and deletions ----------------------------------------------------------------
    def start(self) -> None:
        """Begin the periodic passes (after recovery) and the builds' progress lines."""
        self.pass_loop.start()
        self.builds.start()

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
        """From now on, after each pass, Ray's folders under ``base`` (its ``runtime_resources``)
        show each ready package this agent's envs used (``ray_folders``: a tree of hard links,
        or a link for a venv), and none the root no longer has; until the store's close."""
        caps = self.pass_loop.kind_budgets  # Ray's cache sizes, set before
        self._ray_folders = ray_folders.RayFolders(base, self._entries, caps)
        self.pass_loop.after_pass = self._ray_folders.sync
        self.pass_loop.ask()  # Ray's folders made at once, even empty

    async def settle(self) -> None:
        """Wait until no pass runs or is asked for and background deletions are done (tests,
        recovery, shutdown)."""
        for _ in range(1000):
            task = self.pass_loop.running
            measuring = self.remeasures.tasks()
            if task is None and not self.deletions.tasks() and not measuring:
                return
            if measuring:  # each asks for a pass when done
                await asyncio.wait(measuring)
            task = self.pass_loop.running
            if task is not None:
                self.pass_loop.hurry()
                await asyncio.wait([task])
            await self.deletions.wait()
        raise AssertionError("the store did not settle after 1000 rounds")

    def delete_in_background(self, paths: list[Path], *, trash: bool = True) -> None:
        """Delete ``paths`` in a thread (``Deletions.delete``)."""
        self.deletions.delete(paths, trash=trash)

    async def drain(self) -> None:
        """Wait for background deletions to finish (tests, shutdown)."""
        await self.deletions.drain()

    async def close(self) -> None:
        """Stop: end the passes, cancel installs in flight, finish deletions. The packages this
        agent still holds lose its references as it stops (a raylet ended, its envs never
        deleted): each is measured again first, as at a release, within ``STOP_MEASURE_S``."""
        for key, entry in self._entries.items():
            if entry.held and entry.state is UriState.READY:
                self.remeasures.ask(key)
        await self.remeasures.close(grace_s=STOP_MEASURE_S)
        passes = [*self.pass_loop.halt(), *filter(None, [self.builds.halt()])]
        installs = [e.task for e in self._entries.values() if e.task is not None]
        reader = self._peers.task()
        tasks = [*passes, *([reader] if reader is not None else []), *installs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._ray_folders is not None:  # left, its trees would keep evicted packages' bytes
            await self._ray_folders.clear()
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
