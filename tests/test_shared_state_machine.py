"""A hypothesis state machine over three agents (holders) sharing one root, in one process.

Each holder is what ``Agent.start`` builds, without the gRPC doors: its shared lock on
``agent.lock``, its ``StateDB`` on the root's real ``state.db`` (which makes it a holder), a
real fetcher and installers, a ``UriStore``, ``RefTables`` and an ``AgentService``, recovered
by ``recover`` as at a start. Packages are real zips: four py_modules as file:// URIs under an
allowed root, two working dirs and a gated module served by a real aiohttp server on 127.0.0.1.

Rules: create and delete envs that share packages, on any live holder; evict (a holder's pass
under a small budget); crash a holder (as ``kill -9``: its lock let go, its index connection
gone, what it noted behind lost, nothing of its clean close done), idle, just after a delete
whose reference drop is still only noted, or in the middle of an install (its claim held, its
staging half written, the download frozen for good); restart a crashed slot as a new holder
(recovery). A model counts each holder's references per env.

After every step, with every live holder's passes settled and its notes flushed:
1. every package a live env of a live holder names is under uris/, its files intact (R2);
2. uris/ holds exactly the ready rows of the index, each package once; the only claims left are
   dead holders' not yet reaped;
3. the refs rows of live holders are exactly the packages their live envs name, and each
   holder's tables agree with the model;
4. once any live holder has run a pass after a crash, the dead holder's rows, claims, lock
   file and tmp/ and trash/ folders are gone (R4);
5. (after each pass a rule runs) the root's unused bytes fit the budget, and the evicting
   holder's view of the ready packages is the index's (S4);
6. every live holder's own ``check_invariants`` (service, tables, store) holds.
A create downloads exactly the packages the root did not hold before it (one install per
package across the root, R3), and a clean stop at the end leaves none of the stopped holders'
rows, locks or folders.

Hypothesis is synchronous: the machine owns an event loop and runs each rule's coroutine to
completion on it. One clock serves the holders and ticks at each reading, and notes are
written behind only with a transaction or a flush, so a sequence of steps runs the same every
time (hypothesis replays and shrinks it). Runs 25 examples of up to 25 steps by default (a few
seconds); for a long run set RTENV_HYPOTHESIS_EXAMPLES (the timeout grows with it). A failure
prints its steps; ``pytest --hypothesis-seed=N`` replays a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.app.config import Settings
from agent.app.service import AgentService
from agent.core.errors import EnvNotFound
from agent.core.refs import RefTables
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uris import UriKey, UriKind
from agent.install.disk.root import package_dir
from agent.install.fetch.fetcher import Fetcher
from agent.install.installers import InstallTools, build_installers
from agent.ops.startup import lock_root, make_folders
from agent.state.holders import lock_path
from agent.state.recovery import recover
from agent.state.state_db import FILE_NAME, StateDB
from agent.state.store import UriStore
from tests.harness.in_process import FAST_FETCH
from tests.harness.package_server import PackageServer
from tests.harness.packages import make_zip
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

T = TypeVar("T")
EXAMPLES = int(os.environ.get("RTENV_HYPOTHESIS_EXAMPLES", "25"))
STEPS = 25
HOLDERS = 3
FILLER = "x" * 3000  # each package unpacks to a little over 3 KB
BUDGET = 8000  # about two unused packages fit the root
GATED = "g.zip"  # served, but its answer held for good: an install that never ends
Key = tuple[str, str]  # (kind, uri), as the index names a package
Tree = dict[str, bytes]  # a package's files: path under its directory -> content


@dataclass(frozen=True)
class Pkg:
    key: Key
    tree: Tree  # what its directory must hold once installed


def _build_packages(folder: Path, server: PackageServer) -> dict[str, Pkg]:
    """p0..p3: py_modules zips as file:// URIs under ``folder``; w0, w1: working-dir zips (one
    top folder, stripped at install) and g, the gated module, served over HTTP."""
    packages = {}
    for i in range(4):
        files = {f"m{i}/__init__.py": f"V = {i}\n", f"m{i}/f.txt": FILLER}
        path = folder / f"p{i}.zip"
        path.write_bytes(make_zip(files))
        packages[f"p{i}"] = Pkg(("py_modules", f"file://{path}"), _tree(files))
    for i in range(2):
        files = {"main.py": f"W = {i}\n", "data.txt": FILLER}
        url = server.add(f"w{i}.zip", make_zip({f"proj/{n}": d for n, d in files.items()}))
        packages[f"w{i}"] = Pkg(("working_dir", url), _tree(files))
    files = {"g/__init__.py": "G = 1\n"}
    packages["g"] = Pkg(("py_modules", server.add(GATED, make_zip(files))), _tree(files))
    return packages


def _tree(files: dict[str, str]) -> Tree:
    return {name: data.encode() for name, data in files.items()}


Spec = tuple[str | None, list[str]]  # (working dir, py_modules), by package name
ENVS: dict[str, Spec] = {
    "e0": ("w0", ["p0"]),
    "e1": ("w0", ["p0", "p1"]),
    "e2": ("w1", ["p1", "p2"]),
    "e3": (None, ["p2", "p3"]),
    "e4": (None, ["p3"]),
}
STUCK: Spec = (None, ["p1", "g"])  # the env a holder dies creating: p1 installed, g never


def _serialize(spec: Spec, packages: dict[str, Pkg]) -> str:
    working_dir, modules = spec
    env: dict[str, Any] = {"py_modules": [packages[m].key[1] for m in modules]}
    if working_dir is not None:
        env["working_dir"] = packages[working_dir].key[1]
    return json.dumps(env)


def _names(spec: Spec) -> list[str]:
    working_dir, modules = spec
    return [*modules, *([working_dir] if working_dir else [])]


def _dir(root: Path, key: Key) -> Path:
    return package_dir(root, UriKey(UriKind(key[0]), key[1]))


def _read_tree(path: Path) -> Tree:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


# -- one holder ----------------------------------------------------------------------------------


@dataclass
class Holder:
    """One agent of the root, as ``Agent.start`` builds it, without the doors."""

    lock_fd: int  # its shared lock on agent.lock
    session: aiohttp.ClientSession
    db: StateDB
    store: UriStore
    service: AgentService
    counts: Counter[str] = field(default_factory=Counter)  # the model: env name -> references
    stuck: asyncio.Task[Any] | None = None  # the create it died in (crashed while installing)

    @property
    def id(self) -> str:
        return self.db.holder_id


@dataclass
class Clock:
    """The holders' one clock: a millisecond later at every reading, so that the packages'
    last uses, hence the eviction order, are the same at every run of a step sequence (as
    hypothesis needs to replay and shrink one)."""

    now: float

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


async def start_holder(settings: Settings, clock: Clock) -> Holder:
    """A new holder of ``settings.root``: the start of an agent, recovery included. The notes
    written behind are written only with a transaction or a flush (no timer), and time is
    ``clock``'s: a step is the same every run, and what a crash loses is what the step
    noted."""
    root = settings.root
    await asyncio.to_thread(make_folders, root, 0o755)
    lock_fd = await asyncio.to_thread(lock_root, root)
    db = StateDB(root / FILE_NAME, root=root, flush_interval_s=3600.0)
    await db.open()
    session = aiohttp.ClientSession(trust_env=False)
    fetcher = Fetcher(session, settings.fetch, file_roots=settings.allow_file_roots)
    installers = build_installers(
        InstallTools(
            fetcher, settings.archive, settings.py_executable, settings.pip_installer,
            root / "logs",
        )
    )  # fmt: skip
    tables = RefTables()
    store = UriStore(
        root, installers, db=db, refcount=tables.uri_count,
        budget_bytes=settings.cache_budget_bytes, clock=clock, sweep_interval_s=0,
    )  # fmt: skip
    summary = await recover(store, db)
    service = AgentService(settings, store, tables, db=db, recovery=summary, clock=clock)
    return Holder(lock_fd, session, db, store, service)


def quiet(holder: Holder) -> bool:
    """No pass runs or is asked for, no deletion is pending: what a crash may freeze here."""
    return holder.store.pass_loop.running is None and not holder.store.deletions.tasks()


def freeze(holder: Holder) -> None:
    """From now on the holder starts no pass (a kill comes before any it would schedule)."""
    holder.store.pass_loop.ask = _nothing  # type: ignore[method-assign]


def _nothing() -> None:
    pass


async def crash(holder: Holder) -> None:
    """``kill -9``, in this process: the holder starts nothing more (``freeze``; its
    write-behind task cancelled; a create it is in stays frozen where it waits, its download
    held), its index connection closes with no transaction open, its lock file is let go but
    left in place, and what it noted behind is lost. Its session stays open (a frozen download
    keeps its socket until ``bury``).

    Only a ``quiet`` holder can be killed faithfully in this process: a pass in flight runs on
    in its thread, commits, and keeps the dead holders' locks it took, which a real kill would
    let go with the process."""
    store, db = holder.store, holder.db
    assert quiet(holder), "a crash in this process needs the holder quiet"
    freeze(holder)
    periodic = store.pass_loop.periodic
    if periodic is not None:
        periodic.cancel()
        await asyncio.gather(periodic, return_exceptions=True)
    await db.crash()  # the kernel drops the flock; the file stays, as after a kill
    os.close(holder.lock_fd)


async def bury(holder: Holder) -> None:
    """At teardown: a crashed holder's frozen create cancelled, its session closed."""
    if holder.stuck is not None:
        holder.stuck.cancel()
        await asyncio.gather(holder.stuck, return_exceptions=True)
    running = holder.store.pass_loop.running
    tasks = [t for t in (running, *holder.store.deletions.tasks()) if t is not None]
    for task in tasks:  # what the cancelled create scheduled: a dead holder runs nothing
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await holder.session.close()


async def stop(holder: Holder) -> None:
    """A clean stop, in ``Agent._close``'s order."""
    try:
        await holder.store.close()
        await holder.db.close()
        await holder.session.close()
    finally:
        os.close(holder.lock_fd)


# -- the index, read as another process would ----------------------------------------------------


@dataclass(frozen=True)
class Index:
    ready: dict[Key, tuple[str, int]]  # -> (dir, size)
    claims: dict[Key, str]  # -> the holder installing it
    refs: set[tuple[str, Key]]  # (holder, package)
    holders: set[str]

    def unused_bytes(self) -> int:
        used = {key for _, key in self.refs}
        return sum(size for key, (_, size) in self.ready.items() if key not in used)


def read_index(root: Path) -> Index:
    conn = sqlite3.connect(root / FILE_NAME, timeout=10)
    try:
        rows = conn.execute("SELECT kind, uri, dir, size, state, holder FROM uris").fetchall()
        refs = conn.execute("SELECT holder, kind, uri FROM refs").fetchall()
        holders = conn.execute("SELECT id FROM holders").fetchall()
    finally:
        conn.close()
    ready = {(k, u): (d, s) for k, u, d, s, state, _ in rows if state == "ready"}
    claims = {(k, u): h for k, u, _, _, state, h in rows if state == "installing"}
    return Index(ready, claims, {(h, (k, u)) for h, k, u in refs}, {h for (h,) in holders})


# -- the machine ---------------------------------------------------------------------------------


class SharedRootMachine(RuleBasedStateMachine):
    holders = HOLDERS
    flush_each_step = True  # every live holder's notes written after each step

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.base = short_tempdir()
        self.root = self.base / "root"
        self.server = PackageServer()
        self.slots: list[Holder | None] = [None] * self.holders
        self.dead: list[Holder] = []  # crashed holders, buried at teardown
        self.unreaped: set[str] = set()  # crashed holders no pass has run since
        self.swept = False  # a pass ran in this step (the rule knows it does)
        self.clock = Clock(time.time())
        self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    async def _start(self) -> None:
        await self.server.start()
        folder = self.base / "pkgs"
        folder.mkdir()
        self.packages = _build_packages(folder, self.server)
        self.gate = self.server.hold(GATED)  # opened at teardown only
        self.settings = replace(
            Settings(root=self.root), cache_budget_bytes=BUDGET, fetch=FAST_FETCH,
            allow_file_roots=(str(folder),),
        )  # fmt: skip
        self.envs = {name: _serialize(spec, self.packages) for name, spec in ENVS.items()}
        self.stuck_env = _serialize(STUCK, self.packages)
        self.ids = {
            name: parse_runtime_env(text, EnvLimits()).env_id for name, text in self.envs.items()
        }
        for i in range(self.holders):
            self.slots[i] = await start_holder(self.settings, self.clock)

    def teardown(self) -> None:
        async def down() -> None:
            try:
                for holder in self.dead:
                    await bury(holder)
                stopped = [h for h in self.slots if h is not None]
                for holder in stopped:
                    await stop(holder)
                index = read_index(self.root)
                for holder in stopped:  # a clean stop leaves nothing of the holder
                    self._assert_gone(index, holder.id)
            finally:
                self.gate.set()
                await self.server.stop()

        try:
            self.run(down())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            shutil.rmtree(self.base, ignore_errors=True)

    def live(self) -> list[int]:
        return [i for i, h in enumerate(self.slots) if h is not None]

    def crashed(self) -> list[int]:
        return [i for i, h in enumerate(self.slots) if h is None]

    def holder(self, slot: int) -> Holder:
        holder = self.slots[slot]
        assert holder is not None
        return holder

    def ready_on_root(self) -> set[Key]:
        index = read_index(self.root)
        return {key for key, (d, _) in index.ready.items() if (self.root / "uris" / d).is_dir()}

    def keys(self, env: str) -> set[Key]:
        return {self.packages[name].key for name in _names(ENVS[env])}

    # -- rules -----------------------------------------------------------------------------------
    @precondition(lambda self: self.live())
    @rule(data=st.data(), env=st.sampled_from(sorted(ENVS)))
    def create(self, data: st.DataObject, env: str) -> None:
        """A create downloads exactly the packages no holder of the root had installed."""
        slot = data.draw(st.sampled_from(self.live()), label="holder")
        holder = self.holder(slot)
        missing = self.keys(env) - self.ready_on_root()
        before = holder.store.downloads
        created = self.run(holder.service.create(self.envs[env], 0, ""))
        assert created.env_id == self.ids[env]
        assert holder.store.downloads - before == len(missing), (env, missing)
        holder.counts[env] += 1
        self.swept = self.swept or bool(missing)  # an install schedules a pass

    @precondition(lambda self: self.live())
    @rule(data=st.data(), env=st.sampled_from(sorted(ENVS)))
    def delete(self, data: st.DataObject, env: str) -> None:
        slot = data.draw(st.sampled_from(self.live()), label="holder")
        holder = self.holder(slot)
        if holder.counts[env] == 0:
            with pytest.raises(EnvNotFound):
                self.run(holder.service.delete(self.ids[env], "", ""))
            return
        remaining = self.run(holder.service.delete(self.ids[env], "", ""))
        holder.counts[env] -= 1
        assert remaining == holder.counts[env]
        still_named = {k for e, n in holder.counts.items() if n for k in self.keys(e)}
        # a delete that releases a package schedules a pass; one that releases none, none
        self.swept = self.swept or bool(self.keys(env) - still_named)

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """A holder's pass: the root's unused bytes fit the budget after it."""
        holder = self.holder(data.draw(st.sampled_from(self.live()), label="holder"))
        self.run(holder.store.enforce_budget())
        self.swept = True
        self._assert_budget()
        # S4: after its own pass, the holder's view of the ready packages is the index's
        seen = {(e.key.kind.value, e.key.uri) for e in holder.store.entries()}
        assert seen == set(read_index(self.root).ready), seen

    @precondition(lambda self: len(self.live()) > 1)
    @rule(data=st.data(), after_delete=st.booleans())
    def crash(self, data: st.DataObject, after_delete: bool) -> None:
        """A holder dies idle or, ``after_delete``, right after a delete whose dropped references
        are only noted (the pass it scheduled never runs)."""
        slot = data.draw(st.sampled_from(self.live()), label="holder")
        holder = self.holder(slot)

        async def go() -> None:
            held = sorted(env for env, n in holder.counts.items() if n)
            if after_delete and held:
                freeze(holder)  # killed right after the reply: the delete's pass never runs
                await holder.service.delete(self.ids[held[0]], "", "")
            await crash(holder)

        self.run(go())
        self._dead(slot)

    @precondition(lambda self: len(self.live()) > 1)
    @rule(data=st.data())
    def crash_installing(self, data: st.DataObject) -> None:
        """A holder dies in a create: one package installed and referenced, the other claimed,
        its staging half made, its download waiting for an answer that never comes."""
        slot = data.draw(st.sampled_from(self.live()), label="holder")
        holder = self.holder(slot)
        gets = self.server.gets[GATED]

        async def go() -> None:
            holder.stuck = asyncio.create_task(holder.service.create(self.stuck_env, 0, ""))
            await wait_until(
                lambda: (
                    self.server.gets[GATED] > gets
                    and holder.store.installs_in_flight() == 1
                    and quiet(holder)
                ),
                what="the gated download, the other package installed and its pass done",
            )
            await crash(holder)

        self.run(go())
        claims = read_index(self.root).claims
        assert claims.get(self.packages["g"].key) == holder.id, claims
        self._dead(slot)

    def _dead(self, slot: int) -> None:
        holder = self.holder(slot)
        self.slots[slot] = None
        self.dead.append(holder)
        self.unreaped.add(holder.id)

    @precondition(lambda self: self.crashed())
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        """A new holder in a crashed slot: recovery reaps every dead holder and keeps the
        budget."""
        slot = data.draw(st.sampled_from(self.crashed()), label="slot")
        holder = self.run(start_holder(self.settings, self.clock))
        self.slots[slot] = holder
        assert len(holder.service.records) == 0
        self.swept = True
        self._assert_budget()

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def the_root_matches_the_model(self) -> None:
        async def settle() -> None:
            holders = [self.holder(i) for i in self.live()]
            for holder in holders:
                await holder.store.settle()
            for holder in holders if self.flush_each_step else ():
                await holder.db.notes.flush()

        self.run(settle())
        index = read_index(self.root)
        live = [self.holder(i) for i in self.live()]
        live_ids = {h.id for h in live}
        # (1) R2: every package in use is in place, whole
        for holder in live:
            for env in (e for e, n in holder.counts.items() if n):
                for name in _names(ENVS[env]):
                    pkg = self.packages[name]
                    path = _dir(self.root, pkg.key)
                    assert pkg.key in index.ready, f"{name} of {env} (in use) has no ready row"
                    assert path.is_dir(), f"{name} of {env} (in use) is gone from {path}"
                    assert _read_tree(path) == pkg.tree, f"{name} of {env} is not intact"
        # (6) each holder's own invariants; its tables as the model counts
        for holder in live:
            holder.service.check_invariants()
            tables = holder.service.tables
            assert {e: n for e, n in holder.counts.items() if n} == {
                e: tables.env_count(self.ids[e]) for e in ENVS if tables.env_count(self.ids[e])
            }
            for name, pkg in self.packages.items():
                count = tables.uri_count(UriKey(UriKind(pkg.key[0]), pkg.key[1]))
                named = sum(1 for e, n in holder.counts.items() if n and name in _names(ENVS[e]))
                assert count == named, (name, count, named)
        # (2) uris/ is exactly the ready rows, each package once; claims only by the dead
        on_disk = sorted(p.name for p in (self.root / "uris").iterdir() if p.name[0] != ".")
        assert on_disk == sorted(d for d, _ in index.ready.values()), (on_disk, index.ready)
        for row_key, (directory, _) in index.ready.items():
            assert directory == _dir(self.root, row_key).name, (row_key, directory)
        assert set(index.claims.values()) <= self.unreaped, index.claims
        # (3) the references of live holders are exactly what their live envs name
        expected = {
            (holder.id, key)
            for holder in live
            for env, n in holder.counts.items()
            if n
            for key in self.keys(env)
        }
        deferred = {(holder.id, key) for holder in live for key in holder.db.notes.deferred()}
        assert not deferred & expected, f"a package in use is counted released: {deferred}"
        assert {(h, k) for h, k in index.refs if h in live_ids} == expected | deferred
        assert {h for h, _ in index.refs} <= live_ids | self.unreaped, index.refs
        assert live_ids <= index.holders <= live_ids | self.unreaped
        # (4) R4: a pass after a crash reaped the dead
        if self.swept and live:
            for dead in sorted(self.unreaped):
                self._assert_gone(index, dead)
            self.unreaped.clear()
        self.swept = False

    def _assert_gone(self, index: Index, holder: str) -> None:
        """Nothing of ``holder`` is left: rows, references, claims, lock file, folders."""
        assert holder not in index.holders, f"holder {holder}'s row is left"
        assert all(h != holder for h, _ in index.refs), f"holder {holder}'s references are left"
        assert holder not in index.claims.values(), f"holder {holder}'s claims are left"
        assert not lock_path(self.root, holder).exists(), f"holder {holder}'s lock file is left"
        for sub in ("tmp", "trash"):
            assert not (self.root / sub / holder).exists(), f"{sub}/{holder} is left"

    def _assert_budget(self) -> None:
        """(5), right after a pass: every other live holder's notes were flushed at the end of
        the step before, and the pass carried its own holder's. Unused as the model says: a
        package no live env of a live holder names and no dead holder references (a holder
        alone on the root keeps the rows of references it released, deferred; they count as
        unused here, as they do in its passes)."""
        index = read_index(self.root)
        live = [self.holder(i) for i in self.live()]
        live_ids = {h.id for h in live}
        used = {key for h, key in index.refs if h not in live_ids} | {
            key for h in live for env, n in h.counts.items() if n for key in self.keys(env)
        }
        unused = sum(size for key, (_, size) in index.ready.items() if key not in used)
        assert unused <= BUDGET, f"the root's unused bytes {unused} exceed the budget {BUDGET}"


SharedRootMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None
)
TestSharedRootStateMachine = pytest.mark.timeout(max(180, 12 * EXAMPLES))(
    SharedRootMachine.TestCase
)


class AloneRootMachine(SharedRootMachine):
    """The same machine with one holder, alone on its root, its notes not flushed after each
    step: the drops of its references are deferred (their rows kept, counted unused by its
    passes), so a pass must evict by them (budget, R2), and the references left in the index
    are exactly its live envs' and its deferred drops', never one in use."""

    holders = 1
    flush_each_step = False


AloneRootMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None
)
TestAloneRootStateMachine = pytest.mark.timeout(max(180, 12 * EXAMPLES))(AloneRootMachine.TestCase)


# -- found by the machine -------------------------------------------------------------------------


async def test_the_first_pass_that_reaps_a_dead_holder_removes_its_staging_and_trash() -> None:
    """Found by the machine (crash_installing, then one evict by another holder): the pass that
    reaps a dead holder holds the dead holder's lock while it looks for folders of dead holders
    under tmp/ and trash/, so it finds that holder alive and leaves its folders to a later pass."""
    base = short_tempdir()
    settings = replace(Settings(root=base / "root"), cache_budget_bytes=BUDGET)
    clock = Clock(time.time())
    alive, dead = await start_holder(settings, clock), await start_holder(settings, clock)
    try:
        (dead.db.staging / "half-made").mkdir()  # an install it was in when it died
        await crash(dead)
        await alive.store.enforce_budget()
        index = read_index(settings.root)
        assert dead.id not in index.holders
        assert not lock_path(settings.root, dead.id).exists()
        left = [sub for sub in ("tmp", "trash") if (settings.root / sub / dead.id).exists()]
        assert left == [], f"the dead holder's {' and '.join(left)} folders are left"
    finally:
        await bury(dead)
        await stop(alive)
        shutil.rmtree(base, ignore_errors=True)
