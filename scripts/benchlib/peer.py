"""The peer run (``bench.py --peer ray``): this agent next to Ray's own runtime env agent, both
spoken to in Ray's HTTP protocol by the same client code, in one run; every figure is a ratio
to Ray's agent.

Ray's agent runs in a real Ray head node (``benchlib.raynode``) and is spoken to directly on the
port its port file names; this agent runs as ``serve --ray-address`` (its Ray door) on a fresh
root per measurement. A long-lived Ray agent installs a package from cold only under a URL it
has not seen, so each cold measurement gets the large zip under a new name (a hard link).
Agent CPU is read from /proc for each agent's own pid around the measured part.

- peer-hot: one env held; cache-hit pairs at concurrency 1 and 64, interleaved rounds, for this
  agent's Ray door, Ray's agent and (for context) this agent's gRPC door.
- peer-cold-large, peer-stampede, peer-loop-blocking: the large zip over http, as the
  workloads without ``--peer`` measure it, on each agent.
- peer-churn: the churn trace on each agent, both with the same cache budget (Ray's:
  ``RAY_RUNTIME_ENV_PY_MODULES_CACHE_SIZE_GB``).
- peer-e2e: ``benchlib.ray_e2e`` (a Ray driver) runs tasks over many runtime envs sharing
  packages on a Ray node with Ray's agent and on one whose raylet runs this agent (started by
  this agent's launcher).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchlib import rpc
from benchlib.baselines import lru_simulation
from benchlib.churn import churn_inputs
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, percentile
from benchlib.hot import HIGH, Served, hot_env, round_notes, rounds
from benchlib.packages import build_workdir_zip
from benchlib.procs import (
    SCRIPTS,
    AgentProcess,
    BenchError,
    ProcWatch,
    ray_door_missing,
    read_all,
    read_through,
)
from benchlib.ray_http import RayHttpTarget
from benchlib.raynode import NODE_ENV, RayNode
from benchlib.shared import Shared

OURS = "this agent (Ray door)"
RAY = "Ray's agent"
RAY_BASE = "Ray 2.60's own runtime env agent in a Ray head node, same client code and requests"
OURS_NODE = "this agent (Ray node on it)"
STOCK = "stock"  # the shared Ray node of the micro workloads


def launcher_available() -> str:
    """Why a Ray node cannot be started on this agent here ("" if it can)."""
    if importlib.util.find_spec("agent.launcher") is None:
        return "this agent's Ray launcher (agent.launcher) is not in this checkout"
    return ""


def peer_unavailable() -> str:
    """Why ``--peer ray`` cannot run here ("" if it can): checked before the run."""
    if importlib.util.find_spec("ray") is None:
        return "--peer ray needs ray (pip install -e '.[dev]')"
    if importlib.util.find_spec("smart_open") is None:
        return (
            "--peer ray needs smart_open: Ray's agent fetches http packages with it "
            "(pip install smart_open)"
        )
    return ""


def _ours_or_note(result: WorkloadResult) -> bool:
    problem = ray_door_missing()
    if problem:
        result.notes.append(f"{problem}: only Ray's agent measured")
    return not problem


# -- hot ---------------------------------------------------------------------------------------


async def bench_peer_hot(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-hot")
    env = await hot_env(work)
    node = await shared.ray_node(STOCK)
    servers: list[Served] = []
    ours: AgentProcess | None = None
    try:
        if _ours_or_note(result):
            ours = AgentProcess(work / "agent-root", ray_door=True)
            await ours.__aenter__()
            servers.append(Served(OURS, ours.ray_address, ours.pid, "ray-http"))
        servers.append(Served(RAY, node.agent_address, node.agent_pid, "ray-http"))
        if ours is not None:
            servers.append(Served("this agent (gRPC door)", ours.address, ours.pid, "grpc"))
        for server in servers[:2]:  # the env is held: every measured pair is a cache hit
            async with RayHttpTarget(server.address, connections=1) as target:
                await target.create(env, 600)
        await rounds(servers, env, sizes, sizes.hot_rounds)
    finally:
        if ours is not None:
            await ours.stop()
    ray = next(s for s in servers if s.name == RAY)
    result.measures = [s.measure for s in servers]
    round_notes(result, servers, sizes)
    if ours is None:
        result.figure(f"Ray's agent: pairs/s, c{HIGH}", ray.rate, ray.rate, RAY_BASE, "pairs/s")
        return result
    a, g = servers[0], servers[2]
    result.figure(
        f"pairs/s over HTTP, concurrency {HIGH}", a.rate, ray.rate, RAY_BASE, "pairs/s",
        Goal("ratio", ">=", 1.3),
    )  # fmt: skip
    result.figure(
        f"agent CPU per request, concurrency {HIGH}", a.cpu_ms_per_rpc, ray.cpu_ms_per_rpc,
        f"{RAY_BASE}: its process's CPU per request", "ms", Goal("ratio", "<=", 0.7),
    )  # fmt: skip
    result.figure(
        "create p50 latency over HTTP, concurrency 1", a.p50_ms, ray.p50_ms, RAY_BASE, "ms",
        Goal("ratio", "<=", 1.0, "no worse than Ray's: ratio <= 1.0x"),
    )  # fmt: skip
    result.figure(
        "create p99 latency over HTTP, concurrency 1", a.p99_ms, ray.p99_ms, RAY_BASE, "ms"
    )
    result.figure(
        f"gRPC door: pairs/s, concurrency {HIGH}", g.rate, ray.rate,
        f"{RAY_BASE} (over HTTP)", "pairs/s",
    )  # fmt: skip
    result.notes.append(
        "a minimal HTTP/1.1 client (benchlib/ray_http.py), keep-alive, as many connections as "
        "calls in flight; CPU per request: each agent's process and its children "
        "(/proc/PID/stat)"
    )
    return result


# -- the large zip: cold-large, stampede, info during an install -------------------------------


def _big_env(url: str, tag: str) -> str:
    return json.dumps({"working_dir": url, "env_vars": {"BENCH": tag}})


class _Side:
    """One agent spoken to in Ray's protocol for one measurement: this agent on a fresh root,
    or Ray's agent in the shared node (where a fresh URL makes the install cold)."""

    def __init__(self, name: str, address: str, pid: int, agent: AgentProcess | None) -> None:
        self.name = name
        self.address = address
        self.pid = pid
        self._agent = agent

    async def close(self) -> None:
        if self._agent is not None:
            await self._agent.stop()


async def _side(which: str, work: Path, shared: Shared, tag: str) -> _Side:
    if which == OURS:
        agent = AgentProcess(work / f"agent-{tag}", ray_door=True)
        await agent.__aenter__()
        return _Side(OURS, agent.ray_address, agent.pid, agent)
    node = await shared.ray_node(STOCK)
    return _Side(RAY, node.agent_address, node.agent_pid, None)


async def _measured(
    which: str, work: Path, shared: Shared, tag: str,
    body: Callable[[_Side, str], Awaitable[Measure]],
) -> Measure:  # fmt: skip
    """Run ``body`` on a side with a URL of the large zip it has never seen, the file read
    through first; add the package server's GETs and the agent's CPU to its measure."""
    big = await shared.big()
    url = await shared.alias(f"big-{'ours' if which == OURS else 'ray'}-{tag}")
    side = await _side(which, work, shared, tag)
    try:
        server = await shared.server()
        await asyncio.to_thread(read_through, big.path)
        gets = await server.total_gets()
        watch = ProcWatch(side.pid)
        watch.start()
        m = await body(side, url)
        usage = watch.stop()
        m.cpu_s = usage.cpu_s
        m.peak_rss_bytes = usage.peak_rss_bytes
        m.downloads = await server.total_gets() - gets
    finally:
        await side.close()
    return m


def _sides(result: WorkloadResult) -> list[str]:
    return [OURS, RAY] if _ours_or_note(result) else [RAY]


def _order(sides: list[str], r: int) -> list[str]:
    k = r % len(sides)
    return sides[k:] + sides[:k]  # the order rotates, so drift hits both alike


async def bench_peer_cold_large(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-cold-large")
    big = await shared.big()
    walls: dict[str, list[float]] = {}
    measures: dict[str, Measure] = {}

    async def create(side: _Side, url: str) -> Measure:
        async with RayHttpTarget(side.address, connections=1) as target:
            t0 = time.perf_counter()
            errors = 0
            try:
                await target.create(_big_env(url, "1"), sizes.phase_timeout_s)
            except rpc.CallFailed as exc:
                errors = 1
                print(f"{side.name}: cold create failed: {exc}", flush=True)
            wall = time.perf_counter() - t0
        return Measure(side.name, wall, 1, [wall], errors=errors)

    sides = _sides(result)
    for r in range(sizes.cold_rounds):
        for which in _order(sides, r):
            m = await _measured(which, work, shared, f"cold{r}", create)
            walls.setdefault(which, []).append(m.wall_s)
            measures.setdefault(which, Measure(f"{which} cold create")).add(m)
    ray_s = statistics.median(walls[RAY])
    if OURS in walls:
        result.figure(
            f"cold create over HTTP, {big.label()}", statistics.median(walls[OURS]), ray_s,
            RAY_BASE, "s",
        )  # fmt: skip
    else:
        result.figure(f"Ray's agent: cold create, {big.label()}", ray_s, ray_s, RAY_BASE, "s")
    result.measures = list(measures.values())
    result.notes.append(f"{sizes.cold_rounds} rounds, medians, order rotating")
    return result


async def bench_peer_stampede(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-stampede")
    n = sizes.stampede_envs
    walls: dict[str, list[float]] = {}
    measures: dict[str, Measure] = {}

    def many(tag: str) -> Callable[[_Side, str], Awaitable[Measure]]:
        async def body(side: _Side, url: str) -> Measure:
            async with RayHttpTarget(side.address, connections=n) as target:
                calls, _ = await rpc.creates(
                    target, lambda i: _big_env(url, f"{tag}-{i}"), n, n,
                    deadline_s=time.monotonic() + sizes.phase_timeout_s,
                )  # fmt: skip
            if calls.error_sample:
                print(f"{side.name}: {calls.errors} errors, e.g. {calls.error_sample}", flush=True)
            return Measure(side.name, calls.wall_s, n, calls.create_s, errors=calls.errors)

        return body

    sides = _sides(result)
    for r in range(sizes.stampede_rounds):
        for which in _order(sides, r):
            m = await _measured(which, work, shared, f"stampede{r}", many(f"s{r}"))
            walls.setdefault(which, []).append(m.wall_s)
            measures.setdefault(which, Measure(f"{which}, {n} creates at once")).add(m)
    ray = measures[RAY]
    ray_wall = statistics.median(walls[RAY])
    if OURS in walls:
        ours = measures[OURS]
        result.figure(
            f"wall of {n} concurrent creates, one zip", statistics.median(walls[OURS]),
            ray_wall, RAY_BASE, "s",
        )  # fmt: skip
        result.figure(
            f"p99 create latency of the {n}", percentile(ours.latencies_s, 0.99) * 1000,
            percentile(ray.latencies_s, 0.99) * 1000, RAY_BASE, "ms",
        )  # fmt: skip
        result.figure(
            "downloads at the package server, all rounds", ours.downloads or 0,
            ray.downloads or 0, f"{RAY_BASE}: its downloads", "GETs",
        )  # fmt: skip
    else:
        result.figure(f"Ray's agent: wall of {n} creates", ray_wall, ray_wall, RAY_BASE, "s")
    result.measures = list(measures.values())
    result.notes.append(
        f"{sizes.stampede_rounds} rounds of {n} distinct envs (env_vars differ) sharing the "
        "large zip, created at once from cold; walls are medians"
    )
    return result


async def bench_peer_loop_blocking(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-loop-blocking")
    period = sizes.loop_period_s
    measures: dict[str, Measure] = {}

    async def probe(side: _Side, url: str) -> Measure:
        async with (
            RayHttpTarget(side.address, connections=1) as installer,
            RayHttpTarget(side.address, connections=1) as prober,
        ):
            create = asyncio.ensure_future(
                installer.create(_big_env(url, "l"), sizes.phase_timeout_s)
            )
            calls = await rpc.probe_info(
                prober, period, until=create, max_calls=int(sizes.phase_timeout_s / period),
                deadline_s=time.monotonic() + sizes.phase_timeout_s,
            )  # fmt: skip
            errors = calls.errors
            try:
                await create
            except rpc.CallFailed as exc:
                errors += 1
                result.notes.append(f"{side.name}: the install failed: {exc}")
        return Measure(side.name, calls.wall_s, len(calls.info_s), calls.info_s, errors=errors)

    sides = _sides(result)
    for r in range(sizes.loop_rounds):
        for which in _order(sides, r):
            m = await _measured(which, work, shared, f"loop{r}", probe)
            measures.setdefault(which, Measure(f"{which}: info, install running")).add(m)
    ray = measures[RAY].latencies_s
    base = f"{RAY_BASE}: the same probes during its install"
    if OURS in measures:
        ours = measures[OURS].latencies_s
        result.figure(
            "GetRuntimeEnvsInfo p99 while an install runs", percentile(ours, 0.99) * 1000,
            percentile(ray, 0.99) * 1000, base, "ms",
        )  # fmt: skip
        result.figure(
            "GetRuntimeEnvsInfo max while an install runs", max(ours, default=0) * 1000,
            max(ray, default=0) * 1000, base, "ms",
        )  # fmt: skip
    else:
        p99 = percentile(ray, 0.99) * 1000
        result.figure("Ray's agent: info p99 during an install", p99, p99, base, "ms")
    result.measures = list(measures.values())
    result.notes.append(
        f"{sizes.loop_rounds} rounds; GetRuntimeEnvsInfo(limit=1) every {period * 1000:g} ms "
        "over HTTP while a cold create of the large zip runs on the same agent"
    )
    return result


# -- churn -------------------------------------------------------------------------------------

CHURN_GOAL = 2.0  # issue 17: churn pairs/s at least 2x Ray's agent's, in the same run


async def bench_peer_churn(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-churn")
    server = await shared.server()
    sizes_by_key, envs, trace = await churn_inputs(sizes, shared)
    budget = sizes.churn_budget_bytes
    measures: dict[str, Measure] = {}
    for which in _sides(result):
        await asyncio.to_thread(read_all, shared.packages.glob("churn*.zip"))
        agent: AgentProcess | None = None
        if which == OURS:
            agent = AgentProcess(work / "agent", "--cache-budget", str(budget), ray_door=True)
            await agent.__aenter__()
            address, pid = agent.ray_address, agent.pid
        else:
            gib = f"{budget / 2**30:.9f}"
            node = await shared.ray_node(
                "churn", env={"RAY_RUNTIME_ENV_PY_MODULES_CACHE_SIZE_GB": gib}
            )
            address, pid = node.agent_address, node.agent_pid
        try:
            gets = await server.total_gets()
            watch = ProcWatch(pid)
            watch.start()
            async with RayHttpTarget(address, connections=sizes.churn_concurrency) as target:
                calls = await rpc.pairs(
                    target, lambda i: envs[trace[i]], len(trace), sizes.churn_concurrency,
                    deadline_s=time.monotonic() + sizes.phase_timeout_s,
                )  # fmt: skip
            usage = watch.stop()
        finally:
            if agent is not None:
                await agent.stop()
            else:
                await shared.stop_node("churn")
        if calls.error_sample:
            print(f"{which}: {calls.errors} errors, e.g. {calls.error_sample}", flush=True)
        m = Measure(which, calls.wall_s, 2 * calls.pairs, calls.create_s, usage.cpu_s)
        m.peak_rss_bytes = usage.peak_rss_bytes
        m.downloads = await server.total_gets() - gets
        m.errors = calls.errors
        measures[which] = m
    lru_hits, _ = lru_simulation(trace, sizes_by_key, budget)

    def rate(m: Measure) -> float:
        return m.requests / 2 / m.wall_s if m.wall_s else 0.0

    ray = measures[RAY]
    if OURS in measures:
        ours = measures[OURS]
        result.figure(
            f"pairs/s over HTTP, concurrency {sizes.churn_concurrency}", rate(ours), rate(ray),
            RAY_BASE, "pairs/s", Goal("ratio", ">=", CHURN_GOAL, f"ratio >= {CHURN_GOAL:g}x"),
        )  # fmt: skip
        result.figure(
            "downloads at the package server", ours.downloads or 0, ray.downloads or 0,
            f"{RAY_BASE}: its downloads", "GETs",
        )  # fmt: skip
        result.figure(
            "agent CPU per pair", (ours.cpu_s or 0) * 2000 / max(ours.requests, 1),
            (ray.cpu_s or 0) * 2000 / max(ray.requests, 1), f"{RAY_BASE}: its CPU per pair",
            "ms",
        )  # fmt: skip
    else:
        result.figure("Ray's agent: churn pairs/s", rate(ray), rate(ray), RAY_BASE, "pairs/s")
    result.measures = list(measures.values())
    result.notes.append(
        f"{len(trace)} pairs over {sizes.churn_zips} zips by Zipf({sizes.churn_zipf_s}), "
        f"budget {budget / 2**20:.1f} MiB for both "
        "(Ray's agent: RAY_RUNTIME_ENV_PY_MODULES_CACHE_SIZE_GB); "
        f"an exact LRU would download {len(trace) - lru_hits} times"
    )
    return result


# -- end to end: a real Ray node runs tasks ------------------------------------------------------


async def _e2e_zips(shared: Shared, count: int) -> str:
    server = await shared.server()
    for k in range(count):
        path = shared.packages / f"e2e{k}.zip"
        if not path.exists():
            await asyncio.to_thread(build_workdir_zip, path, f"e2e{k}", k)
    return server.base_url


async def _drive(node: RayNode, work: Path, base_url: str, sizes: Sizes) -> dict[str, Any]:
    """Run ``benchlib.ray_e2e`` against ``node``; its JSON report."""
    argv = [
        sys.executable, "-m", "benchlib.ray_e2e", "--address", node.gcs_address,
        "--base-url", base_url, "--zips", str(sizes.e2e_zips), "--envs", str(sizes.e2e_envs),
        "--tasks", str(sizes.e2e_tasks), "--timeout", str(sizes.phase_timeout_s),
    ]  # fmt: skip
    env = {**os.environ, **NODE_ENV, "PYTHONPATH": str(SCRIPTS)}
    log = work / f"driver-{node.name}.log"
    err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=err,
            env=env,
        )  # fmt: skip
    finally:
        os.close(err)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), sizes.phase_timeout_s + 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise BenchError(f"the Ray driver on {node.name} did not finish") from None
    if proc.returncode != 0:
        tail = log.read_bytes()[-2000:].decode(errors="replace")
        raise BenchError(f"the Ray driver on {node.name} exited with {proc.returncode}:\n{tail}")
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return report


async def bench_peer_e2e(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("peer-e2e")
    base_url = await _e2e_zips(shared, sizes.e2e_zips)
    server = await shared.server()
    sides = [RAY]
    problem = launcher_available()
    if problem:
        result.notes.append(f"{problem}: only Ray's agent measured")
    else:
        sides = [RAY, OURS_NODE]
    walls: dict[str, list[float]] = {}
    firsts: dict[str, list[float]] = {}
    measures: dict[str, Measure] = {}
    for r in range(sizes.e2e_rounds):
        # A B B A ...: a drift in the machine's load over the run hits both alike
        for which in sides if r % 2 == 0 else sides[::-1]:
            name = f"e2e-{'ray' if which == RAY else 'ours'}-{r}"
            node = await shared.ray_node(name, ours=which != RAY, num_cpus=sizes.e2e_cpus)
            try:
                gets = await server.total_gets()
                watch = ProcWatch(node.agent_pid)
                watch.start()
                report = await _drive(node, work, base_url, sizes)
                usage = watch.stop()
            finally:
                await shared.stop_node(name)
            m = Measure(which, report["wall_s"], report["tasks"], [report["first_s"]], usage.cpu_s)
            m.downloads = await server.total_gets() - gets
            m.errors = report["wrong"]
            measures.setdefault(which, Measure(which)).add(m)
            walls.setdefault(which, []).append(report["wall_s"])
            firsts.setdefault(which, []).append(report["first_s"])
            result.notes.append(
                f"round {r}, {which}: node up in {node.start_s:.1f}s; "
                f"wall {report['wall_s']:.1f}s, first task {report['first_s']:.2f}s; "
                f"{report['tasks']} tasks, "
                f"{report['workers']} worker processes, {report['wrong']} wrong results, "
                f"agent CPU {usage.cpu_s:.2f}s"
            )
    base = "the same driver on a Ray node with Ray's own agent"
    ray_wall = statistics.median(walls[RAY])
    if OURS_NODE in walls:
        result.figure(
            f"{sizes.e2e_tasks} tasks over {sizes.e2e_envs} envs: wall",
            statistics.median(walls[OURS_NODE]), ray_wall, base, "s",
        )  # fmt: skip
        result.figure(
            "time to first task", statistics.median(firsts[OURS_NODE]),
            statistics.median(firsts[RAY]), base, "s",
        )  # fmt: skip
        result.figure(
            "agent CPU over the runs", measures[OURS_NODE].cpu_s or 0.0,
            measures[RAY].cpu_s or 0.0, "Ray's own agent's CPU over the same driver's runs", "s",
        )  # fmt: skip
    else:
        result.figure("Ray's agent: wall", ray_wall, ray_wall, base, "s")
    result.measures = list(measures.values())
    result.notes.append(
        f"{sizes.e2e_rounds} rounds, medians, a new node each time; {sizes.e2e_tasks} tasks "
        f"submitted at once, {sizes.e2e_envs} runs of consecutive tasks with one env each; the "
        f"envs share {sizes.e2e_zips} http working_dir zips and differ by env_vars; a head node "
        f"with {sizes.e2e_cpus} CPUs; times from the first submission, after ray.init"
    )
    return result
