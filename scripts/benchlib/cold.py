"""cold-large, stampede and loop-blocking: the large zip, over http from the package server (a
child process on 127.0.0.1), into agents with empty caches.

Before anything is timed the package is read through (the page cache drops files not read for
a few seconds), and every agent gets a fresh root; nothing is deleted until the end of the run.

loop-blocking's probes measure what a client sees, which on a shared machine of 2 cores is also
the machine: the client's own process, the install's worker processes and anything else running
compete for the cores. Two more things are reported beside them, so that a latency can be told
from a blocked loop: the same probes against a bare grpc.aio server (``benchlib.echo_server``,
its handlers registered by method as the agent's are, answering the agent's own reply) in the
same rounds, the floor of the client, the transport and the machine at that moment, both on the
idle machine and during each install (its probes half a period after the agent's, so the two
never share a slot: the floor the install leaves any server, which the agent's tail is set
against); and the
agent's event loop itself, timed from inside its process (``_STEP_TIMER``): each step of the
loop (one callback: an RPC's handler resuming, an install's coroutine between two awaits, a
garbage collection it triggers) with its wall time and the loop thread's CPU time, which a
loaded machine does not inflate. A step is what every call waits behind.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchlib import rpc
from benchlib.baselines import CURL, aiohttp_zipfile, curl_unzip
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, percentile
from benchlib.procs import (
    AgentProcess,
    EchoProcess,
    PackageServer,
    read_through,
    uvloop_available,
)
from benchlib.shared import BigPackage, Shared
from rtenv.v1 import agent_pb2, agent_pb2_grpc


def _env(url: str, tag: str) -> str:
    return json.dumps({"working_dir": url, "env_vars": {"BENCH": tag}})


async def _cold_create(
    root: Path,
    big: BigPackage,
    shared: Shared,
    sizes: Sizes,
    name: str = "agent cold create",
    *flags: str,
    server: PackageServer | None = None,
) -> Measure:
    """One create of an env on the large zip, by a new agent on an empty root (started with
    ``flags``), from ``server`` (the shared one by default: ``big.url``'s)."""
    url = big.url if server is None else f"{server.base_url}/{big.path.name}"
    server = server or await shared.server()
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
                    agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=_env(url, "1")),
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
    await _over_a_link(work, big, shared, sizes, result)
    return result


async def _over_a_link(
    work: Path, big: BigPackage, shared: Shared, sizes: Sizes, result: WorkloadResult
) -> None:
    """The same creates from a package server limited to ``cold_link_rate`` bytes/s (a real
    network: the download takes longer than the machine needs to unpack what arrived), where
    extracting while downloading should hide most of the extraction: the agent with and
    without it, and aiohttp + zipfile, interleaved; no goal."""
    rate = sizes.cold_link_rate
    rounds = max(sizes.cold_rounds // 2, 1)
    walls: dict[str, list[float]] = {"on": [], "off": [], "aiohttp": []}
    async with PackageServer(big.path.parent, work / "link-server.log", rate=rate) as server:
        url = f"{server.base_url}/{big.path.name}"
        for r in range(rounds):
            steps = ["on", "off", "aiohttp"]
            for step in steps[r % 3 :] + steps[: r % 3]:
                root = work / f"link-{step}-{r}"
                if step == "aiohttp":
                    m, _ = await aiohttp_zipfile(url, root, sizes.phase_timeout_s)
                else:
                    flags = ("--overlap-downloads", "false") if step == "off" else ()
                    m = await _cold_create(root, big, shared, sizes, step, *flags, server=server)
                walls[step].append(m.wall_s)
    link = f"over a {rate / 2**20:g} MiB/s link"
    floor = big.zip_bytes / rate
    on = statistics.median(walls["on"])
    result.figure(
        f"cold create {link}, vs overlap off", on, statistics.median(walls["off"]),
        "the same agent with --overlap-downloads false, the same limited server", "s",
    )  # fmt: skip
    result.figure(
        f"cold create {link}, vs aiohttp", on, statistics.median(walls["aiohttp"]),
        "sequential aiohttp download + zipfile.extractall, the same limited server", "s",
    )  # fmt: skip
    result.figure(
        f"cold create {link}, vs the link's floor", on, floor,
        "the zip's bytes / the rate: the download alone", "s",
    )  # fmt: skip
    result.notes.append(
        f"{link}: {rounds} rounds, medians; walls: overlap on "
        f"{', '.join(f'{w:.2f}' for w in walls['on'])}s, off "
        f"{', '.join(f'{w:.2f}' for w in walls['off'])}s, aiohttp+zipfile "
        f"{', '.join(f'{w:.2f}' for w in walls['aiohttp'])}s"
    )


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


# Runs the agent's CLI (``python -c _STEP_TIMER STEPS_FILE serve ...``) with every step of its
# event loop timed: asyncio runs each callback through ``Handle._run``. Kept: steps of 0.5 ms
# or more (wall), and the step of most CPU of every 100 ms, each with when it began
# (time.monotonic: the same clock as the bench's), its wall time and the loop thread's CPU
# time; written as JSON at exit (the agent's graceful stop on SIGTERM). About 1 us a step.
_STEP_TIMER = """
import atexit, json, sys, time
import asyncio.events
out = sys.argv.pop(1)
steps, best = [], {}
run, clock, cpu = asyncio.events.Handle._run, time.monotonic, time.thread_time
def timed(self):
    t0, c0 = clock(), cpu()
    run(self)
    wall, used = clock() - t0, cpu() - c0
    if wall >= 0.0005 and len(steps) < 200000:
        steps.append((t0, wall, used))
    slot = int(t0 * 10)
    if used > best.get(slot, (0, 0, -1))[2]:
        best[slot] = (t0, wall, used)
asyncio.events.Handle._run = timed
def dump():
    kept = set(steps)
    with open(out, "w") as f:
        json.dump({"steps": steps + [s for s in best.values() if s not in kept]}, f)
atexit.register(dump)
from agent.launcher.main import main
sys.exit(main(sys.argv[1:]))
"""


class _StepTimedAgent(AgentProcess):
    """The agent, its event loop's steps timed (``_STEP_TIMER``) into ``steps``."""

    def __init__(self, root: Path, steps: Path) -> None:
        super().__init__(root)
        assert self.argv[1:3] == ["-m", "agent"], self.argv
        self.argv = [self.argv[0], "-c", _STEP_TIMER, str(steps), *self.argv[3:]]
        self.steps = steps

    def read_steps(self) -> list[tuple[float, float, float]]:
        """(start, wall s, CPU s) of each step of 0.5 ms or more, and of the longest (CPU) of
        every 100 ms; [] if none were written (the agent did not exit through its graceful
        stop)."""
        try:
            data = json.loads(self.steps.read_text())
        except (OSError, ValueError):
            return []
        return [(float(t), float(w), float(c)) for t, w, c in data["steps"]]


@dataclass
class _Steps:
    """The loop's steps of one phase, pooled over rounds."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    rounds: int = 0  # rounds whose steps were read

    def add(self, steps: list[tuple[float, float, float]], start: float, end: float) -> None:
        for t, wall, cpu in steps:
            if start <= t < end:
                self.wall_s.append(wall)
                self.cpu_s.append(cpu)

    def over(self, cpu_s: float) -> int:
        return sum(1 for c in self.cpu_s if c > cpu_s)

    def text(self) -> str:
        if not self.rounds:  # no file (not a graceful exit), or no step of asyncio's loop
            return "not read (uvloop runs no asyncio Handle)" if uvloop_available() else "not read"
        worst = max(range(len(self.cpu_s)), key=self.cpu_s.__getitem__, default=None)
        longest = "no step" if worst is None else (
            f"longest {self.cpu_s[worst] * 1000:.1f} ms CPU ({self.wall_s[worst] * 1000:.1f} ms "
            f"wall), longest wall {max(self.wall_s) * 1000:.1f} ms"
        )  # fmt: skip
        return f"{longest}; over 1 ms CPU: {self.over(0.001)}, over 5 ms: {self.over(0.005)}"


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
    echo_m = Measure("info probes, bare grpc echo")
    echo_busy_m = Measure("echo probes, install running")
    idle_steps, busy_steps = _Steps(), _Steps()
    install_s: list[float] = []
    period = sizes.loop_period_s
    echo: EchoProcess | None = None
    echo_channel: grpc.aio.Channel | None = None
    try:
        for r in range(sizes.loop_rounds):
            agent = _StepTimedAgent(work / f"agent-{r}", work / f"agent-{r}.steps.json")
            phases: list[tuple[_Steps, float, float]] = []
            async with agent, grpc.aio.insecure_channel(agent.address) as channel:
                stub = rpc.stub(channel)
                await _warm(stub)  # connected before the first slot, as the echo's channel is
                deadline = time.monotonic() + sizes.phase_timeout_s
                if echo is None:  # answering the agent's own idle reply, registered by method
                    echo = await _echo(work, agent.address)
                    echo_channel = grpc.aio.insecure_channel(echo.address)
                    await _warm(rpc.stub(echo_channel))
                assert echo_channel is not None
                echo_stub = rpc.stub(echo_channel)
                if r % 2 == 1:  # the echo's probes before the agent's or after, by turns
                    echo_m.add(await _probe_echo(echo, echo_stub, sizes, period, deadline))
                watch = agent.watch()
                watch.start()
                started = time.monotonic()
                idle = await rpc.probe_info(
                    stub, period, until=None, max_calls=sizes.loop_idle_calls, deadline_s=deadline
                )
                phases.append((idle_steps, started, time.monotonic()))
                usage = watch.stop()
                idle_m.add(
                    Measure(idle_m.name, idle.wall_s, len(idle.info_s), idle.info_s, usage.cpu_s,
                            usage.peak_rss_bytes, errors=idle.errors)
                )  # fmt: skip
                if r % 2 == 0:
                    echo_m.add(await _probe_echo(echo, echo_stub, sizes, period, deadline))
                await asyncio.to_thread(read_through, big.path)
                gets = await server.total_gets()
                watch.start()
                t0 = time.perf_counter()
                started = time.monotonic()
                env = _env(big.url, "l")
                request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env)
                create = asyncio.ensure_future(
                    stub.CreateRuntimeEnv(request, timeout=sizes.phase_timeout_s)
                )
                create.add_done_callback(_timer(install_s, t0))
                beside = asyncio.ensure_future(  # the floor beside it, in the same moments
                    _probe_echo(
                        echo, echo_stub, sizes, period, deadline, until=create, offset_s=period / 2
                    )
                )
                busy = await rpc.probe_info(
                    stub, period, until=create, max_calls=int(sizes.phase_timeout_s / period),
                    deadline_s=deadline,
                )  # fmt: skip
                echo_busy_m.add(await beside)
                errors = busy.errors
                try:
                    await create
                except grpc.aio.AioRpcError as exc:
                    errors += 1
                    result.notes.append(f"the install failed: {exc.code().name}: {exc.details()}")
                phases.append((busy_steps, started, time.monotonic()))
                usage = watch.stop()
                cache = (await rpc.info(agent.address)).cache
                m = Measure(busy_m.name, busy.wall_s, len(busy.info_s), busy.info_s, usage.cpu_s,
                            usage.peak_rss_bytes, errors=errors)  # fmt: skip
                m.downloads = await server.total_gets() - gets
                m.extractions = cache.extractions
                busy_m.add(m)
            steps = agent.read_steps()  # written at its exit
            if steps:
                for into, start, end in phases:
                    into.add(steps, start, end)
                    into.rounds += 1
    finally:
        if echo_channel is not None:
            await echo_channel.close()
        if echo is not None:
            await echo.stop()
    busy_lat, idle_lat = busy_m.latencies_s, idle_m.latencies_s
    beside_lat = echo_busy_m.latencies_s
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
    floor = (
        "a bare grpc.aio echo probed in the same moments (its calls between the agent's), "
        "the floor this machine gives any server during the install"
    )
    result.figure(
        "GetRuntimeEnvsInfo p99 while an install runs, against the echo beside it",
        percentile(busy_lat, 0.99) * 1000, percentile(beside_lat, 0.99) * 1000, floor, "ms",
    )  # fmt: skip
    result.figure(
        "GetRuntimeEnvsInfo max while an install runs, against the echo beside it",
        max(busy_lat, default=0) * 1000, max(beside_lat, default=0) * 1000, floor, "ms",
    )  # fmt: skip
    if busy_steps.rounds:
        result.figure(
            "longest event-loop step while an install runs (CPU)",
            max(busy_steps.cpu_s, default=0) * 1000, max(idle_steps.cpu_s, default=0) * 1000,
            "the same on the idle agent (the loop thread's CPU time of one step)", "ms",
        )  # fmt: skip
    result.measures = [idle_m, busy_m, echo_m, echo_busy_m]
    result.notes.append(
        f"{sizes.loop_rounds} rounds; installs took {', '.join(f'{s:.2f}s' for s in install_s)}; "
        "CPU per request is the agent's CPU (install included) per probe"
    )
    result.notes.append(
        "echo: the same probes in the same rounds against a bare grpc.aio server answering "
        "the agent's own idle reply (handlers registered by method, as the agent's): the "
        "floor of the client, the transport and the machine at that moment"
    )
    result.notes.append(
        f"the agent's event-loop steps (a callback each), timed inside it ({busy_steps.rounds} "
        f"of {sizes.loop_rounds} rounds read): idle: {idle_steps.text()}; install running: "
        f"{busy_steps.text()}"
    )
    return result


async def _echo(work: Path, agent_address: str) -> EchoProcess:
    info = await rpc.info(agent_address)
    replies = {"create": "", "delete": "", "info": info.SerializeToString().hex()}
    path = work / "loop-echo-replies.json"
    path.write_text(json.dumps(replies))
    return await EchoProcess(work, "loop-echo", path, route="registered").__aenter__()


async def _warm(stub: agent_pb2_grpc.RuntimeEnvAgentStub) -> None:
    await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(limit=1), timeout=30)


async def _probe_echo(
    echo: EchoProcess,
    stub: agent_pb2_grpc.RuntimeEnvAgentStub,
    sizes: Sizes,
    period: float,
    deadline: float,
    *,
    until: asyncio.Future[Any] | None = None,
    offset_s: float = 0.0,
) -> Measure:
    """The echo's probes: ``loop_idle_calls`` of them, or (``until``) while an install runs,
    their slots ``offset_s`` after the agent's."""
    watch = echo.watch()
    watch.start()
    if offset_s:
        await asyncio.sleep(offset_s)
    calls = await rpc.probe_info(
        stub, period,
        until=until, max_calls=sizes.loop_idle_calls if until is None else 1_000_000,
        deadline_s=deadline,
    )  # fmt: skip
    usage = watch.stop()
    name = "info probes, bare grpc echo" if until is None else "echo probes, install running"
    return Measure(name, calls.wall_s, len(calls.info_s), calls.info_s, usage.cpu_s,
                   usage.peak_rss_bytes, errors=calls.errors)  # fmt: skip
