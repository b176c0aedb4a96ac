"""hot and persistence: cache-hit create+delete pairs through a real agent process over its unix
socket, next to a bare grpc.aio server answering the same requests with the same replies.

hot: one env is held (created once), so every pair is the agent's fast path. Each round runs,
for each server in turn (the order rotates per round), a phase at concurrency 1 (create
latency) and one at concurrency 64 (pairs per second), each after a short warm-up, with the
server's CPU read from /proc around the measured part.

persistence: the same phases on an agent with state.db and one without (--no-state-db).

grpc-routes: the same phases on the echo server served five ways (``echo_server.ROUTES``), to
choose how the agent's gRPC door serves the hot path.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc

from benchlib import rpc
from benchlib.config import Sizes
from benchlib.echo_server import ROUTES, SYNC_THREADS
from benchlib.figures import Goal, Measure, WorkloadResult, percentile
from benchlib.packages import build_small_zip
from benchlib.procs import (
    AgentProcess,
    EchoProcess,
    ProcWatch,
    ray_door_missing,
    uvloop_available,
)
from benchlib.ray_http import RayHttpTarget
from rtenv.v1 import agent_pb2

HIGH = 64


@dataclass
class Served:
    """One server under test and what its phases measured over the rounds.

    Throughput and CPU per RPC are the best round's: on a shared machine another job can only
    slow a round down (more time, more CPU per call through cache and scheduler churn), so the
    best of several interleaved rounds is the closest to what the server itself costs, and each
    server gets the same chance at a quiet round. Latencies are pooled over every round.
    """

    name: str
    address: str  # unix:PATH or host:port (gRPC), HOST:PORT (Ray's HTTP protocol)
    pid: int
    transport: Literal["grpc", "ray-http"] = "grpc"
    c1_create_s: list[float] = field(default_factory=list)
    c64_rates: list[float] = field(default_factory=list)
    c64_cpu_per_rpc_s: list[float] = field(default_factory=list)
    measure: Measure = field(init=False)

    def __post_init__(self) -> None:
        self.measure = Measure(self.name)

    @property
    def p50_ms(self) -> float:
        return percentile(self.c1_create_s, 0.5) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.c1_create_s, 0.99) * 1000

    @property
    def rate(self) -> float:
        return max(self.c64_rates)

    @property
    def cpu_ms_per_rpc(self) -> float:
        return min(self.c64_cpu_per_rpc_s) * 1000

    def rounds_text(self) -> str:
        rates = "/".join(f"{x:.0f}" for x in self.c64_rates)
        cpu = "/".join(f"{x * 1e6:.0f}" for x in self.c64_cpu_per_rpc_s)
        return f"{self.name}: {rates} pairs/s, {cpu} us CPU/RPC"


@asynccontextmanager
async def connect(server: Served, concurrency: int) -> AsyncIterator[rpc.Target]:
    """A client of ``server`` over its transport: a gRPC channel, or one keep-alive HTTP
    session with as many connections as calls in flight."""
    if server.transport == "grpc":
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield rpc.GrpcTarget(rpc.stub(channel))
    else:
        async with RayHttpTarget(server.address, connections=concurrency) as target:
            yield target


async def _phase(server: Served, env: str, pairs: int, concurrency: int, sizes: Sizes) -> None:
    deadline = time.monotonic() + sizes.phase_timeout_s
    async with connect(server, concurrency) as target:
        await rpc.pairs(
            target, lambda i: env, sizes.hot_warmup_pairs, concurrency, deadline_s=deadline
        )
        watch = ProcWatch(server.pid)
        watch.start()
        calls = await rpc.pairs(target, lambda i: env, pairs, concurrency, deadline_s=deadline)
        usage = watch.stop()
        if calls.error_sample:
            print(f"{server.name}: {calls.errors} errors, e.g. {calls.error_sample}", flush=True)
    rpcs = 2 * calls.pairs + calls.errors
    m = Measure(server.name, calls.wall_s, rpcs, [], usage.cpu_s, usage.peak_rss_bytes)
    m.errors = calls.errors
    if concurrency == 1:
        server.c1_create_s += calls.create_s
        m.latencies_s = calls.create_s
    else:
        server.c64_rates.append(calls.pairs / calls.wall_s)
        server.c64_cpu_per_rpc_s.append(usage.cpu_s / max(rpcs, 1))
    server.measure.add(m)


async def rounds(servers: list[Served], env: str, sizes: Sizes, count: int) -> None:
    """``count`` rounds; in each, every server in turn (the order rotates) runs a phase at
    concurrency 1 and one at ``HIGH``."""
    for r in range(count):
        order = servers[r % len(servers) :] + servers[: r % len(servers)]
        for server in order:
            await _phase(server, env, sizes.hot_pairs_c1, 1, sizes)
            await _phase(server, env, sizes.hot_pairs_c64, HIGH, sizes)


async def _hold(address: str, env: str) -> tuple[dict[str, str], str]:
    """Create the env once and keep that reference; return the agent's replies (hex) to a
    create, a delete and an info, for the echo server to answer with."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.stub(channel)
        request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env)
        held = await stub.CreateRuntimeEnv(request, timeout=60)
        created = await stub.CreateRuntimeEnv(request, timeout=60)
        deleted = await stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=created.runtime_env_id), timeout=60
        )
        info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(limit=1))
    replies = {
        "create": created.SerializeToString().hex(),
        "delete": deleted.SerializeToString().hex(),
        "info": info.SerializeToString().hex(),
    }
    return replies, held.runtime_env_id


async def hot_env(work: Path) -> str:
    pkg = work / "hot.zip"
    await asyncio.to_thread(build_small_zip, pkg, "hotmod", 1024, 7)
    return json.dumps({"py_modules": [f"file://{pkg}"], "env_vars": {"A": "1"}})


async def _cache(agent: AgentProcess, measure: Measure) -> None:
    cache = (await rpc.info(agent.address)).cache
    measure.downloads = cache.downloads  # file:// packages: the agent is the source
    measure.extractions = cache.extractions


async def bench_hot(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("hot")
    env = await hot_env(work)
    with_uvloop = sizes.uvloop and uvloop_available()
    async with AsyncExitStack() as stack:
        agent = await stack.enter_async_context(
            AgentProcess(work / "agent-root", ray_door=not ray_door_missing())
        )
        replies, _ = await _hold(agent.address, env)
        replies_path = work / "replies.json"
        replies_path.write_text(json.dumps(replies))
        echo = await stack.enter_async_context(EchoProcess(work, "echo", replies_path))
        servers = [
            Served("agent", agent.address, agent.pid),
            Served("echo", echo.address, echo.pid),
        ]
        agent_uv: AgentProcess | None = None
        if with_uvloop:
            uv = await stack.enter_async_context(
                EchoProcess(work, "echo-uvloop", replies_path, uvloop=True)
            )
            agent_uv = await stack.enter_async_context(
                AgentProcess(work / "agent-uvloop-root", uvloop=True)
            )
            await _hold(agent_uv.address, env)
            servers += [
                Served("echo on uvloop", uv.address, uv.pid),
                Served("agent on uvloop", agent_uv.address, agent_uv.pid),
            ]
        door: Served | None = None
        if agent.ray_address:  # the same agent process, through its Ray door
            door = Served("agent, Ray door (HTTP)", agent.ray_address, agent.pid, "ray-http")
            servers.append(door)
        await rounds(servers, env, sizes, sizes.hot_rounds)
        await _cache(agent, servers[0].measure)
        if agent_uv is not None:
            await _cache(agent_uv, servers[3].measure)
    a, e = servers[0], servers[1]
    echo_name = "bare grpc.aio server, same socket, messages and client code (echo)"
    result.figure(
        f"pairs/s, concurrency {HIGH}", a.rate, e.rate, f"{echo_name}: 2 calls a pair", "pairs/s",
        Goal("ratio", ">=", 1.0),
    )  # fmt: skip
    result.figure(
        f"server CPU per RPC, concurrency {HIGH}", a.cpu_ms_per_rpc, e.cpu_ms_per_rpc,
        f"{echo_name}: CPU per call", "ms", Goal("ratio", "<=", 1.2),
    )  # fmt: skip
    result.figure(
        "create p50 latency, concurrency 1", a.p50_ms, e.p50_ms, echo_name, "ms",
        Goal("ratio", "<=", 1.3),
    )  # fmt: skip
    result.figure("create p99 latency, concurrency 1", a.p99_ms, e.p99_ms, echo_name, "ms")
    if with_uvloop:
        eu, au = servers[2], servers[3]
        result.figure(
            f"echo on uvloop: pairs/s, concurrency {HIGH}", eu.rate, e.rate,
            "the same echo server on the default asyncio loop", "pairs/s",
        )  # fmt: skip
        result.figure(
            f"echo on uvloop: CPU per call, c{HIGH}", eu.cpu_ms_per_rpc, e.cpu_ms_per_rpc,
            "the same echo server on the default asyncio loop", "ms",
        )  # fmt: skip
        for base, base_name in ((e, "echo, default loop"), (eu, "echo on uvloop")):
            result.figure(
                f"agent on uvloop: pairs/s, c{HIGH} vs {base.name}", au.rate, base.rate,
                f"{base_name}: 2 calls a pair", "pairs/s",
            )  # fmt: skip
        result.figure(
            f"agent on uvloop: CPU per RPC, c{HIGH}", au.cpu_ms_per_rpc, e.cpu_ms_per_rpc,
            "echo, default loop: CPU per call", "ms",
        )  # fmt: skip
        result.figure(
            "agent on uvloop: create p50, c1", au.p50_ms, e.p50_ms, "echo, default loop", "ms"
        )
        result.notes.append(
            "agent on uvloop = the agent's own CLI started by a launcher that installs uvloop's "
            "event-loop policy first (the agent is unchanged)"
        )
    elif sizes.uvloop:
        result.notes.append("uvloop is not installed: only the default asyncio loop measured")
    if door is not None:
        grpc_door = "the same agent through its gRPC door"
        result.figure(
            f"Ray door (HTTP): pairs/s, concurrency {HIGH}", door.rate, a.rate, grpc_door,
            "pairs/s",
        )  # fmt: skip
        result.figure(
            f"Ray door (HTTP): CPU per request, c{HIGH}", door.cpu_ms_per_rpc,
            a.cpu_ms_per_rpc, grpc_door, "ms",
        )  # fmt: skip
        result.figure("Ray door (HTTP): create p50, c1", door.p50_ms, a.p50_ms, grpc_door, "ms")
        result.notes.append(
            "Ray door: Ray's HTTP protocol (protobuf bodies) over keep-alive HTTP/1.1 connections "
            "(benchlib/ray_http.py's minimal client), to the same agent process "
            "(serve --ray-address)"
        )
    else:
        result.notes.append(f"{ray_door_missing()}: its Ray door was not measured")
    result.measures = [s.measure for s in servers]
    round_notes(result, servers, sizes, paired=(a, e))
    return result


def round_notes(
    result: WorkloadResult, servers: list[Served], sizes: Sizes,
    paired: tuple[Served, Served] | None = None,
) -> None:  # fmt: skip
    result.notes.append(
        f"{sizes.hot_rounds} interleaved rounds, each {sizes.hot_pairs_c1} pairs at c1 and "
        f"{sizes.hot_pairs_c64} at c{HIGH} per server after {sizes.hot_warmup_pairs} warm-up "
        "pairs; pairs/s and CPU per RPC are the best round's, latencies pooled (c1 creates)"
    )
    result.notes.append("rounds at c64: " + "; ".join(s.rounds_text() for s in servers))
    if paired is not None:
        result.notes.append(paired_text(*paired))


def paired_text(a: Served, b: Served) -> str:
    """``a`` against ``b`` round by round (each round's two phases ran seconds apart, under
    the same load): the ratios and their median. The best rounds of each (the figures) may
    come from different rounds, so one quiet round of one side moves them; the median of the
    paired ratios is what the rounds say together."""
    rates = [x / y for x, y in zip(a.c64_rates, b.c64_rates, strict=True)]
    cpus = [x / y for x, y in zip(a.c64_cpu_per_rpc_s, b.c64_cpu_per_rpc_s, strict=True)]

    def text(ratios: list[float]) -> str:
        each = "/".join(f"{r:.2f}" for r in ratios)
        return f"{each}, median {statistics.median(ratios):.2f}x" if ratios else "none"

    return (
        f"{a.name} / {b.name} paired by round at c{HIGH}: pairs/s {text(rates)}; "
        f"CPU per RPC {text(cpus)}"
    )


async def bench_persistence(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("persistence")
    env = await hot_env(work)
    async with AsyncExitStack() as stack:
        with_db = await stack.enter_async_context(AgentProcess(work / "db-root"))
        no_db = await stack.enter_async_context(AgentProcess(work / "nodb-root", "--no-state-db"))
        servers = [
            Served("agent with state.db", with_db.address, with_db.pid),
            Served("agent --no-state-db", no_db.address, no_db.pid),
        ]
        for agent in (with_db, no_db):
            await _hold(agent.address, env)
        await rounds(servers, env, sizes, sizes.hot_rounds)
        for agent, server in zip((with_db, no_db), servers, strict=True):
            await _cache(agent, server.measure)
    d, n = servers
    base = "the same agent without state.db (--no-state-db)"
    result.figure(
        f"hot pairs/s, concurrency {HIGH}", d.rate, n.rate, base, "pairs/s",
        Goal("ratio", ">=", 0.9, "costs < 10%: ratio >= 0.9x"),
    )  # fmt: skip
    result.figure("hot create p50, concurrency 1", d.p50_ms, n.p50_ms, base, "ms")
    result.figure(
        f"server CPU per RPC, concurrency {HIGH}", d.cpu_ms_per_rpc, n.cpu_ms_per_rpc, base, "ms"
    )
    result.measures = [s.measure for s in servers]
    round_notes(result, servers, sizes)
    return result


async def bench_grpc_routes(work: Path, sizes: Sizes) -> WorkloadResult:
    """The ways Python gRPC can serve the hot path, each as the bare echo server answering the
    agent's own replies: grpc.aio with a generic handler (raw bytes in, prepared bytes out, the
    request still parsed) and the sync server in a thread pool, against grpc.aio with the
    generated servicer (the hot workload's baseline), in interleaved rounds of one run."""
    result = WorkloadResult("grpc-routes")
    env = await hot_env(work)
    async with AsyncExitStack() as stack:
        agent = await stack.enter_async_context(AgentProcess(work / "agent-root"))
        replies, _ = await _hold(agent.address, env)  # the agent answers once, then idles
        replies_path = work / "replies.json"
        replies_path.write_text(json.dumps(replies))
        servers: list[Served] = []
        for route in ROUTES:
            echo = await stack.enter_async_context(
                EchoProcess(work, f"echo-{route}", replies_path, route=route)
            )
            servers.append(Served(f"echo, {_ROUTE_NAMES[route]}", echo.address, echo.pid))
        await rounds(servers, env, sizes, sizes.hot_rounds)
    base = servers[0]
    for route, server in zip(ROUTES[1:], servers[1:], strict=True):
        name = _ROUTE_NAMES[route]
        result.figure(f"{name}: pairs/s, c{HIGH}", server.rate, base.rate, base.name, "pairs/s")
        result.figure(
            f"{name}: CPU per RPC, c{HIGH}", server.cpu_ms_per_rpc, base.cpu_ms_per_rpc,
            base.name, "ms",
        )  # fmt: skip
        result.figure(f"{name}: create p50, c1", server.p50_ms, base.p50_ms, base.name, "ms")
    result.notes.append(
        "each echo answers the agent's own reply bytes to the same requests; the generic "
        "handler parses each request (FromString) and answers prepared bytes (looked up through "
        "a generic handler, or registered by method as generated code does); the sync server "
        f"runs the generated servicer in a pool of {SYNC_THREADS} threads, alone or handing "
        "each call to an event loop in another thread (where the agent's state lives)"
    )
    result.measures = [s.measure for s in servers]
    round_notes(result, servers, sizes)
    return result


_ROUTE_NAMES = {
    "servicer": "grpc.aio + generated servicer",
    "generic": "grpc.aio + generic handler (bytes)",
    "registered": "grpc.aio + registered bytes handlers",
    "sync": "sync grpc.server + thread pool",
    "sync-loop": "sync grpc.server, calls run on an event loop",
}
