"""The store's logic without sockets: a real ``UriStore`` in tmp_path whose ``Fetcher`` talks to
a ``MockTransport`` serving in-memory zips, with an injected clock and a recorded sleep.

Pinned: single-flight (concurrent ensures send one request), a failure reaches every waiter and
the next ensure retries, cancelling the last waiter cancels the install and removes its staging
(and a create arriving while it ends is not cancelled with it), eviction order under the budget,
the view of the index kept whole across a pass in flight, retries of transient answers, and
which failures are final.
The store's invariants are checked after every step. The real-socket tiers (test_fetch.py,
test_stampede.py, test_hostile_fetch.py) stay: they pin aiohttp's side of the transport.

``MockPackages`` and ``make_store`` are the only places that know how the store is built and
called (``StoreRig.take`` / ``drop``), so a change of its constructor or of ``ensure``'s
argument is adapted there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import threading
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.core.errors import DownloadFailed, IndexUnavailable, PackageNotFound, PackageRejected
from agent.core.packages import Package
from agent.core.uris import UriKey, parse_uri
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.transport import Failure, Request, TransportError
from agent.state.entries import UriState
from agent.state.index import KindBudget
from agent.state.passes import PASS_WINDOW_S
from agent.state.state_db import StateDB
from agent.state.store import UriStore
from agent.state.sweeping import Swept
from tests.harness.in_process import listed
from tests.harness.polling import wait_until
from tests.harness.store_rig import (
    BASE,
    FILE_BYTES,
    LIMITS,
    Clock,
    MockPackages,
    RecordingSleep,
    key_of,
    make_store,
)


@dataclass
class StoreRig:
    """A store and what drives it: references counted here, as the service counts them."""

    store: UriStore
    packages: MockPackages
    sleep: RecordingSleep
    clock: Clock
    refs: Counter[UriKey] = field(default_factory=Counter)

    async def take(self, url: str) -> Path:
        """One reference on the package at ``url``, installed; given back if the install fails."""
        key = key_of(url)
        self.refs[key] += 1  # a count going 0 -> 1 is taken in the index by ensure
        try:
            return await self.store.ensure(Package(key, parse_uri("py_modules[0]", url)))
        except BaseException:
            self.drop(url)
            raise

    async def installed_unused(self, *names: str) -> list[str]:
        """Packages installed, then released in this order (the first the least recent), and
        the passes their releases asked for run."""
        urls = [self.packages.add(name) for name in names]
        for url in urls:
            await self.take(url)
            self.clock.tick()
            self.drop(url)
        await self.store.settle()
        return urls

    def drop(self, url: str) -> None:
        """Give one reference back; a count reaching 0 is released, and the pass that release
        asks for runs in the background (``store.settle()`` waits for it)."""
        key = key_of(url)
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.store.release([key])

    def installed(self, url: str) -> bool:
        entry = self.store.entry(key_of(url))
        return entry is not None and entry.state is UriState.READY and entry.path.is_dir()

    def installing(self, url: str) -> bool:
        entry = self.store.entry(key_of(url))
        return entry is not None and entry.state is UriState.INSTALLING

    def unused(self) -> set[str]:
        """The names of the installed packages nothing references."""
        return {n for n in self.packages.bodies if self.store.is_unused(key_of(BASE + n))}

    def listing(self, sub: str) -> list[str]:
        """For tmp/ and trash/: what is inside the agents' own folders there."""
        return listed(self.store.root, sub)

    def check(self) -> None:
        self.store.check_invariants()


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    budget_bytes: int = 10**9,
    limits: FetchLimits = LIMITS,
    pass_window_s: float = PASS_WINDOW_S,
    db_options: dict[str, Any] | None = None,
) -> AsyncIterator[StoreRig]:
    packages, sleep, clock = MockPackages(), RecordingSleep(), Clock()
    refs: Counter[UriKey] = Counter()
    root = tmp_path / "root"
    root.mkdir()
    db = StateDB(root / "state.db", **(db_options or {}))
    await db.open()  # this process a holder of the root
    try:
        store = make_store(
            root, packages.transport, db=db, refcount=lambda key: refs[key],
            budget_bytes=budget_bytes, limits=limits, sleep=sleep, clock=clock,
            pass_window_s=pass_window_s,
        )  # fmt: skip
        r = StoreRig(store, packages, sleep, clock, refs)
        try:
            yield r
        finally:
            packages.open_all()
            await store.close()
    finally:
        await db.close()
    assert packages.transport.open_streams == 0, "an answer's stream was left open"
    assert r.listing("tmp") == [], "staging left behind"
    assert sorted(p.name for p in (root / "tmp").iterdir()) == [], "own staging folder left"


# -- single-flight ------------------------------------------------------------------------------


async def test_concurrent_ensures_of_one_uri_send_one_request_and_share_one_directory(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        url = r.packages.add("a")
        gate = r.packages.hold("a")
        takes = [asyncio.create_task(r.take(url)) for _ in range(20)]
        await wait_until(lambda: r.packages.gets["a"] == 1, what="the GET")
        assert r.installing(url)
        r.check()
        gate.set()
        paths = await asyncio.wait_for(asyncio.gather(*takes), timeout=10)
        assert r.packages.gets["a"] == 1
        assert r.packages.transport.requests == [Request(url, {"Accept-Encoding": "identity"})]
        assert len(set(paths)) == 1
        assert (paths[0] / "a" / "__init__.py").is_file()
        assert r.store.stats().downloads == 1
        r.check()


async def test_an_ensure_of_an_installed_uri_sends_no_request(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        url = r.packages.add("a")
        first = await r.take(url)
        second = await r.take(url)
        assert first == second
        assert r.packages.gets["a"] == 1
        assert r.store.stats().hits == 1
        r.check()


# -- failures -----------------------------------------------------------------------------------


async def test_a_failed_download_gives_every_waiter_the_error_and_the_next_ensure_retries(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        url = r.packages.add("a", statuses=(404,))
        gate = r.packages.hold("a")
        takes = [asyncio.create_task(r.take(url)) for _ in range(5)]
        await wait_until(lambda: r.packages.gets["a"] == 1, what="the GET")
        r.check()
        gate.set()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*takes, return_exceptions=True), timeout=10
        )
        assert all(isinstance(o, PackageNotFound) for o in outcomes), outcomes
        assert r.packages.gets["a"] == 1
        assert not r.installing(url)
        assert not r.installed(url)
        assert r.refs == Counter()
        r.check()

        path = await r.take(url)  # the 404 is not remembered: this one asks again
        assert r.packages.gets["a"] == 2
        assert (path / "a" / "__init__.py").is_file()
        r.check()


async def test_a_404_is_package_not_found_without_a_retry(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        url = BASE + "missing"
        with pytest.raises(PackageNotFound) as failed:
            await r.take(url)
        assert failed.value.message == f"py_modules:{url}: the server answered 404"
        assert r.packages.gets["missing"] == 1
        assert r.sleep.delays == []
        await r.store.drain()
        assert r.listing("tmp") == []
        assert r.listing("uris") == []
        r.check()


async def test_a_503_is_retried_with_backoff_through_the_injected_sleep_then_installs(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        url = r.packages.add("a", statuses=(503, 503, 429))
        path = await r.take(url)
        assert r.packages.gets["a"] == 4
        assert r.sleep.delays == [0.5, 1.0, 1.5]
        assert (path / "a" / "__init__.py").is_file()
        r.check()


async def test_connection_errors_are_retried_then_download_failed_names_the_last(
    tmp_path: Path,
) -> None:
    limits = FetchLimits(attempts=3, backoff_initial_s=0.5, backoff_max_s=5.0)
    async with rig(tmp_path, limits=limits) as r:
        url = r.packages.add("a")
        r.packages.errors["a"] = [
            TransportError(Failure.CONNECTION, "Connection refused", name="ClientConnectorError")
            for _ in range(3)
        ]
        with pytest.raises(DownloadFailed) as failed:
            await r.take(url)
        assert failed.value.message == (
            f"py_modules:{url}: download failed after 3 attempts: "
            "ClientConnectorError: 'Connection refused'"
        )
        assert r.packages.gets["a"] == 3
        assert r.sleep.delays == [0.5, 1.0]
        r.check()


async def test_a_body_over_max_download_bytes_is_refused_as_it_arrives_not_read_to_its_end(
    tmp_path: Path,
) -> None:
    """No Content-Length: the limit counts the bytes that arrive, and the rest is never read."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(1000):
            sent += 1
            yield b"z" * 1024

    limits = FetchLimits(max_download_bytes=4096, chunk_bytes=1024)
    async with rig(tmp_path, limits=limits) as r:
        r.packages.streams["big"] = endless
        with pytest.raises(PackageRejected) as failed:
            await r.take(BASE + "big")
        assert failed.value.message == (
            f"py_modules:{BASE}big is larger than 4096 bytes; the limit is 4096 "
            "(max_download_bytes)"
        )
        assert sent == 5
        assert r.packages.gets["big"] == 1
        assert r.packages.transport.open_streams == 0
        r.check()


async def test_a_body_that_stops_is_cut_by_the_read_timeout_and_retried(tmp_path: Path) -> None:
    limits = FetchLimits(attempts=3, backoff_initial_s=0.5, read_timeout_s=0.05)
    async with rig(tmp_path, limits=limits) as r:
        url = r.packages.add("a")
        r.packages.stall("a")  # the first answer stops half-way; the retry gets it whole
        path = await asyncio.wait_for(r.take(url), timeout=10)
        assert r.packages.gets["a"] == 2
        assert r.sleep.delays == [0.5]
        assert (path / "a" / "__init__.py").is_file()
        r.check()


# -- cancellation -------------------------------------------------------------------------------


async def test_cancelling_the_last_waiter_cancels_the_install_and_removes_its_staging(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        url = r.packages.add("a")
        r.packages.stall("a")
        first = asyncio.create_task(r.take(url))
        second = asyncio.create_task(r.take(url))
        # the stream open and half the body written (package.zip itself is made empty with the
        # staging folder, before the download's GET: its being there is not a download)
        await wait_until(
            lambda: (
                r.packages.transport.open_streams == 1
                and any(
                    p.stat().st_size > 0 for p in (r.store.root / "tmp").glob("*/*/package.zip")
                )
            ),
            what="a partial download",
        )
        r.check()

        first.cancel()  # another waiter remains: the install goes on
        with pytest.raises(asyncio.CancelledError):
            await first
        assert r.installing(url)
        assert r.packages.transport.open_streams == 1
        r.check()

        second.cancel()  # the last one: the install is cancelled with it
        with pytest.raises(asyncio.CancelledError):
            await second
        await wait_until(lambda: r.store.entry(key_of(url)) is None, what="the install to end")
        await r.store.drain()
        assert r.listing("tmp") == []
        assert r.listing("uris") == []
        assert r.packages.transport.open_streams == 0
        assert r.refs == Counter()
        r.check()

        assert (await r.take(url)).is_dir()  # a new ensure starts a new install
        assert r.packages.gets["a"] == 2
        r.check()


@asynccontextmanager
async def cancelled_while_committing(r: StoreRig, name: str) -> AsyncIterator[asyncio.Task[Path]]:
    """A create of package ``name`` cancelled, as its only one, once its install is renamed
    into place and its commit waits for another agent's transaction; that transaction is rolled
    back (the commit goes through) when the block ends. Yields the cancelled create."""
    url = r.packages.add(name)
    gate = r.packages.hold(name)
    first = asyncio.create_task(r.take(url))
    await wait_until(lambda: r.packages.gets[name] == 1, what="the download to start")
    locker = sqlite3.connect(r.store.root / "state.db", isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")  # another agent's transaction: the commit waits
        gate.set()
        path = r.store.path_for(key_of(url))

        def committing() -> bool:  # renamed into place, its commit begun (it waits)
            tasks = asyncio.all_tasks()
            return path.is_dir() and any(t.get_name().startswith("commit ") for t in tasks)

        await wait_until(committing, what="the rename into place and the commit")
        first.cancel()  # delivered before the commit's end, which comes only after the rollback
        yield first
    finally:
        locker.rollback()
        locker.close()


async def test_a_create_joining_an_install_being_cancelled_gets_the_package_not_its_cancellation(
    tmp_path: Path,
) -> None:
    """An install cancelled as its last create left may take a while to end (here its commit
    waits for another agent's transaction): a create of the same package arriving meanwhile
    waits for it to end and then obtains the package itself, with its reference in the index."""
    async with rig(tmp_path) as r:
        url = BASE + "a"
        async with cancelled_while_committing(r, "a") as first:
            with pytest.raises(asyncio.CancelledError):
                await first
            assert r.installing(url), "the cancelled install ended at once: nothing to join"
            joined = asyncio.Event()

            async def second_create() -> Path:
                joined.set()  # take() runs to its first await in this same step
                return await r.take(url)

            second = asyncio.create_task(second_create())
            await joined.wait()
            assert r.installing(url)
        path = await asyncio.wait_for(second, 10)
        assert path.is_dir()
        assert r.packages.gets["a"] == 1, "the package the cancelled install committed is used"
        await r.store.settle()
        await r.store.db.notes.flush()
        with sqlite3.connect(r.store.root / "state.db") as conn:
            refs = conn.execute("SELECT uri FROM refs").fetchall()
        assert refs == [(url,)], "handed out without its reference in the index"
        r.check()
        r.drop(url)


async def test_an_install_cancelled_after_its_commit_is_ready_in_the_view_at_once(
    tmp_path: Path,
) -> None:
    """A create cancelled while its install commits: the commit goes through (it is waited for),
    so the package is the root's; the view has it READY and unused, its reference given back,
    at once (forgotten, it stayed out of the view and of info until some later pass; the agent
    state machine saw its folder on disk and not in info)."""
    async with rig(tmp_path) as r:
        url = BASE + "a"
        async with cancelled_while_committing(r, "a") as first:
            pass  # the only create left while the install committed
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(first, 10)
        await wait_until(lambda: not r.installing(url), what="the install to end")
        assert r.unused() == {"a"}, "installed on the root, unknown to this view"
        await r.store.settle()
        await r.store.db.notes.flush()
        with sqlite3.connect(r.store.root / "state.db") as conn:
            assert conn.execute("SELECT state FROM uris").fetchall() == [("ready",)]
            assert conn.execute("SELECT * FROM refs").fetchall() == []
        r.check()
        assert (await r.take(url)).is_dir()  # a hit: no download again
        assert r.packages.gets["a"] == 1
        r.drop(url)


# -- eviction -----------------------------------------------------------------------------------


async def test_releases_within_one_millisecond_keep_their_order_for_eviction(
    tmp_path: Path,
) -> None:
    """The index orders unused packages by their last use, in milliseconds: releases in one
    millisecond (a frozen clock here) still evict in release order, not by URI (CI saw the
    second-released package evicted before the first)."""
    async with rig(tmp_path, budget_bytes=2 * FILE_BYTES + FILE_BYTES // 2) as r:
        urls = {n: r.packages.add(n) for n in "cba"}
        for url in urls.values():
            await r.take(url)
        for n in "cba":  # released in an order that is not the URIs' order; the clock stands
            r.drop(urls[n])
        await r.store.settle()
        assert r.unused() == {"b", "a"}, "c, released first, is the least recently used"
        r.check()


async def test_unused_packages_are_evicted_least_recently_used_first_under_the_budget(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, budget_bytes=2 * FILE_BYTES + FILE_BYTES // 2) as r:
        a, b, c, d = (r.packages.add(n) for n in "abcd")
        for url in (a, b, c):
            await r.take(url)
        for url in (a, b):
            r.clock.tick()
            r.drop(url)
            r.check()
        await r.store.settle()
        assert r.unused() == {"a", "b"}
        assert r.store.stats().unused_bytes == 2 * FILE_BYTES

        r.clock.tick()
        r.drop(c)  # three unused do not fit: a, the least recently used, goes at the next pass
        r.check()
        await r.store.settle()
        r.check()
        assert r.unused() == {"b", "c"}
        assert not r.installed(a)
        assert r.store.stats().evictions == 1

        await r.take(b)  # b used again (a hit), then released: c is now the oldest
        r.clock.tick()
        r.drop(b)
        assert r.packages.gets["b"] == 1
        await r.take(d)
        r.clock.tick()
        r.drop(d)
        await r.store.settle()
        r.check()
        assert r.unused() == {"b", "d"}
        assert not r.installed(c)
        assert len(r.listing("uris")) == 2
        assert r.listing("trash") == []


async def test_a_package_in_use_is_never_evicted_even_over_the_budget(tmp_path: Path) -> None:
    async with rig(tmp_path, budget_bytes=0) as r:
        a = r.packages.add("a")
        await r.take(a)
        await r.store.enforce_budget()
        assert r.installed(a)
        assert r.unused() == set()
        r.check()
        r.drop(a)  # unused now, over a budget of 0: evicted by the pass its release asks for
        await r.store.settle()
        assert not r.installed(a)
        assert r.listing("uris") == []
        r.check()


async def test_an_eviction_whose_folder_was_removed_by_hand_forgets_it_and_evicts_the_rest(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        a, _, _ = await r.installed_unused("a", "b", "c")
        shutil.rmtree(r.store.path_for(key_of(a)))  # an operator's cleanup
        r.store.budget_bytes = 0
        await r.store.enforce_budget()
        r.check()
        assert r.unused() == set()
        assert r.store.stats().unused_bytes == 0
        assert r.store.stats().evictions == 3
        assert r.listing("uris") == []
        assert r.listing("trash") == []


async def test_an_eviction_that_cannot_rename_keeps_that_package_in_the_store_and_evicts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails (not a missing folder) keeps that package, its row and its folder,
    counted and evictable, not lost from view; the pass evicts the others, and a later pass
    whose rename works evicts it."""
    async with rig(tmp_path) as r:
        a, b, c = await r.installed_unused("a", "b", "c")
        refused = r.store.path_for(key_of(b))
        rename = os.rename

        def refuse_b(src: str | Path, dst: str | Path) -> None:
            if Path(src) == refused:
                raise PermissionError(13, "planted", str(src))
            rename(src, dst)

        monkeypatch.setattr("agent.state.reaping.os.rename", refuse_b)
        r.store.budget_bytes = 0
        await r.store.enforce_budget()
        r.check()
        assert not r.installed(a)
        assert r.installed(b)
        assert not r.installed(c)
        assert r.unused() == {"b"}
        assert r.store.stats().unused_bytes == FILE_BYTES
        assert r.listing("uris") == [refused.name]

        monkeypatch.undo()
        await r.store.enforce_budget()
        assert r.unused() == set()
        assert r.listing("uris") == []
        r.check()


async def test_a_package_released_while_it_installs_and_taken_again_keeps_its_reference(
    tmp_path: Path,
) -> None:
    """R1 across a release mid-install: a count 1 -> 0 (a delete honoured while its create
    installs, as the Ray door does) then 0 -> 1 (a create joins the install): when the package
    is handed out its reference is still in the index, so no pass evicts it under the budget."""
    async with rig(tmp_path, budget_bytes=0) as r:
        url = r.packages.add("a")
        key = key_of(url)
        gate = r.packages.hold("a")
        r.refs[key] += 1
        first = asyncio.ensure_future(r.store.ensure(Package(key, parse_uri("py_modules[0]", url))))
        await wait_until(lambda: r.packages.gets["a"] == 1, what="the download to start")
        r.drop(url)  # count 0: released while installing
        await r.store.db.notes.flush()
        r.refs[key] += 1  # count 0 -> 1: a create joins the install
        second = asyncio.ensure_future(
            r.store.ensure(Package(key, parse_uri("py_modules[0]", url)))
        )
        await asyncio.sleep(0)
        gate.set()
        path = await asyncio.wait_for(second, 10)
        await asyncio.wait_for(first, 10)
        await r.store.settle()
        await r.store.db.notes.flush()
        with sqlite3.connect(r.store.root / "state.db") as conn:
            refs = conn.execute("SELECT uri FROM refs").fetchall()
        assert refs == [(url,)], "handed out without its reference in the index"
        assert path.is_dir(), "a package in use was evicted"
        r.check()
        r.drop(url)


# -- passes and re-takes -------------------------------------------------------------------------


async def test_releases_within_a_pass_window_share_one_pass_and_a_wait_cuts_the_window_short(
    tmp_path: Path,
) -> None:
    """Releases a few moments apart ask for passes; with a window of a minute none starts on
    its own meanwhile, and a wait for the figures (``caught_up``) runs one pass for them all
    at once, not after the window."""
    async with rig(tmp_path, pass_window_s=60) as r:
        urls = [r.packages.add(name) for name in "abcde"]
        for url in urls:
            await r.take(url)
        await asyncio.wait_for(r.store.settle(), 10)  # the installs' pass, hurried
        passes = r.store.passes
        for url in urls:
            r.drop(url)
            await asyncio.sleep(0.01)  # room for a pass to start, were it not waiting
        assert r.store.passes == passes
        await asyncio.wait_for(r.store.caught_up(timeout_s=30), 10)
        assert r.store.passes == passes + 1
        assert r.unused() == set("abcde")
        sizes = [entry.size for entry in r.store.entries()]
        assert len(sizes) == 5
        assert r.store.stats().unused_bytes == sum(sizes)
        r.check()


def _refs(root: Path) -> list[str]:
    with sqlite3.connect(root / "state.db") as conn:
        return [uri for (uri,) in conn.execute("SELECT uri FROM refs")]


async def test_a_package_taken_again_before_its_drop_is_written_is_held_without_a_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package released and created again before any transaction took the drop of its
    reference: held again by cancelling the drop (no transaction; its reference never left
    the index, so a pass with a budget of 0 keeps it). Released again and its drop written by
    a pass, it is evicted, and the next create takes it anew through the index."""
    async with rig(tmp_path, budget_bytes=0, pass_window_s=60) as r:
        url = r.packages.add("a")
        await r.take(url)
        await asyncio.wait_for(r.store.settle(), 10)
        obtains: list[object] = []
        db = r.store.db
        real_obtain = db.obtain

        async def counting(*args: object, **kwargs: bool) -> object:
            obtains.append(args[0])
            return await real_obtain(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(db, "obtain", counting)
        r.drop(url)  # its pass waits for its window
        path = await r.take(url)
        assert obtains == []
        assert r.installed(url)
        assert r.store.stats().hits == 1
        r.check()
        await asyncio.wait_for(r.store.settle(), 10)  # budget 0: only a held package stays
        assert r.installed(url)
        assert path.is_dir()
        assert _refs(r.store.root) == [url]
        r.check()
        r.drop(url)
        await asyncio.wait_for(r.store.settle(), 10)  # the drop written, the package evicted
        assert r.store.entry(key_of(url)) is None
        assert _refs(r.store.root) == []
        await r.take(url)
        assert obtains == [("py_modules", url)]
        assert r.packages.gets["a"] == 2
        r.check()


# -- the view of the index ----------------------------------------------------------------------


async def test_a_failed_retake_of_an_unused_package_during_a_pass_leaves_it_in_the_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S4 across a race: a ready package dropped from the view by a failed re-obtain (which asks
    for a full read) while a pass that read only the changes is in flight comes back by the next
    pass; the in-flight one does not answer the full read it never made."""
    async with rig(tmp_path) as r:
        (url,) = await r.installed_unused("a")
        db = r.store.db
        await db.notes.flush()  # its reference's drop written (not deferred): taken again by obtain
        real_sweep = db.sweep
        read, answer = asyncio.Event(), asyncio.Event()

        async def held_sweep(
            budget_bytes: int,
            needed_bytes: int = 0,
            *,
            since: int = -1,
            kind_budgets: Sequence[KindBudget] = (),
        ) -> Swept:
            swept = await real_sweep(
                budget_bytes, needed_bytes, since=since, kind_budgets=kind_budgets
            )
            read.set()
            await answer.wait()  # the pass has read the index; its result is held back
            return swept

        async def failing_obtain(*args: object, **kwargs: object) -> object:
            raise IndexUnavailable("the cache index failed (injected)")

        monkeypatch.setattr(db, "sweep", held_sweep)
        monkeypatch.setattr(db, "obtain", failing_obtain)
        passing = asyncio.create_task(r.store.enforce_budget())
        await read.wait()
        assert r.store.is_unused(key_of(url))  # in the view as the pass reads the index
        with pytest.raises(IndexUnavailable):
            await r.take(url)  # taken again: fails, so the view forgets it
        assert r.store.entry(key_of(url)) is None
        monkeypatch.undo()
        answer.set()
        await asyncio.wait_for(passing, 10)
        await r.store.settle()

        with sqlite3.connect(r.store.root / "state.db") as conn:
            rows = conn.execute("SELECT kind, uri FROM uris WHERE state = 'ready'").fetchall()
        ready = {(e.key.kind.value, e.key.uri) for e in r.store.entries()
                 if e.state is UriState.READY}  # fmt: skip
        assert ready == set(rows) == {("py_modules", url)}, "the view misses a ready package"
        assert r.unused() == {"a"}
        r.check()


# -- deferred drops of references (a holder alone on its root) ------------------------------------

NEVER_S = 3600.0  # a write-behind window that never closes within a test


def _counting_obtains(db: StateDB, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The keys ``db.obtain`` is asked for from now on (each one a transaction)."""
    obtains: list[object] = []
    real_obtain = db.obtain

    async def counting(*args: object, **kwargs: bool) -> object:
        obtains.append(args[0])
        return await real_obtain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(db, "obtain", counting)
    return obtains


async def test_alone_a_released_package_keeps_its_reference_past_its_pass_and_is_held_again_freely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Churn's miss of a cached package: released, its pass run (it counts the package unused),
    created again: no transaction, as its reference row never left the index (R1); a reader
    of the index sees the reference until the drop is written (flush), and then none."""
    async with rig(tmp_path, db_options={"flush_interval_s": NEVER_S}) as r:
        url = r.packages.add("a")
        await r.take(url)
        size = r.store.entry(key_of(url)).size  # type: ignore[union-attr]
        obtains = _counting_obtains(r.store.db, monkeypatch)
        r.drop(url)
        await r.store.enforce_budget()  # the release's pass: it defers the drop
        assert len(r.store.db.notes.deferred()) == 1
        assert _refs(r.store.root) == [url], "the deferred drop was written"
        assert r.store.stats().unused_bytes == size, "a deferred drop's package is unused"
        assert r.unused() == {"a"}
        path = await r.take(url)
        assert obtains == [], "taken again through a transaction"
        assert len(r.store.db.notes.deferred()) == 0
        await r.store.enforce_budget()
        assert r.store.stats().unused_bytes == 0, "held again, still counted unused"
        assert path.is_dir()
        assert r.packages.gets["a"] == 1
        r.check()
        r.drop(url)
        await r.store.settle()
        await r.store.db.notes.flush()  # writes the deferred drops too
        assert _refs(r.store.root) == []
        assert len(r.store.db.notes.deferred()) == 0
        await r.take(url)
        assert obtains == [("py_modules", url)], "its drop written, it is taken by obtain"
        r.check()


async def test_a_pass_evicts_a_package_whose_drop_it_deferred_and_its_reference_row_goes_with_it(
    tmp_path: Path,
) -> None:
    """Budget 0: the deferred drop's package is unused, so its pass evicts it (R2) and deletes
    this holder's reference with the row; the next create installs it again."""
    async with rig(tmp_path, budget_bytes=0, db_options={"flush_interval_s": NEVER_S}) as r:
        url = r.packages.add("a")
        await r.take(url)
        r.drop(url)
        await r.store.enforce_budget()
        assert r.store.entry(key_of(url)) is None
        assert r.store.stats().evictions == 1
        assert _refs(r.store.root) == []
        assert len(r.store.db.notes.deferred()) == 0
        assert r.store.stats().unused_bytes == 0
        assert (await r.take(url)).is_dir()
        assert r.packages.gets["a"] == 2
        r.check()


async def test_a_deferred_drop_is_written_behind_once_the_linger_is_over(tmp_path: Path) -> None:
    """What the write-behind task writes (its step run here): a deferred drop stays deferred
    for the linger, then it is written, and can no longer be cancelled."""
    clock = Clock()
    options = {"flush_interval_s": NEVER_S, "drop_linger_s": 5.0, "clock": clock}
    async with rig(tmp_path, db_options=options) as r:
        url = r.packages.add("a")
        await r.take(url)
        r.drop(url)
        await r.store.enforce_budget()
        db = r.store.db
        assert len(db.notes.deferred()) == 1
        clock.tick(4.0)
        await db.notes.write_behind()
        assert _refs(r.store.root) == [url], "written before the linger was over"
        assert len(db.notes.deferred()) == 1
        clock.tick(2.0)
        await db.notes.write_behind()
        assert _refs(r.store.root) == []
        assert len(db.notes.deferred()) == 0
        assert not db.notes.keep_ref("py_modules", url), "kept after its drop was written"
        r.check()


async def test_with_another_holder_on_the_root_drops_are_written_and_deferred_ones_go_soon(
    tmp_path: Path,
) -> None:
    """A peer counts this holder's references as such: once one is registered, the next
    transaction sees it, and the deferred drops are written behind; with the peer there, a
    release's pass writes the drop (nothing deferred)."""
    async with rig(tmp_path, db_options={"flush_interval_s": 0.01}) as r:
        a, b = r.packages.add("a"), r.packages.add("b")
        await r.take(a)
        await r.take(b)
        r.drop(a)
        await r.store.enforce_budget()
        db = r.store.db
        assert len(db.notes.deferred()) == 1
        assert sorted(_refs(r.store.root)) == sorted([a, b])
        peer = StateDB(r.store.root / "state.db", root=r.store.root)
        await peer.open()
        try:
            await r.store.enforce_budget()  # its transaction finds the peer
            await wait_until(lambda: _refs(r.store.root) == [b], what="the deferred drop written")
            assert len(db.notes.deferred()) == 0
            r.drop(b)
            await r.store.enforce_budget()
            assert _refs(r.store.root) == [], "a drop deferred with a peer on the root"
            assert len(db.notes.deferred()) == 0
        finally:
            await peer.close()
        r.check()


async def test_a_package_taken_again_while_a_pass_is_in_flight_is_kept_by_that_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 0 and a pass queued behind a busy index thread: the package whose drop was
    deferred is taken again meanwhile, with no transaction; the pass, told so, keeps it (and
    counts it used) instead of evicting a package in use."""
    async with rig(
        tmp_path, budget_bytes=0, pass_window_s=60, db_options={"flush_interval_s": NEVER_S}
    ) as r:
        url = r.packages.add("a")
        await r.take(url)
        db = r.store.db
        r.store.budget_bytes = 10**9
        r.drop(url)
        await r.store.enforce_budget()  # deferred, kept by a roomy budget
        assert len(db.notes.deferred()) == 1
        r.store.budget_bytes = 0
        obtains = _counting_obtains(db, monkeypatch)
        busy = threading.Event()
        blocker = asyncio.ensure_future(db.run(lambda conn: busy.wait(10)))
        passing = asyncio.ensure_future(r.store.enforce_budget())
        await wait_until(lambda: db.notes.evicting == 1, what="the pass queued")
        path = await r.take(url)
        assert obtains == []
        busy.set()
        await asyncio.wait_for(asyncio.gather(blocker, passing), 10)
        assert path.is_dir(), "a package taken again was evicted"
        assert r.installed(url)
        assert r.store.stats().evictions == 0
        assert r.store.stats().unused_bytes == 0
        assert _refs(r.store.root) == [url]
        r.check()
        r.drop(url)


async def test_a_package_its_pass_in_flight_is_evicting_is_taken_again_through_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the pass has chosen to evict the package when the create comes, so the
    create does not keep the deferred drop; it obtains the package after the pass, finds it
    gone and installs it again (R2: a package in use is never deleted)."""
    async with rig(tmp_path, budget_bytes=0, db_options={"flush_interval_s": NEVER_S}) as r:
        url = r.packages.add("a")
        db = r.store.db
        r.store.budget_bytes = 10**9
        await r.take(url)
        r.drop(url)
        await r.store.enforce_budget()
        assert len(db.notes.deferred()) == 1
        r.store.budget_bytes = 0
        chosen, go_on = threading.Event(), threading.Event()
        real_may_evict = db.notes.may_evict

        def held(key: tuple[str, str]) -> bool:
            answer = real_may_evict(key)
            chosen.set()
            go_on.wait(10)
            return answer

        monkeypatch.setattr(db.notes, "may_evict", held)
        passing = asyncio.ensure_future(r.store.enforce_budget())
        await asyncio.to_thread(chosen.wait, 10)
        assert not db.notes.keep_ref("py_modules", url), "kept while its pass evicts it"
        taking = asyncio.ensure_future(r.take(url))
        await asyncio.sleep(0)
        go_on.set()
        await asyncio.wait_for(passing, 10)
        path = await asyncio.wait_for(taking, 10)
        assert path.is_dir()
        assert r.packages.gets["a"] == 2, "not installed again after its eviction"
        assert r.store.stats().evictions == 1
        assert _refs(r.store.root) == [url]
        r.check()
        r.drop(url)


async def test_a_package_whose_drop_a_transaction_in_flight_defers_is_held_again_freely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken again while the write that defers its drop waits on the index thread: no
    transaction; that write, done, does not defer it after all, and no later pass counts it
    unused (a pass with a budget of 0 leaves it in place)."""
    async with rig(tmp_path, pass_window_s=60, db_options={"flush_interval_s": NEVER_S}) as r:
        url = r.packages.add("a")
        await r.take(url)
        db = r.store.db
        obtains = _counting_obtains(db, monkeypatch)
        busy = threading.Event()
        blocker = asyncio.ensure_future(db.run(lambda conn: busy.wait(10)))
        r.drop(url)
        behind = asyncio.ensure_future(db.notes.write_behind())
        await asyncio.sleep(0)  # it takes the drop, to defer it, and waits for the thread
        assert db.notes.is_deferring(("py_modules", url))
        path = await r.take(url)
        assert obtains == []
        busy.set()
        await asyncio.wait_for(asyncio.gather(blocker, behind), 10)
        assert len(db.notes.deferred()) == 0, "deferred after it was taken again"
        r.store.budget_bytes = 0
        await r.store.enforce_budget()
        assert path.is_dir(), "a package taken again was evicted"
        assert r.installed(url)
        assert r.store.stats().evictions == 0
        assert _refs(r.store.root) == [url]
        r.check()
        r.drop(url)
