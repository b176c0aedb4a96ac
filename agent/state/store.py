"""The URI store: packages on disk, one install per URI at a time, LRU eviction under a budget.

Layout under the root::

    uris/<kind>-<hash>/   a complete package: it exists whole or not at all
    tmp/<random>/         staging: the download and the extraction, then one rename into uris/
    trash/<random>/       evicted packages, deleted in a thread

Lifecycle of one (kind, URI) key::

    absent --ensure--> INSTALLING --ok--> READY --(count 0)--> unused --evict--> absent
                           |                                    (READY, in the LRU)
                           +--error--> absent (every waiter gets the error; the next ensure retries)

The store does not count references: it asks ``refcount`` (the reference tables) and is told by
the service when a key is acquired (count 0 -> 1) or released (count 1 -> 0). Which unused keys
go, and in which order, is the LRU ledger's decision (``agent.core.ledger``); whether an install
fits over the disk floor is the disk room's (``agent.state.room``). The store keeps the rest:
single-flight installs, staging, the final rename and the commit, applying evictions (the trash,
the index, the log, the counters) and deleting in the background.

Every change of state happens on the event loop between awaits; eviction is a rename on the loop
(one metadata call), so a key is either in ``_entries`` with its directory or gone, and a new
install of an evicted key can start at once. Blocking work (copy, hash, unzip, rmtree) runs in
threads.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from agent.core.errors import DiskExhausted
from agent.core.ledger import Ledger
from agent.core.packages import Package
from agent.core.uris import UriKey, UriKind
from agent.crash import crash_point
from agent.install.archive import make_dir
from agent.install.disk import (
    DiskFloor,
    move_to_trash,
    package_dir,
    remove_all,
)
from agent.install.installers import Installer, InstallJob
from agent.install.staging import place_package, prepare_staging, through
from agent.state.room import Claim, DiskRoom
from agent.state.state_db import StateDB, UriRow

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class UriState(Enum):
    INSTALLING = "installing"
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
    """Invariants (``check_invariants``; it checks the ledger's own, L1, L2 and L4, too):
      S1. a key is unused in the ledger iff its entry is READY and ``refcount(key) == 0``.
      S2. the ledger's size of an unused key is its entry's size, so the ledger's unused bytes
          (L1) are those of the unused packages on disk.
      S3. after ``release`` and after an install completes, the unused bytes fit the budget: the
          store enforces the budget then and removes what the ledger evicts (L3).
      S4. a READY entry's directory exists; an INSTALLING entry has a running task.
    A key with references, or INSTALLING, is never evicted: only the ledger's unused keys are.
    """

    def __init__(
        self,
        root: Path,
        installers: Mapping[UriKind, Installer],
        *,
        db: StateDB | None,
        refcount: Callable[[UriKey], int],
        budget_bytes: int,
        disk_floor: DiskFloor | None = None,
        install_slots: int = 8,
        on_install: Callable[[bool, int, float], None] | None = None,
        clock: Clock = time.time,
    ) -> None:
        """``installers``: how each kind is made, one per kind (``build_installers``: the
        store only knows that a package is made in a staging folder, never how)."""
        self.root = root
        self._db = db
        self._refcount = refcount
        self._install_slots = asyncio.Semaphore(install_slots)  # more installs wait here
        self._on_install = on_install
        self._installers = dict(installers)
        self._clock = clock
        self._entries: dict[UriKey, UriEntry] = {}
        self._ledger: Ledger[UriKey] = Ledger(budget_bytes)  # S1-S3: the unused keys
        self._room = DiskRoom(root, disk_floor, self._evict_for)  # the floor, installs' claims
        self._background: set[asyncio.Task[None]] = set()
        self.downloads = 0
        self.extractions = 0
        self.evictions = 0
        self.hits = 0
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        for sub in ("uris", "tmp", "trash"):
            make_dir(root / sub)  # 0755 whatever the umask; loose modes of an earlier run fixed

    def adopt(self, key: UriKey, size: int, last_used_ms: int) -> None:
        """Recovery: a package the index vouches for and the disk holds. Nothing references it
        yet, so it is unused; adopt in least-recently-used order."""
        assert key not in self._entries, key
        entry = UriEntry(key, self.path_for(key), UriState.READY, size, last_used_ms)
        self._entries[key] = entry
        self._ledger.release(key, size)

    @property
    def budget_bytes(self) -> int:
        """Bytes of unused packages kept; more are evicted, least recently used first."""
        return self._ledger.budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:  # enforced at the next release or install
        self._ledger.budget_bytes = value

    # -- paths -----------------------------------------------------------------------------
    def path_for(self, key: UriKey) -> Path:
        """Where a key's package lives once installed: a pure function of the key."""
        return package_dir(self.root, key)

    # -- installs --------------------------------------------------------------------------
    async def ensure(self, package: Package) -> Path:
        """Return the package's directory, installing it first if needed (single-flight), by
        the installer of its kind, from the recipe it carries.

        An install runs for as long as someone waits for it: cancelling one caller leaves it to
        the others; when the last one leaves (a cancelled create, a setup timeout), the install
        is cancelled too, its download stopped and its files removed.
        """
        key = package.key
        installer = self._installer_for(key.kind)
        installer.check(package, key.label)  # today's settings, even for a package cached before
        entry = self._entries.get(key)
        if entry is not None and entry.state is UriState.READY:
            self.hits += 1
            entry.last_used_ms = self._now_ms()
            return entry.path
        if entry is None:
            entry = UriEntry(key=key, path=self.path_for(key))
            entry.task = asyncio.create_task(
                self._install(entry, package, installer), name=f"install {key.label}"
            )
            entry.task.add_done_callback(_retrieve_exception)
            self._entries[key] = entry
        task = entry.task
        assert task is not None
        entry.waiters += 1
        try:
            await asyncio.shield(task)
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and not task.done():
                task.cancel()
        return entry.path

    def touch(self, keys: Iterable[UriKey]) -> None:
        """A create of a ready env used these keys: count the hits, refresh their last use.

        A hit is a key a create needed that was already installed (here or in ``ensure``)."""
        now = self._now_ms()
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self.hits += 1
                entry.last_used_ms = now

    def _installer_for(self, kind: UriKind) -> Installer:
        installer = self._installers.get(kind)
        if installer is None:  # the table is complete: a kind without an installer is a bug
            raise AssertionError(f"no installer for package kind {kind.value!r}")
        return installer

    async def _install(self, entry: UriEntry, package: Package, installer: Installer) -> None:
        """One install, from the queue to READY: a slot, a private staging folder, room on the
        disk, the kind's installer, the rename into place, the commit. On any failure (or
        cancellation) the entry is forgotten and the staging folder goes."""
        label = entry.key.label  # the URI cut once: every message and log line below names it
        staging = self.root / "tmp" / uuid.uuid4().hex
        started, fetched, queued, claim = time.monotonic(), 0, True, Claim()

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
            await self._place(installed.path, entry.path)
            crash_point("after_rename_before_commit")
            entry.size, entry.last_used_ms = installed.size, self._now_ms()
            await self._commit(entry)
        except BaseException as exc:
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
            self.delete_in_background([staging], trash=False)
        self._ready(entry, fetched, started)

    def _unpacked(self) -> None:
        self.extractions += 1

    def _forget(self, entry: UriEntry, fetched: int, started: float) -> None:
        """A failed or cancelled install: the key is absent again (the next ensure retries)."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        if self._on_install is not None:
            self._on_install(False, fetched, time.monotonic() - started)

    def _ready(self, entry: UriEntry, fetched: int, started: float) -> None:
        """The install is committed: READY, counted, logged, and unused at once if every create
        that wanted it went away meanwhile."""
        entry.state = UriState.READY
        entry.task = None
        seconds = time.monotonic() - started
        if self._on_install is not None:
            self._on_install(True, fetched, seconds)
        label, size = entry.key.label, entry.size
        log.info(
            "installed %s: %d bytes fetched, %d bytes unpacked, %.2fs", label, fetched, size,
            seconds, extra={"uri": label, "fetched_bytes": fetched, "unpacked_bytes": size,
                            "seconds": round(seconds, 3)},
        )  # fmt: skip
        if self._refcount(entry.key) == 0:
            self.release([entry.key])

    async def _place(self, unpacked: Path, final: Path) -> None:
        """Rename the package into place (``place_package``: one thread hop). The hop ends even
        if the install is cancelled meanwhile; a package it placed then goes again, as no
        commit will vouch for it (nothing in uris/ without an entry)."""
        step = asyncio.ensure_future(asyncio.to_thread(place_package, self.root, unpacked, final))
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
        """Make the install durable before anyone is told of it; undo the rename if that fails."""
        if self._db is None:
            return
        row = UriRow(
            entry.key.kind.value, entry.key.uri, entry.path.name, entry.size, entry.last_used_ms
        )  # fmt: skip
        try:
            await self._db.record_install(row)
        except BaseException:
            self.delete_in_background([self._to_trash(entry.path)])
            raise

    def note(self, keys: Iterable[UriKey]) -> None:
        """Note these keys' last use for the index, written behind (no I/O)."""
        if self._db is None:
            return
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and entry.state is UriState.READY:
                self._db.note_uri(key.kind.value, key.uri, entry.last_used_ms)

    # -- references ------------------------------------------------------------------------
    def acquire(self, keys: Iterable[UriKey]) -> None:
        """These keys' counts went from 0 to 1: they are in use, so no longer evictable."""
        for key in keys:
            self._ledger.use(key)

    def release(self, keys: Iterable[UriKey]) -> None:
        """These keys' counts reached 0: ready ones become unused; then enforce the budget."""
        now = self._now_ms()
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.state is not UriState.READY or self._ledger.is_unused(key):
                continue  # an install in flight joins the LRU when it completes
            entry.last_used_ms = now
            self._ledger.release(key, entry.size)
        self.enforce_budget()

    def enforce_budget(self) -> None:
        """Evict unused keys, least recently used first, until their bytes fit the budget."""
        trashed = self._evict(self._ledger.evict_over_budget())
        if trashed:
            self.delete_in_background(trashed)

    def _evict_for(self, needed: int) -> list[Path]:
        """The disk room lacks ``needed`` bytes: evict what the ledger says frees them (none if
        all the unused bytes would not); return the trashed paths, still to be deleted."""
        return self._evict(self._ledger.evict_for(needed))

    def _evict(self, keys: list[UriKey]) -> list[Path]:
        """Apply the ledger's evictions, in its order: forget each key, move its package to the
        trash, note the index, count and log. Return the trashed paths (still to be deleted)."""
        entries = [self._entries.pop(key) for key in keys]  # S1 holds before the first rename
        trashed = []
        for done, entry in enumerate(entries):
            key = entry.key
            try:
                trashed.append(self._to_trash(entry.path))
            except FileNotFoundError:  # removed by hand: gone already, forgotten all the same
                log.warning("evicting %s: its folder was gone already", key.label)
            except OSError:  # the rest are not evicted: back in the store, most recent first
                for rest in entries[done:]:
                    self._entries[rest.key] = rest
                    self._ledger.release(rest.key, rest.size)
                raise
            if self._db is not None:
                self._db.note_uri_dropped(key.kind.value, key.uri)  # behind: a row whose
                # directory is gone is dropped by recovery, so the order of the two is safe
            self.evictions += 1
            log.info(
                "evicted %s (%d bytes, unused)", key.label, entry.size,
                extra={"uri": key.label, "bytes": entry.size},
            )  # fmt: skip
        return trashed

    def _to_trash(self, path: Path) -> Path:
        return move_to_trash(self.root, path)

    def delete_in_background(self, paths: list[Path], *, trash: bool = True) -> None:
        """Delete ``paths`` in a thread. ``trash``: evicted packages (a crash point for tests);
        otherwise staging left by an install."""
        task = asyncio.create_task(asyncio.to_thread(remove_all, paths, trash), name="delete")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_retrieve_exception)

    async def drain(self) -> None:
        """Wait for background deletions to finish (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def close(self) -> None:
        """Stop: cancel installs in flight, finish deletions."""
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.drain()

    # -- views -----------------------------------------------------------------------------
    def installs_in_flight(self) -> int:
        """Installs running or queued."""
        return sum(1 for e in self._entries.values() if e.state is UriState.INSTALLING)

    def entries(self) -> Iterator[UriEntry]:
        return iter(self._entries.values())

    def entry(self, key: UriKey) -> UriEntry | None:
        return self._entries.get(key)

    def is_unused(self, key: UriKey) -> bool:
        return self._ledger.is_unused(key)

    def stats(self) -> StoreStats:
        ready = sum(e.size for e in self._entries.values() if e.state is UriState.READY)
        unused = self._ledger.unused_bytes
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
            should_be_unused = entry.state is UriState.READY and self._refcount(key) == 0
            assert self._ledger.is_unused(key) == should_be_unused, f"S1: {key} {entry.state}"
            size = self._ledger.size_of(key)
            assert size in (None, entry.size), f"S2: {key} is {entry.size} bytes, not {size}"
            if entry.state is UriState.READY:
                assert entry.path.is_dir(), f"S4: {entry.path} missing"
            else:
                assert entry.task is not None, f"S4: {key} installing without a task"
                assert not entry.task.done(), f"S4: {key} installing with a finished task"
        assert set(self._ledger) <= set(self._entries), "S1: unused key without an entry"
        self._ledger.check_invariants()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _retrieve_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("%s ended with %s: %s", task.get_name(), type(exc).__name__, exc)


def _disk_full(label: str) -> str:
    return (
        f"{label}: no space left on the agent's disk during the install (its partial files are "
        "removed); free space, or lower cache-budget"
    )
