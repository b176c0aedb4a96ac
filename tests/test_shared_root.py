"""Several agents on one root (issue 16), whole processes: three agents, each the sidecar of a
raylet_sim node of its own on a socket of its own, one ``--root``; real workers that import their
py_modules and read their working dir; packages from a real server on 127.0.0.1 that counts each
GET. Everything is checked where it lives: GETs at the server, folders under ``uris/`` and
``tmp/``, the rows of ``state.db`` (read with sqlite3), each agent's GetRuntimeEnvsInfo and the
workers' own watch of their files."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.state.holders import HOLDERS_DIR, is_alive
from raylet_sim.node import AgentDied, Node
from raylet_sim.pool import TaskSpec
from raylet_sim.samples import EnvSpec, Samples, build_samples
from raylet_sim.watch import snapshot
from tests.harness.package_server import PackageServer
from tests.harness.packages import env_json, make_zip
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

AGENTS = 3
START_S = 60.0  # the three agents to serve
RUN_S = 60.0  # a batch of tasks, env setup included
SEEN_S = 30.0  # the index to show what a test waits for (a ref, a claim, a reaped holder)
STALL = "stall.zip"  # a py_modules package: the module ``stalled``, VALUE 4242
STALL_VALUE = 4242
ONLY_B = "only-b.zip"  # a py_modules package only the agent killed mid-use uses
ONLY_B_VALUE = 77


@dataclass
class Shared:
    """The three nodes on one root, their package server, and readers of the root."""

    base: Path
    root: Path
    server: PackageServer
    samples: Samples
    nodes: list[Node]
    gates: list[asyncio.Event] = field(default_factory=list)

    def hold(self, name: str) -> asyncio.Event:
        """The server holds /name's responses until the returned event is set (at the end at
        the latest)."""
        gate = self.server.hold(name)
        self.gates.append(gate)
        return gate

    def url(self, name: str) -> str:
        return f"{self.server.base_url}/{name}"

    def used(self, envs: Sequence[EnvSpec]) -> set[str]:
        """The package names ``envs`` use (a sample's py_module may be used by none)."""
        names = {f"{env.working_dir}.zip" for env in envs}
        return names | {f"{m}.zip" for env in envs for m in env.py_modules}

    async def run(self, node: Node, env: EnvSpec | str, index: int) -> dict[str, Any]:
        """Run the samples' task (it imports the env's py_modules and reads its working dir)
        on a worker of ``node``; the result without the worker's pid."""
        key = env.serialized if isinstance(env, EnvSpec) else env
        result: dict[str, Any] = await node.run(TaskSpec(key, "task:run", (index,)))
        result.pop("pid")
        return result

    async def rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        return await asyncio.to_thread(_query, self.root / "state.db", sql, params)

    async def holder_of(self, node: Node) -> str:
        """The holder id of ``node``'s agent: its row in ``holders`` names its pid."""
        found: list[str] = []

        async def registered() -> bool:
            found[:] = [r[0] for r in await self.rows(_HOLDER_BY_PID, node.sidecar.pid)]
            return len(found) == 1

        await wait_until(registered, timeout_s=SEEN_S, what=f"agent {node.sidecar.pid}'s holder")
        return found[0]

    async def package_dirs(self) -> dict[str, tuple[str, str]]:
        """URI -> (its folder's name under uris/, its state), from the index."""
        return {uri: (d, state) for uri, d, state in await self.rows(_PACKAGES)}

    def uri_dirs(self) -> set[str]:
        """The folders under uris/ (start-up probes, named with a leading dot, aside)."""
        return {p.name for p in (self.root / "uris").iterdir() if not p.name.startswith(".")}

    def log(self, node: Node) -> str:
        return node.sidecar.log_path.read_text(errors="replace")


_HOLDER_BY_PID = "SELECT id FROM holders WHERE pid = ?"
_PACKAGES = "SELECT uri, dir, state FROM uris"
_REFS = "SELECT holder, uri FROM refs"


def _query(db: Path, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    """One read of the shared index, as a tool would read it (read-only, waiting out writers)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, tuple(params)).fetchall()
    finally:
        con.close()


@asynccontextmanager
async def shared_root(
    n_envs: int,
    *,
    idle_timeout_s: float,
    watch_s: float | None = None,
    extra: dict[str, bytes] | None = None,
    agent_args: Sequence[str] = (),
    agents: int = AGENTS,
) -> AsyncIterator[Shared]:
    """Sample packages (and ``extra``) served on 127.0.0.1; ``agents`` nodes started at once,
    each agent on its own socket and log, all on one root; everything stopped and removed
    after."""
    base = short_tempdir()
    root = base / "root"
    server = PackageServer()
    await server.start()
    samples = build_samples(n_envs, server.base_url, seed=16, filler_bytes=4096)
    for name, body in {**samples.packages, **(extra or {})}.items():
        server.add(name, body)
    nodes = [
        Node(
            root,
            address=f"unix:{base}/agent{i}.sock",
            log_path=base / f"agent{i}.log",
            idle_timeout_s=idle_timeout_s,
            watch_interval_s=watch_s,
            agent_args=agent_args,
        )
        for i in range(agents)
    ]
    shared = Shared(base, root, server, samples, nodes)
    try:
        started = await asyncio.wait_for(
            asyncio.gather(*(node.start() for node in nodes), return_exceptions=True), START_S
        )
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        yield shared
    finally:
        for gate in shared.gates:
            gate.set()
        await asyncio.wait_for(asyncio.gather(*(node.stop() for node in nodes)), START_S)
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def _settle(runs: Sequence[asyncio.Future[dict[str, Any]]]) -> None:
    """Cancel what is still running (a test failed before its tasks ended) and wait for it."""
    for run in runs:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


@pytest.mark.timeout(180)
async def test_three_agents_on_one_root_download_each_package_once_and_hold_one_copy() -> None:
    """Three agents want the same packages at once: each is fetched once (the others wait on its
    install, provably: their references are in the index while the server holds the only GET),
    the root holds one folder per package, and every count returns to 0."""
    async with shared_root(4, idle_timeout_s=0.2) as s:
        holders = [await s.holder_of(node) for node in s.nodes]
        assert len(set(holders)) == AGENTS
        envs = s.samples.envs
        used = s.used(envs)
        for name in used:
            s.hold(name)
        runs = [
            asyncio.ensure_future(s.run(node, env, i))
            for node in s.nodes
            for i, env in enumerate(envs)
        ]
        try:
            wanted = {(h, s.url(name)) for h in holders for name in used}

            async def everyone_waits() -> bool:
                twice = {name: n for name in used if (n := s.server.gets[name]) > 1}
                assert not twice, f"fetched by several agents at once: {twice}"
                fetched = all(s.server.requested(name).is_set() for name in used)
                return fetched and wanted <= set(await s.rows(_REFS))

            await wait_until(
                everyone_waits, timeout_s=SEEN_S,
                what="every package's GET, and every agent's reference on it, held at the server",
            )  # fmt: skip
            assert {name: s.server.gets[name] for name in used} == dict.fromkeys(used, 1), (
                "an agent fetched a package whose install another agent had claimed"
            )
            for gate in s.gates:
                gate.set()
            results = await asyncio.wait_for(asyncio.gather(*runs), RUN_S)
        finally:
            await _settle(runs)
        for k, result in enumerate(results):  # by node, then by env
            i = k % len(envs)
            assert result == envs[i].expected(i, s.samples.values), result

        assert {name: s.server.gets[name] for name in used} == dict.fromkeys(used, 1)
        packages = await s.package_dirs()
        assert set(packages) == {s.url(name) for name in used}
        assert {state for _, state in packages.values()} == {"ready"}
        assert s.uri_dirs() == {d for d, _ in packages.values()}, "one folder per package"

        async def all_zero() -> bool:
            for node in s.nodes:
                assert node.client is not None
                info = await node.client.info()
                if any(e.references for e in info.envs) or any(u.references for u in info.uris):
                    return False
            live = [(h, uri) for h, uri in await s.rows(_REFS) if is_alive(s.root, h)]
            return not live

        await wait_until(all_zero, timeout_s=SEEN_S, what="every count back to 0")
        for node in s.nodes:
            assert node.client is not None
            info = await node.client.info()
            assert {u.uri for u in info.uris} == set(packages), "each agent sees the root's"


@pytest.mark.timeout(180)
async def test_agents_killed_mid_install_and_mid_use_are_reaped_and_the_survivor_serves() -> None:
    """kill -9 one agent while the server holds its install and another while its workers use
    their envs: the survivor's tasks and creates go on, no file under its workers changes, the
    dead holders' references, claim, staging and lock files are reaped, and the half-installed
    package is fetched again by the survivor when it needs it."""
    extra = {
        STALL: make_zip({"stalled/__init__.py": f"VALUE = {STALL_VALUE}\n"}),
        ONLY_B: make_zip({"only_b/__init__.py": f"VALUE = {ONLY_B_VALUE}\n"}),
    }
    # budget 0: every pass evicts every package no live holder references
    async with shared_root(
        3, idle_timeout_s=60.0, watch_s=0.05, extra=extra, agent_args=("--cache-budget", "0")
    ) as s:
        survivor, in_use, installing = s.nodes
        holders = [await s.holder_of(node) for node in s.nodes]
        dead = holders[1:]
        e0, e1, e2 = s.samples.envs
        values = s.samples.values
        runs = [(survivor, e0, 0), (survivor, e1, 1), (in_use, e0, 0), (in_use, e1, 1)]
        got = await asyncio.wait_for(asyncio.gather(*(s.run(*r) for r in runs)), RUN_S)
        assert got == [env.expected(i, values) for _, env, i in runs]
        only_b = env_json(
            working_dir=s.url(f"{e1.working_dir}.zip"), py_modules=[s.url(ONLY_B)],
            env_vars={"DEMO_ENV": "b", "DEMO_MODULES": "only_b"},
        )  # fmt: skip
        assert await asyncio.wait_for(s.run(in_use, only_b, 2), RUN_S) == {
            "env": "b", "sum": ONLY_B_VALUE, "tag": e1.working_dir, "task": 2,
        }  # fmt: skip
        # the survivor's workers stay (idle), hashing their files every 50 ms; so do we
        packages = await s.package_dirs()
        used = [s.root / "uris" / packages[s.url(name)][0] for name in s.used([e0, e1])]
        before = snapshot(used)
        assert before, used

        gate = s.hold(STALL)
        app = e0.working_dir
        stall_env = env_json(
            working_dir=s.url(f"{app}.zip"),
            py_modules=[s.url(STALL)],
            env_vars={"DEMO_ENV": "stall", "DEMO_MODULES": "stalled"},
        )
        doomed = asyncio.ensure_future(s.run(installing, stall_env, 7))
        try:
            await asyncio.wait_for(s.server.requested(STALL).wait(), SEEN_S)
            staging = s.root / "tmp" / dead[1]

            async def in_flight() -> bool:
                claim = await s.rows("SELECT state, holder FROM uris WHERE uri = ?", s.url(STALL))
                return (
                    claim == [("installing", dead[1])]
                    and staging.is_dir()
                    and any(staging.iterdir())
                )

            await wait_until(in_flight, timeout_s=SEEN_S, what="the install's claim and staging")
            for node in (installing, in_use):
                assert node.sidecar.process is not None
                node.sidecar.process.kill()  # SIGKILL
            for node in (installing, in_use):
                await asyncio.wait_for(node.wait_died(), SEEN_S)
            with pytest.raises(AgentDied):
                await asyncio.wait_for(doomed, SEEN_S)
        finally:
            await _settle([doomed])
        gate.set()  # the dead agent's GET is over; the next one is served at once

        # the survivor serves: its workers' tasks, a new env, the half-installed package
        again = await asyncio.wait_for(
            asyncio.gather(s.run(survivor, e0, 3), s.run(survivor, e1, 4)), RUN_S
        )
        assert list(again) == [e0.expected(3, values), e1.expected(4, values)]
        assert await asyncio.wait_for(s.run(survivor, e2, 5), RUN_S) == e2.expected(5, values)
        retried = await asyncio.wait_for(s.run(survivor, stall_env, 6), RUN_S)
        assert retried == {"env": "stall", "sum": STALL_VALUE, "tag": app, "task": 6}
        assert s.server.gets[STALL] == 2, "the half-install is fetched again, once"
        assert survivor.pool is not None
        assert survivor.pool.violations == [], "a file under a live worker changed or vanished"
        assert snapshot(used) == before

        async def reaped() -> bool:
            refs = {h for h, _ in await s.rows(_REFS)}
            rows = {h for (h,) in await s.rows("SELECT id FROM holders")}
            files = [p for h in dead if (p := s.root / HOLDERS_DIR / f"{h}.lock").exists()]
            files += [p for sub in ("tmp", "trash") if (p := s.root / sub / dead[1]).exists()]
            only_b_row = await s.rows("SELECT dir FROM uris WHERE uri = ?", s.url(ONLY_B))
            return not (refs | rows) & set(dead) and not files and not only_b_row

        await wait_until(
            reaped, timeout_s=SEEN_S,
            what="the dead holders' rows, locks and half-install reaped, and the package only "
            "they used evicted",
        )  # fmt: skip
        assert not any(is_alive(s.root, h) for h in dead)
        assert is_alive(s.root, holders[0])
        for h in dead:
            assert f"reaped holder {h}" in s.log(survivor), s.log(survivor)[-3000:]
        packages = await s.package_dirs()
        assert packages[s.url(STALL)][1] == "ready"
        assert s.uri_dirs() == {d for d, _ in packages.values()}, "one folder per package"
