"""cold-large, stampede and loop-blocking: the large zip, over http from the package server (a
child process on 127.0.0.1), into agents with empty caches.

Before anything is timed the package is read through (the page cache drops files not read for
a few seconds), and every agent gets a fresh root; nothing is deleted until the end of the run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.baselines import CURL, aiohttp_zipfile, curl_unzip
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, percentile
from benchlib.procs import AgentProcess, read_through
from benchlib.shared import BigPackage, Shared
from rtenv.v1 import agent_pb2


def _env(url: str, tag: str) -> str:
    return json.dumps({"working_dir": url, "env_vars": {"BENCH": tag}})


async def _cold_create(
    root: Path,
    big: BigPackage,
    shared: Shared,
    sizes: Sizes,
    name: str = "agent cold create",
    *flags: str,
) -> Measure:
    """One create of an env on the large zip, by a new agent on an empty root (started with
    ``flags``)."""
    server = await shared.server()
    await asyncio.to_thread(read_through, big.path)
    async with AgentProcess(root, *flags) as agent:
        gets = await server.total_gets()
        watch = agent.watch()
        watch.start()
        t0 = time.perf_counter()
        errors = 0
        async with grpc.aio.insecure_channel(agent.address) as channel:
            try:
                await rpc.stub(channel).CreateRuntimeEnv(
                    agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=_env(big.url, "1")),
                    timeout=sizes.phase_timeout_s,
                )
            except grpc.aio.AioRpcError as exc:
                errors = 1
                print(f"cold create failed: {exc.code().name}: {exc.details()}", flush=True)
        wall = time.perf_counter() - t0
        usage = watch.stop()
        cache = (await rpc.info(agent.address)).cache
        m = Measure(name, wall, 1, [wall], usage.cpu_s, usage.peak_rss_bytes)
        m.downloads = await server.total_gets() - gets
        m.extractions = cache.extractions
        m.errors = errors
    return m


_LATE = "agent, overlap off"


async def bench_cold_large(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("cold-large")
    big = await shared.big()
    server = await shared.server()
    agent_m = Measure("agent cold create")
    late_m = Measure(_LATE)
    aio_m, curl_m = Measure("aiohttp + zipfile"), Measure("curl + unzip")
    agent_s: list[float] = []
    late_s: list[float] = []
    aio_s: list[float] = []
    curl_s: list[float] = []
    splits: list[str] = []
    for r in range(sizes.cold_rounds):
        steps = ["agent", "late", "aiohttp"] + (["curl"] if CURL is not None else [])
        k = r % len(steps)
        for step in steps[k:] + steps[:k]:  # the order rotates, so drift hits all alike
            if step == "agent":
                m = await _cold_create(work / f"agent-{r}", big, shared, sizes)
                agent_m.add(m)
                agent_s.append(m.wall_s)
                continue
            if step == "late":  # what extracting while downloading buys
                flag = ("--overlap-downloads", "false")
                m = await _cold_create(work / f"late-{r}", big, shared, sizes, _LATE, *flag)
                late_m.add(m)
                late_s.append(m.wall_s)
                continue
            await asyncio.to_thread(read_through, big.path)
            gets = await server.total_gets()
            if step == "aiohttp":
                m, split = await aiohttp_zipfile(big.url, work / f"aio-{r}", sizes.phase_timeout_s)
                splits.append(split)
                aio_s.append(m.wall_s)
                target = aio_m
            else:
                m, note = await curl_unzip(big.url, work / f"curl-{r}", sizes.phase_timeout_s)
                if note and note not in result.notes:
                    result.notes.append(note)
                curl_s.append(m.wall_s)
                curl_m.name = m.name
                target = curl_m
            m.downloads = await server.total_gets() - gets
            target.add(m)
    result.figure(
        f"cold create, {big.label()}, vs aiohttp", statistics.median(agent_s),
        statistics.median(aio_s),
        "sequential aiohttp download + zipfile.extractall of the same file", "s",
        Goal("ratio", "<=", 0.7),
    )  # fmt: skip
    result.figure(
        f"cold create, {big.label()}, vs overlap off", statistics.median(agent_s),
        statistics.median(late_s), "the same agent with --overlap-downloads false", "s",
    )  # fmt: skip
    result.measures = [agent_m, late_m, aio_m]
    if curl_s:
        result.figure(
            f"cold create, {big.label()}, vs {curl_m.name}", statistics.median(agent_s),
            statistics.median(curl_s), f"{curl_m.name} of the same file (curl -o; unzip -q)", "s",
            Goal("ratio", "<=", 0.6),
        )  # fmt: skip
        result.measures.append(curl_m)
    else:
        result.notes.append("curl is not installed: the curl + unzip baseline was left out")
    result.notes.append(
        f"{sizes.cold_rounds} rounds, medians; {big.unpacked_bytes / 2**20:.0f} MB unpacked; "
        f"aiohttp+zipfile split: {'; '.join(splits)}"
    )
    return result


async def _stampede(
    root: Path, big: BigPackage, shared: Shared, sizes: Sizes, name: str
) -> Measure:
    """``stampede_envs`` distinct envs on the large zip, created at once by a new agent."""
    n = sizes.stampede_envs
    server = await shared.server()
    await asyncio.to_thread(read_through, big.path)
    async with AgentProcess(root) as agent:
        gets = await server.total_gets()
        watch = agent.watch()
        watch.start()
        async with grpc.aio.insecure_channel(agent.address) as channel:
            calls, _ = await rpc.creates(
                rpc.stub(channel), lambda i: _env(big.url, f"s{i}"), n, n,
                deadline_s=time.monotonic() + sizes.phase_timeout_s,
            )  # fmt: skip
        usage = watch.stop()
        cache = (await rpc.info(agent.address)).cache
        m = Measure(name, calls.wall_s, n, calls.create_s, usage.cpu_s, usage.peak_rss_bytes)
        m.downloads = await server.total_gets() - gets
        m.extractions = cache.extractions
        m.errors = calls.errors
    return m


async def bench_stampede(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("stampede")
    big = await shared.big()
    n = sizes.stampede_envs
    single_m = Measure("one cold create")
    many_m = Measure(f"{n} concurrent cold creates")
    singles: list[float] = []
    walls: list[float] = []
    downloads: list[int] = []
    extractions: list[int] = []
    for r in range(sizes.stampede_rounds):
        for step in ("single", "stampede") if r % 2 == 0 else ("stampede", "single"):
            if step == "single":
                m = await _cold_create(work / f"single-{r}", big, shared, sizes, single_m.name)
                single_m.add(m)
                singles.append(m.wall_s)
                continue
            m = await _stampede(work / f"stampede-{r}", big, shared, sizes, many_m.name)
            many_m.add(m)
            walls.append(m.wall_s)
            downloads.append(m.downloads or 0)
            extractions.append(m.extractions or 0)
    result.figure(
        f"wall of {n} concurrent creates, one zip", statistics.median(walls),
        statistics.median(singles), "one cold create of the same zip", "s",
        Goal("ratio", "<=", 1.05),
    )  # fmt: skip
    result.figure(
        f"p99 create latency of the {n}", percentile(many_m.latencies_s, 0.99) * 1000,
        statistics.median(singles) * 1000, "one cold create of the same zip", "ms",
    )  # fmt: skip
    result.figure(
        "downloads at the package server, worst round", max(downloads), 1,
        "one download", "GETs", Goal("value", "==", 1),
    )  # fmt: skip
    result.figure(
        "extractions (the agent's count), worst round", max(extractions), 1,
        "one extraction", "zips", Goal("value", "==", 1),
    )  # fmt: skip
    result.measures = [single_m, many_m]
    return result


def _timer(into: list[float], t0: float) -> Callable[[object], None]:
    """A done-callback that notes how long since ``t0`` the future took."""

    def done(_: object) -> None:
        into.append(time.perf_counter() - t0)

    return done


async def bench_loop_blocking(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("loop-blocking")
    big = await shared.big()
    server = await shared.server()
    idle_m = Measure("info probes, idle agent")
    busy_m = Measure("info probes, install running")
    install_s: list[float] = []
    period = sizes.loop_period_s
    for r in range(sizes.loop_rounds):
        async with (
            AgentProcess(work / f"agent-{r}") as agent,
            grpc.aio.insecure_channel(agent.address) as channel,
        ):
            stub = rpc.stub(channel)
            deadline = time.monotonic() + sizes.phase_timeout_s
            watch = agent.watch()
            watch.start()
            idle = await rpc.probe_info(
                stub, period, until=None, max_calls=sizes.loop_idle_calls, deadline_s=deadline
            )
            usage = watch.stop()
            idle_m.add(
                Measure(idle_m.name, idle.wall_s, len(idle.info_s), idle.info_s, usage.cpu_s,
                        usage.peak_rss_bytes, errors=idle.errors)
            )  # fmt: skip
            await asyncio.to_thread(read_through, big.path)
            gets = await server.total_gets()
            watch.start()
            t0 = time.perf_counter()
            create = asyncio.ensure_future(
                stub.CreateRuntimeEnv(
                    agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=_env(big.url, "l")),
                    timeout=sizes.phase_timeout_s,
                )
            )
            create.add_done_callback(_timer(install_s, t0))
            busy = await rpc.probe_info(
                stub, period, until=create, max_calls=int(sizes.phase_timeout_s / period),
                deadline_s=deadline,
            )  # fmt: skip
            errors = busy.errors
            try:
                await create
            except grpc.aio.AioRpcError as exc:
                errors += 1
                result.notes.append(f"the install failed: {exc.code().name}: {exc.details()}")
            usage = watch.stop()
            cache = (await rpc.info(agent.address)).cache
            m = Measure(busy_m.name, busy.wall_s, len(busy.info_s), busy.info_s, usage.cpu_s,
                        usage.peak_rss_bytes, errors=errors)  # fmt: skip
            m.downloads = await server.total_gets() - gets
            m.extractions = cache.extractions
            busy_m.add(m)
    busy_lat, idle_lat = busy_m.latencies_s, idle_m.latencies_s
    base = f"the same calls on the idle agent, every {period * 1000:g} ms"
    result.figure(
        "GetRuntimeEnvsInfo p99 while an install runs", percentile(busy_lat, 0.99) * 1000,
        percentile(idle_lat, 0.99) * 1000, base, "ms", Goal("value", "<", 2),
    )  # fmt: skip
    result.figure(
        "GetRuntimeEnvsInfo max while an install runs", max(busy_lat, default=0) * 1000,
        max(idle_lat, default=0) * 1000, base, "ms", Goal("value", "<", 10),
    )  # fmt: skip
    result.figure(
        "GetRuntimeEnvsInfo p50 while an install runs", percentile(busy_lat, 0.5) * 1000,
        percentile(idle_lat, 0.5) * 1000, base, "ms",
    )  # fmt: skip
    result.measures = [idle_m, busy_m]
    result.notes.append(
        f"{sizes.loop_rounds} rounds; installs took {', '.join(f'{s:.2f}s' for s in install_s)}; "
        "CPU per request is the agent's CPU (install included) per probe"
    )
    return result
