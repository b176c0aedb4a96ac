"""A package's way into this agent once ``ensure`` started it: its reference taken in the index,
then the package used if it is ready, or installed under this agent's claim, or a peer's
install waited for (``peer_watch``).

One install under this agent's claim (``index`` R3) runs from the queue to the commit: a slot
among the agent's install slots, a private staging folder, room on the disk (``room``), the
kind's installer, the rename into place and the commit (``placing``). The store decides when one
runs (``store``: its obtain found the package claimed for this agent) and what its entry becomes
after: ready, or forgotten, told through ``ready`` and ``forget``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.core.errors import DiskExhausted
from agent.core.packages import Package
from agent.core.uris import UriKey
from agent.crash import crash_point
from agent.install.disk.staging import prepare_staging, through
from agent.install.installers import Installer, InstallJob
from agent.state.entries import UriEntry, UriState
from agent.state.index import Found
from agent.state.passes import Passes
from agent.state.peer_watch import PeerWatch
from agent.state.placing import commit, place
from agent.state.room import Claim, DiskRoom
from agent.state.state_db import StateDB

log = logging.getLogger(__name__)

Told = Callable[[int | None], None]  # its end, told with the bytes fetched (None: no install)

_WAIT_FIRST_S, _WAIT_MAX_S = 0.01, 0.25  # polling a peer's install: doubling, capped (the
# peer watch wakes a waiter as soon as the install ends: the cap is how soon a dead peer's
# claim is found)


class Delete(Protocol):
    """The store's deletion in the background: evicted packages (``trash``) or staging."""

    def __call__(self, paths: list[Path], *, trash: bool = True) -> None: ...


class Installing:
    """This agent's installs under its claims, ``install_slots`` at a time (more wait), each
    staged in the holder's staging folder, with room made on the disk first."""

    def __init__(
        self,
        db: StateDB,
        room: DiskRoom,
        peers: PeerWatch,
        passes: Passes,
        delete: Delete,
        now_ms: Callable[[], int],
        *,
        entries: dict[UriKey, UriEntry],
        refcount: Callable[[UriKey], int],
        release: Callable[[list[UriKey]], None],
        on_install: Callable[[bool, int, float], None] | None,
        install_slots: int,
    ) -> None:
        """``entries``: the store's, shared; ``release``: the store's, for a package every
        create that wanted it left meanwhile; ``on_install``: told of each install's outcome,
        its bytes fetched and its seconds."""
        self._db = db
        self._room = room  # the floor, and the claims of the installs in flight on it
        self._peers = peers
        self._passes = passes
        self._entries = entries
        self._refcount = refcount
        self._release = release
        self._on_install = on_install
        self._delete = delete
        self._now_ms = now_ms
        self._slots = asyncio.Semaphore(install_slots)  # more installs wait here
        self.hits = 0  # packages found installed, by this agent or a peer
        self.downloads = 0
        self.extractions = 0

    async def run(self, entry: UriEntry, package: Package, installer: Installer) -> None:
        """Take the reference in the index, then use the package if it is ready, install it
        under this agent's claim, or wait for the peer installing it (polling, doubling up to
        ``_WAIT_MAX_S``, for as long as someone waits here). On any failure (or cancellation)
        the entry is forgotten, and the claim and the reference, if nobody counts it, given
        back behind."""
        key = entry.key
        row_key = (key.kind.value, key.uri)
        started, delay = time.monotonic(), _WAIT_FIRST_S
        ready: Told = functools.partial(self._ready, entry, started=started)
        forget: Told = functools.partial(self._forget, entry, started=started)
        try:
            while True:
                obtained = await self._db.obtain(row_key, entry.path.name, take_ref=True)
                self._delete(obtained.reaped.aside)
                if obtained.found is Found.READY:
                    assert obtained.row is not None
                    entry.size, entry.last_used_ms = obtained.row.size, self._now_ms()
                    self.hits += 1
                    ready(None)
                    return
                if obtained.found is Found.CLAIMED:
                    break
                row = await self._peers.wait(row_key, delay)
                if row is not None and row.dir == entry.path.name and entry.path.is_dir():
                    # the peer's install is ready, and this agent's reference was committed by
                    # the obtain that found it in flight (R1): used without another transaction
                    entry.size, entry.last_used_ms = row.size, self._now_ms()
                    self.hits += 1
                    ready(None)
                    return
                delay = min(delay * 2, _WAIT_MAX_S)
        except BaseException:
            forget(None)
            raise
        await self._install(entry, package, installer, ready, forget)

    async def _install(
        self, entry: UriEntry, package: Package, installer: Installer, ready: Told, forget: Told
    ) -> None:
        """One install under this agent's claim, from the queue to READY: a slot, a private
        staging folder, room on the disk, the kind's installer, the rename into place, the
        commit, then ``ready``. On any failure (or cancellation) the entry is forgotten
        (``forget``) and the staging folder goes."""
        label = entry.key.label  # the URI cut once: every message and log line below names it
        staging = self._db.staging / uuid.uuid4().hex
        fetched, queued, claim, cleared = 0, True, Claim(), False

        def downloaded(size: int) -> None:
            nonlocal fetched
            fetched = size
            self.downloads += 1

        try:
            await self._slots.acquire()  # a queue, not a failure
            queued = False
            self._room.claims.add(claim)
            prepare = asyncio.to_thread(prepare_staging, staging, installer.prepare)
            await through(asyncio.ensure_future(prepare))
            log.info("installing %s", label, extra={"uri": label})
            await self._room.make_room(0, label, claim)
            space = self._room.space(claim, label)
            build = self._room.build(claim, label)
            job = InstallJob(staging, entry.path, label, space, downloaded, self._unpacked, build)
            installed = await installer.install(package, job)
            crash_point("after_extract")
            await place(self._db.trash, installed.path, entry.path, staging, self._delete)
            cleared = True  # what the install left in its staging went in the same hop
            crash_point("after_rename_before_commit")
            entry.size, entry.last_used_ms = installed.size, self._now_ms()
            await commit(self._db, entry, self._delete)
        except BaseException as exc:
            if entry.committed:  # cancelled after its commit: installed, for every agent; this
                entry.committed = False  # view knows it (no pass may come to adopt it), and its
                ready(fetched)  # reference goes if nobody counts it
                raise
            forget(fetched)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise DiskExhausted(_disk_full(label)) from exc
            raise
        finally:
            self._room.claims.discard(claim)
            if not queued:
                self._slots.release()
            # in the background: an await here could be cancelled between the commit and READY,
            # leaving the package installed on disk and "installing" for ever in the store
            if not cleared:
                self._delete([staging], trash=False)
        ready(fetched)

    def _unpacked(self) -> None:
        self.extractions += 1

    def _forget(self, entry: UriEntry, fetched: int | None, *, started: float) -> None:
        """A failed or cancelled obtain: the key is absent again (the next ensure retries); its
        claim, if it took one, and its reference, if nobody counts it, are given back behind."""
        key = entry.key
        if self._entries.get(key) is entry:
            del self._entries[key]
            if entry.was_ready:  # still ready in the index, maybe: a full read brings it back
                self._passes.lost()
        self._db.notes.note_claim_dropped(key.kind.value, key.uri)
        if self._refcount(key) == 0:
            self._db.notes.note_ref_dropped(key.kind.value, key.uri)
        if fetched is not None and self._on_install is not None:
            self._on_install(False, fetched, time.monotonic() - started)

    def _ready(self, entry: UriEntry, fetched: int | None, *, started: float) -> None:
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
                "installed %s: %d bytes fetched, %d bytes unpacked, %.2fs",
                label,
                fetched,
                size,
                seconds,
                extra={
                    "uri": label,
                    "fetched_bytes": fetched,
                    "unpacked_bytes": size,
                    "seconds": round(seconds, 3),
                },
            )
        self._passes.ask()  # the root's figures (and its budget, after an install)
        if self._refcount(entry.key) == 0:
            self._release([entry.key])


def _disk_full(label: str) -> str:
    return (
        f"{label}: no space left on the agent's disk during the install (its partial files are "
        "removed); free space, or lower cache-budget"
    )
