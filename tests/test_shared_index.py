"""The shared index's transactions (agent/state/index.py, rules R1-R4), on a real SQLite file
and real folders, with holders that are really alive (their lock taken in this process) or
really dead (their lock file released)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.core.errors import IndexUnavailable
from agent.core.packages import Package
from agent.core.uris import UriKey, UriKind, parse_uri
from agent.install.installers import Installed, InstallJob
from agent.state import index, reaping, sweeping
from agent.state.holders import HolderLock, is_alive, lock_path
from agent.state.index import Found
from agent.state.recovery import recover
from agent.state.state_db import UriRow
from agent.state.store import UriStore
from agent.state.sweeping import plan_target
from tests.harness.in_process import running_agent
from tests.harness.index_holders import KEY, die, holder, install, rows
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, module_zip
from tests.harness.polling import wait_until


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for sub in ("uris", "tmp", "trash"):
        (tmp_path / sub).mkdir()
    return tmp_path


OTHER = ("py_modules", "http://127.0.0.1:1/b.zip")


def test_the_target_of_a_pass_is_what_is_over_the_budget_or_what_the_disk_needs() -> None:
    assert plan_target(unused=100, budget=60, needed=0) == 40
    assert plan_target(unused=100, budget=60, needed=70) == 70  # the over-budget part counts
    assert plan_target(unused=100, budget=60, needed=30) == 40
    assert plan_target(unused=100, budget=60, needed=101) == 40  # cannot free it: budget only
    assert plan_target(unused=50, budget=60, needed=0) == 0


async def test_a_pass_evicts_the_least_recently_used_first_and_only_as_many_as_needed(
    root: Path,
) -> None:
    """The LRU rules of a pass, on the index: the unused bytes are the sum of the unused
    packages' sizes; evictions take the least recently used first (by last use, not by install
    order); after a pass the unused bytes fit the budget and no package went that did not have
    to; a pass for ``needed_bytes`` frees at least that many, or nothing beyond the budget if
    even every unused package would not free it."""
    a = await holder(root)
    try:
        sizes = {"p1": 10, "p2": 20, "p3": 30, "p4": 40}
        used = {"p1": 3, "p2": 1, "p3": 2, "p4": 4}  # least recent first: p2, p3, p1, p4
        keys = {name: ("py_modules", f"http://127.0.0.1:1/{name}.zip") for name in sizes}
        for name, key in keys.items():
            await install(a, key, size=sizes[name], used=used[name])
            a.notes.note_ref_dropped(*key)

        def uris(swept: sweeping.Swept) -> list[str]:
            return [e.row.uri.rsplit("/", 1)[1].removesuffix(".zip") for e in swept.evicted]

        swept = await a.sweep(budget_bytes=10**9)
        assert (uris(swept), swept.ready_bytes, swept.unused_bytes) == ([], 100, 100)
        swept = await a.sweep(budget_bytes=10**9, needed_bytes=101)  # cannot be freed: keep all
        assert (uris(swept), swept.unused_bytes) == ([], 100)
        swept = await a.sweep(budget_bytes=60)  # 40 over: p2 alone frees 20, p3 too is needed
        assert (uris(swept), swept.ready_bytes, swept.unused_bytes) == (["p2", "p3"], 50, 50)
        swept = await a.sweep(budget_bytes=60)  # fits: nothing more goes
        assert (uris(swept), swept.unused_bytes) == ([], 50)
        swept = await a.sweep(budget_bytes=10**9, needed_bytes=15)  # p1 frees 10 < 15: p4 too
        assert (uris(swept), swept.ready_bytes, swept.unused_bytes) == (["p1", "p4"], 0, 0)
        assert rows(root, "SELECT uri FROM uris") == []
    finally:
        await a.close()


async def test_a_second_holder_finds_a_package_a_first_one_installed_ready(root: Path) -> None:
    a, b = await holder(root), await holder(root)
    try:
        folder = await install(a, KEY)
        got = await b.obtain(KEY, folder.name, take_ref=True)
        assert got.found is Found.READY
        assert got.row is not None
        assert got.row.dir == folder.name
        assert sorted(r[0] for r in rows(root, "SELECT holder FROM refs")) == sorted(
            [a.holder_id, b.holder_id]
        )
    finally:
        await a.close()
        await b.close()


async def test_a_claim_of_a_live_holder_is_waited_for_and_one_of_a_dead_holder_reaped(
    root: Path,
) -> None:
    a, b = await holder(root), await holder(root)
    try:
        first = await a.obtain(KEY, "dir-a", take_ref=True)
        assert first.found is Found.CLAIMED
        (a.staging / "half").mkdir()
        waiting = await b.obtain(KEY, "dir-a", take_ref=True)
        assert waiting.found is Found.WAIT
        assert waiting.installer == a.holder_id
        die(a)
        taken = await b.obtain(KEY, "dir-a", take_ref=True)
        assert taken.found is Found.CLAIMED
        assert [h for h, _ in taken.reaped.holders] == [a.holder_id]
        assert not a.staging.exists()  # set aside into b's trash, to be deleted
        assert rows(root, "SELECT holder, state FROM uris") == [(b.holder_id, "installing")]
        assert rows(root, "SELECT holder FROM refs") == [(b.holder_id,)]
        assert not lock_path(root, a.holder_id).exists()
    finally:
        await b.close()


async def test_a_pass_never_evicts_what_a_live_holder_references(root: Path) -> None:
    a, b = await holder(root), await holder(root)
    try:
        kept = await install(a, KEY, size=100, used=1)
        gone = await install(a, OTHER, size=100, used=2)
        await b.obtain(KEY, kept.name, take_ref=True)  # b uses KEY
        a.notes.note_ref_dropped(*KEY)
        a.notes.note_ref_dropped(*OTHER)
        swept = await a.sweep(budget_bytes=0)
        assert [e.row.uri for e in swept.evicted] == [OTHER[1]]
        assert kept.is_dir()
        assert not gone.exists()
        assert (swept.ready_bytes, swept.unused_bytes) == (100, 0)
    finally:
        await a.close()
        await b.close()


async def test_a_dead_holders_references_stop_protecting_its_packages(root: Path) -> None:
    a, b = await holder(root), await holder(root)
    folder = await install(a, KEY)
    die(a)
    try:
        swept = await b.sweep(budget_bytes=0)
        assert [h for h, _ in swept.reaped.holders] == [a.holder_id]
        assert [e.row.uri for e in swept.evicted] == [KEY[1]]
        assert not folder.exists()
        assert rows(root, "SELECT * FROM refs") == []
        assert [r[0] for r in rows(root, "SELECT id FROM holders")] == [b.holder_id]
    finally:
        await b.close()


async def test_a_reference_taken_after_an_eviction_finds_no_row_and_claims_it(
    root: Path,
) -> None:
    a, b = await holder(root), await holder(root)
    try:
        folder = await install(a, KEY)
        a.notes.note_ref_dropped(*KEY)
        await a.sweep(budget_bytes=0)
        got = await b.obtain(KEY, folder.name, take_ref=True)
        assert got.found is Found.CLAIMED  # installed again, never handed a deleted folder
    finally:
        await a.close()
        await b.close()


async def test_a_ready_row_whose_folder_is_gone_is_installed_again(root: Path) -> None:
    a = await holder(root)
    try:
        folder = await install(a, KEY)
        folder.rmdir()
        got = await a.obtain(KEY, folder.name, take_ref=True)
        assert got.found is Found.CLAIMED
    finally:
        await a.close()


async def test_a_view_follows_the_changes_and_reads_everything_only_when_behind(
    root: Path,
) -> None:
    a = await holder(root)
    try:
        first = await a.sweep(budget_bytes=10**9)
        assert first.full
        assert first.changes == []
        await install(a, KEY)
        second = await a.sweep(budget_bytes=10**9, since=first.gen)
        assert not second.full
        assert [k for k, r in second.changes if r is not None] == [KEY]
        a.notes.note_ref_dropped(*KEY)
        third = await a.sweep(budget_bytes=0, since=second.gen)
        assert third.changes == [(KEY, None)]
        quiet = await a.sweep(budget_bytes=0, since=third.gen)
        assert quiet.changes == []
        assert quiet.gen == third.gen
    finally:
        await a.close()


async def test_a_clean_close_drops_the_holders_rows_and_lock(root: Path) -> None:
    a = await holder(root)
    await install(a, KEY)
    holder_id = a.holder_id
    await a.close()
    assert rows(root, "SELECT * FROM refs") == []
    assert rows(root, "SELECT id FROM holders") == []
    assert not lock_path(root, holder_id).exists()
    assert not is_alive(root, holder_id)


async def test_a_holder_is_alive_to_another_descriptor_of_its_own_process(root: Path) -> None:
    lock = await asyncio.to_thread(HolderLock.take, root)
    try:
        assert is_alive(root, lock.holder_id)
    finally:
        lock.release()
    assert not is_alive(root, lock.holder_id)


async def test_stray_folders_of_no_live_holder_are_set_aside_and_a_live_ones_kept(
    root: Path,
) -> None:
    a, b = await holder(root), await holder(root)
    try:
        (root / "tmp" / "0123456789abcdef0123456789abcdef").mkdir()  # a dead holder's
        (root / "tmp" / "old-layout").mkdir()  # an older agent's staging
        (root / "tmp" / ".probe-1").mkdir()  # a start-up probe: not touched
        (a.staging / "building").mkdir()
        swept = await b.sweep(budget_bytes=10**9)
        names = sorted(p.name for p in (root / "tmp").iterdir())
        assert names == sorted([".probe-1", a.holder_id, b.holder_id])
        assert (a.staging / "building").is_dir()
        assert len(swept.reaped.aside) == 2
    finally:
        await a.close()
        await b.close()


def test_unregister_of_an_unknown_holder_changes_nothing(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    conn.executescript(
        "CREATE TABLE refs (holder, kind, uri); CREATE TABLE uris (kind, uri, state, holder);"
        "CREATE TABLE holders (id, live_envs); INSERT INTO refs VALUES ('x', 'k', 'u');"
    )
    index.unregister(conn, "y")
    assert conn.execute("SELECT count(*) FROM refs").fetchone() == (1,)


async def test_a_fifo_or_a_link_in_place_of_a_lock_file_is_a_dead_holder_never_waited_on(
    root: Path,
) -> None:
    """Liveness opens what the index names under holders/: a FIFO there would block an open
    for reading for ever, and a link would lock another file."""
    (root / "holders").mkdir()
    fifo, link = "a" * 32, "b" * 32
    os.mkfifo(lock_path(root, fifo))
    (root / "target").write_text("x")
    os.symlink(root / "target", lock_path(root, link))
    assert not await asyncio.wait_for(asyncio.to_thread(is_alive, root, fifo), 5)
    assert not is_alive(root, link)
    a = await holder(root)
    try:
        (root / "tmp" / fifo).mkdir()
        (root / "tmp" / link).mkdir()
        swept = await asyncio.wait_for(a.sweep(budget_bytes=0), 5)
        assert len(swept.reaped.aside) == 2
        assert (root / "target").read_text() == "x"
    finally:
        await a.close()


async def test_creates_of_a_ready_env_and_deletes_that_release_nothing_run_no_pass() -> None:
    """The hot path on a shared root takes no cross-process lock: only a count going 0 -> 1
    (a transaction) or 1 -> 0 (a pass) touches the index."""
    async with package_server() as served, running_agent() as a:
        env = env_json(py_modules=[served.add("m.zip", module_zip("hot_mod", "1"))])
        first = await a.create(env)
        await a.settle()
        store = a.service.store
        passes = store.passes
        for _ in range(20):
            await a.create(env)
            assert await a.delete(first.runtime_env_id) == 1
        await a.settle()
        assert store.passes == passes
        assert await a.delete(first.runtime_env_id) == 0  # the last reference: a pass
        await a.settle()
        assert store.passes == passes + 1


async def test_a_transaction_whose_caller_is_cancelled_still_carries_the_notes_it_took(
    root: Path,
) -> None:
    """A cancelled obtain queued behind a busy thread still runs: the claim and reference
    dropped behind before it are written, not lost with it (a lost claim of a live holder made
    every peer wait on it for ever)."""
    a = await holder(root)
    try:
        assert (await a.obtain(KEY, "dir-a", take_ref=True)).found is Found.CLAIMED
        a.notes.note_claim_dropped(*KEY)  # its install failed
        a.notes.note_ref_dropped(*KEY)
        release = threading.Event()
        busy = asyncio.ensure_future(a.run(lambda conn: release.wait(5)))
        queued = asyncio.ensure_future(a.obtain(OTHER, "dir-b", take_ref=True))
        await asyncio.sleep(0.05)
        queued.cancel()
        asyncio.get_running_loop().call_later(0.1, release.set)
        await asyncio.gather(queued, return_exceptions=True)
        await busy
        a.notes.note_claim_dropped(*OTHER)  # as the store's _forget does for the cancelled obtain
        a.notes.note_ref_dropped(*OTHER)
        await a.notes.flush()
        assert rows(root, "SELECT uri FROM uris") == []
        assert rows(root, "SELECT uri FROM refs") == []
    finally:
        await a.close()


async def test_a_pass_while_a_holder_takes_its_lock_never_reaps_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file is made and locked under a name passes ignore, then renamed into place:
    a pass between its creation and its lock finds nothing to reap."""
    peer = await holder(root)
    rename = os.rename

    def pass_first(src: object, dst: object) -> None:
        with sqlite3.connect(root / "state.db") as conn:
            reaping.reap_dead(conn, root, peer.holder_id, peer.trash, reaping.Reaped()).finish()
        rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr("agent.state.holders.os.rename", pass_first)
    lock = await asyncio.to_thread(HolderLock.take, root)
    monkeypatch.undo()
    try:
        assert lock_path(root, lock.holder_id).exists()
        assert is_alive(root, lock.holder_id)
        assert sorted(p.name for p in (root / "holders").iterdir()) == sorted(
            [f"{peer.holder_id}.lock", f"{lock.holder_id}.lock"]
        )
    finally:
        lock.release()
        await peer.close()


async def test_a_ready_row_replaced_by_a_claim_is_logged_gone(root: Path) -> None:
    """A package whose folder vanished is claimed again over its ready row (a REPLACE): peers
    following the change log see it go, even if that install then fails."""
    a, b = await holder(root), await holder(root)
    try:
        folder = await install(a, KEY)
        seen = (await b.sweep(budget_bytes=10**9)).gen
        folder.rmdir()
        assert (await b.obtain(KEY, folder.name, take_ref=True)).found is Found.CLAIMED
        swept = await a.sweep(budget_bytes=10**9, since=seen)
        assert swept.changes == [(KEY, None)]
    finally:
        await a.close()
        await b.close()


async def test_a_start_keeps_the_rows_and_folders_of_a_kind_it_cannot_read(root: Path) -> None:
    """A newer peer's package (a kind this agent does not know) is neither dropped nor deleted
    at this agent's start: the peer may be using it."""
    a = await holder(root)
    try:
        newer = ("conda", "http://127.0.0.1:1/env.yaml")
        folder = await install(a, newer)
        scan = index.Scan(frozenset({folder.name}), frozenset())
        got = await a.reconcile(lambda: scan, lambda key: None if key[0] == "conda" else "x")
        assert (got.dropped, got.orphans) == (0, [])
        assert folder.is_dir()
        assert rows(root, "SELECT kind FROM uris") == [("conda",)]
    finally:
        await a.close()


async def test_reaping_an_installer_sets_aside_the_folder_it_placed_but_never_committed(
    root: Path,
) -> None:
    a, b = await holder(root), await holder(root)
    try:
        assert (await a.obtain(KEY, "dir-a", take_ref=True)).found is Found.CLAIMED
        (root / "uris" / "dir-a").mkdir()  # renamed into place; killed before the commit
        die(a)
        swept = await b.sweep(budget_bytes=10**9)
        assert not (root / "uris" / "dir-a").exists()
        assert any(p.parent == b.trash for p in swept.reaped.aside)
    finally:
        await b.close()


async def test_an_index_row_naming_no_holder_does_not_stop_the_passes(root: Path) -> None:
    """A hand-edited index (a claim with a NULL holder, a holder named '../x') is read
    without a crash and never names a file outside holders/."""
    a = await holder(root)
    try:
        with sqlite3.connect(root / "state.db") as conn:
            conn.execute(
                "INSERT INTO uris (kind, uri, dir, size, last_used_ms, state, holder)"
                " VALUES ('py_modules', 'u1', 'd1', 0, 0, 'installing', NULL)"
            )
            conn.execute("INSERT INTO refs VALUES ('../x', 'py_modules', 'u1')")
        (root / "x.lock").write_text("not a lock")
        await a.sweep(budget_bytes=10**9)
        assert (root / "x.lock").read_text() == "not a lock"
        assert rows(root, "SELECT holder FROM refs") == []
    finally:
        await a.close()


async def test_a_pass_drops_a_row_naming_no_folder_of_uris_and_touches_nothing_on_disk(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The index is a file other processes can write: a ready row whose ``dir`` is an absolute
    path, "", ".." or not text is evicted as a row only, never by moving what it names (a
    folder outside the root, uris/ itself with the packages in use, the root)."""
    outside = tmp_path_factory.mktemp("outside") / "precious"
    outside.mkdir()
    (outside / "f").write_text("x")
    a = await holder(root)
    try:
        in_use = await install(a, KEY)  # referenced by a: never evicted
        hostile = [str(outside), "", "..", ".", "a/b", b"blob"]
        with sqlite3.connect(root / "state.db") as conn:
            conn.executemany(
                "INSERT INTO uris (kind, uri, dir, size, last_used_ms, state)"
                " VALUES ('py_modules', ?, ?, 10, 0, 'ready')",
                [(f"u{i}", directory) for i, directory in enumerate(hostile)],
            )
        conn.close()
        swept = await a.sweep(budget_bytes=0)
        assert sorted(e.row.uri for e in swept.evicted) == sorted(f"u{i}" for i in range(6))
        assert all(e.trashed is None for e in swept.evicted)
        assert (outside / "f").read_text() == "x"
        assert in_use.is_dir()
        assert rows(root, "SELECT uri FROM uris") == [(KEY[1],)]
        assert (swept.ready_bytes, swept.unused_bytes) == (100, 0)
    finally:
        await a.close()


async def test_a_start_skips_a_folder_a_live_peer_moves_away_between_listing_and_stat(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer's renames out of uris/ are not transactional (a cancelled install's folder to
    its trash, a leftover moved aside): recovery's scan may list a folder that is gone when it
    stats it, and the start goes on without it."""
    db = await holder(root)
    store = UriStore(root, {}, db=db, refcount=lambda key: 0, budget_bytes=10**9, disk_floor=None)
    (root / "uris" / "orphan").mkdir()
    (root / "uris" / "moving").mkdir()
    peer_trash = root / "trash" / ("e" * 32)
    peer_trash.mkdir()
    scandir = os.scandir

    def listed_then_moved(path: Path) -> Iterator[os.DirEntry[str]]:
        entries = list(scandir(path))
        os.rename(root / "uris" / "moving", peer_trash / "moved")  # the peer, meanwhile
        return iter(entries)

    monkeypatch.setattr("agent.state.recovery.os.scandir", listed_then_moved)
    try:
        summary = await recover(store, db)
        assert summary.orphans_deleted == 1  # no row vouches for it: set aside
        assert not (root / "uris" / "orphan").exists()
    finally:
        await store.close()
        await db.close()


async def test_a_start_keeps_a_row_and_folder_a_live_peer_references_even_if_named_otherwise(
    root: Path,
) -> None:
    """A live peer that names folders its own way (another version) keeps the package it uses:
    its row stays, its folder is no orphan, and it is not adopted under this agent's name. A
    dead holder's misnamed package, referenced by nobody now, is dropped and set aside."""
    live, dead, starting = await holder(root), await holder(root), await holder(root)
    try:
        used = await install(live, KEY)  # referenced by live
        unused = await install(dead, OTHER)
        die(dead)
        scan = index.Scan(frozenset(os.listdir(root / "uris")), frozenset())
        got = await starting.reconcile(lambda: scan, lambda key: "named-as-this-agent-does")
        assert got.kept == []
        assert got.dropped == 1
        assert used.is_dir()
        assert not unused.exists()
        assert [p.parent for p in got.orphans] == [starting.trash]
        assert rows(root, "SELECT uri, dir FROM uris") == [(KEY[1], used.name)]
    finally:
        await live.close()
        await starting.close()


async def test_a_commit_whose_claim_is_no_longer_the_holders_writes_nothing(root: Path) -> None:
    """R3: only the claim's holder commits. A holder taken for dead and reaped (its claim now
    a peer's), or whose claim is gone, is told so and the row stays as it is."""
    a, b = await holder(root), await holder(root)
    try:
        assert (await a.obtain(KEY, "dir-a", take_ref=True)).found is Found.CLAIMED
        die(a)  # taken for dead: b reaps it and claims the package
        assert (await b.obtain(KEY, "dir-b", take_ref=True)).found is Found.CLAIMED
        assert not await a.record_install(UriRow(*KEY, "dir-a", 100, 1))
        assert rows(root, "SELECT dir, state, holder FROM uris") == [
            ("dir-b", "installing", b.holder_id)
        ]
        assert await b.record_install(UriRow(*KEY, "dir-b", 50, 2))
        assert not await a.record_install(UriRow(*KEY, "dir-a", 100, 1))
        assert rows(root, "SELECT dir, size, state FROM uris") == [("dir-b", 50, "ready")]
        assert not await a.record_install(UriRow(*OTHER, "dir-o", 100, 1))  # never claimed
        assert rows(root, "SELECT uri FROM uris WHERE uri = ?", OTHER[1]) == []
    finally:
        await a.close()
        await b.close()


class _GateInstaller:
    """Installs one folder once ``go`` is set."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    def check(self, package: Package, label: str) -> None:
        pass

    def prepare(self, staging: Path) -> None:
        (staging / "m").mkdir()

    async def install(self, package: Package, job: InstallJob) -> Installed:
        self.started.set()
        await self.go.wait()
        return Installed(job.staging / "m", 1)


async def test_an_install_whose_claim_was_taken_over_fails_retryably_and_leaves_the_folder(
    root: Path,
) -> None:
    """The store's commit finds its claim a peer's: the create fails with UNAVAILABLE (try
    again) and the folder at the package's path is not trashed (the peer may have placed and
    committed its own there)."""
    db = await holder(root)
    gate = _GateInstaller()
    store = UriStore(
        root, {UriKind.PY_MODULES: gate}, db=db, refcount=lambda key: 1, budget_bytes=10**9,
        disk_floor=None,
    )  # fmt: skip
    uri = "file:///x/m.zip"
    package = Package(UriKey(UriKind.PY_MODULES, uri), parse_uri("py_modules[0]", uri))
    peer = "f" * 32
    try:
        ensure = asyncio.ensure_future(store.ensure(package))
        await gate.started.wait()
        with sqlite3.connect(root / "state.db") as conn:  # a peer reaped it and claimed
            conn.execute("UPDATE uris SET holder = ? WHERE uri = ?", (peer, uri))
        conn.close()
        gate.go.set()
        with pytest.raises(IndexUnavailable, match="took over this install"):
            await ensure
        await store.settle()
        assert store.path_for(package.key).is_dir()
        assert rows(root, "SELECT state, holder FROM uris") == [("installing", peer)]
    finally:
        await store.close()
        await db.close()


async def test_a_package_a_peer_installs_is_used_once_ready_not_at_the_next_poll(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store waiting on a live peer's install (here its polls' sleeps never end) uses the
    package as soon as the peer commits it: one read of the index per tick, for every package
    waited on, wakes the waiter, which uses the ready row under the reference its first obtain
    committed (no second transaction, nothing installed). A peer's install that fails (its
    claim gone) wakes the waiter too, which claims and installs the package itself."""
    peer, db = await holder(root), await holder(root)
    forever = asyncio.Event()

    async def never(delay: float) -> None:
        await forever.wait()

    obtains: list[tuple[str, str]] = []
    real_obtain = db.obtain

    async def counting(key: tuple[str, str], dir_name: str, *, take_ref: bool) -> Any:
        obtains.append(key)
        return await real_obtain(key, dir_name, take_ref=take_ref)

    monkeypatch.setattr(db, "obtain", counting)
    gate = _GateInstaller()
    gate.go.set()
    store = UriStore(
        root, {UriKind.PY_MODULES: gate}, db=db, refcount=lambda key: 1, budget_bytes=10**9,
        disk_floor=None, sleep=never,
    )  # fmt: skip

    def package(key: tuple[str, str]) -> Package:
        return Package(UriKey(UriKind.PY_MODULES, key[1]), parse_uri("py_modules[0]", key[1]))

    async def waiting(key: tuple[str, str]) -> asyncio.Future[Path]:
        folder = store.path_for(package(key).key)
        assert (await peer.obtain(key, folder.name, take_ref=True)).found is Found.CLAIMED
        ensure = asyncio.ensure_future(store.ensure(package(key)))
        await wait_until(lambda: [key] == obtains[-1:], what="the waiter's obtain")
        await asyncio.sleep(0.05)  # a few ticks read the install still in flight
        assert not ensure.done()
        return ensure

    try:
        ensure = await waiting(KEY)
        folder = store.path_for(package(KEY).key)
        folder.mkdir()
        await peer.record_install(UriRow(*KEY, folder.name, 1, 1))
        assert await asyncio.wait_for(ensure, 10) == folder
        assert obtains == [KEY]
        assert not gate.started.is_set()
        assert store.stats().hits == 1
        assert sorted(rows(root, "SELECT holder FROM refs WHERE uri = ?", KEY[1])) == sorted(
            [(peer.holder_id,), (db.holder_id,)]
        )

        ensure = await waiting(OTHER)
        peer.notes.note_claim_dropped(*OTHER)  # its install failed
        await peer.notes.flush()
        path = await asyncio.wait_for(ensure, 10)
        assert obtains == [KEY, OTHER, OTHER]
        assert gate.started.is_set()
        assert path.is_dir()
        assert rows(root, "SELECT state, holder FROM uris WHERE uri = ?", OTHER[1]) == [
            ("ready", None)
        ]
    finally:
        await store.close()
        await db.close()
        await peer.close()


async def test_a_missing_trash_is_made_and_never_makes_a_present_folder_look_gone(
    root: Path,
) -> None:
    """A rename into this holder's trash fails with ENOENT when the trash is missing, as when
    the folder moved is gone: the package is evicted into a trash made again (not its row
    dropped with the folder left in uris/), and a dead holder's staging set aside all the same."""
    a, b = await holder(root), await holder(root)
    try:
        folder = await install(a, KEY)
        a.notes.note_ref_dropped(*KEY)
        a.trash.rmdir()
        [evicted] = (await a.sweep(budget_bytes=0)).evicted
        assert evicted.trashed is not None
        assert evicted.trashed.parent == a.trash
        assert evicted.trashed.is_dir()
        assert not folder.exists()
        shutil.rmtree(a.trash)
        (b.staging / "half").mkdir()
        die(b)
        swept = await a.sweep(budget_bytes=0)
        assert not b.staging.exists()
        assert [p.parent for p in swept.reaped.aside] == [a.trash] * 2  # b's staging and trash
        assert any((p / "half").is_dir() for p in swept.reaped.aside)
    finally:
        await a.close()
        await b.close()
