"""worker-starts: raylet_sim's pool starts short-lived workers over envs whose packages are
already installed, against the same python processes spawned with no env machinery.

Each start is the pool's ``pop_worker`` (the env's context from the pool's slot, or a
CreateRuntimeEnv when the slot is new; the spawn with that context; the worker's ready line);
then the worker's stdin is closed, it exits, and the pool's reaper uncounts it (the last one of
a slot calls DeleteRuntimeEnv). RPCs are counted by the pool's own AgentClient.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.baselines import bare_workers
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, percentile
from benchlib.packages import build_small_zip, build_workdir_zip
from benchlib.procs import AgentProcess
from raylet_sim.client import AgentClient
from raylet_sim.pool import TaskFailed, Worker, WorkerPool
from rtenv.v1 import agent_pb2


def _build(directory: Path, n: int) -> list[str]:
    envs = []
    for j in range(n):
        wd, mod = directory / f"wapp{j}.zip", directory / f"wlib{j}.zip"
        build_workdir_zip(wd, f"wapp{j}", j)
        build_small_zip(mod, f"wlib{j}", 2048, j)
        env = {
            "working_dir": f"file://{wd}",
            "py_modules": [f"file://{mod}"],
            "env_vars": {"WORKER_ENV": str(j)},
        }
        envs.append(json.dumps(env))
    return envs


Context = tuple[dict[str, str], str]  # a worker's variables and cwd, as the agent gave them


async def _install(address: str, envs: list[str]) -> list[Context]:
    """Create and delete each env once: its packages stay cached (unused, within budget).
    Return each env's context."""
    contexts = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.stub(channel)
        for env in envs:
            reply = await stub.CreateRuntimeEnv(
                agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env), timeout=60
            )
            await stub.DeleteRuntimeEnv(
                agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=reply.runtime_env_id), timeout=60
            )
            contexts.append((dict(reply.context.env_vars), reply.context.cwd))
    return contexts


async def _end(worker: Worker) -> None:
    """A short-lived worker: close its stdin (it exits at EOF); SIGKILL it if it lingers."""
    stdin = worker.process.stdin
    if stdin is not None and not stdin.is_closing():
        stdin.close()
    try:
        await asyncio.wait_for(worker.process.wait(), 30)
    except TimeoutError:
        worker.process.kill()
        await worker.process.wait()


async def _pool_starts(agent: AgentProcess, keys: list[str], sizes: Sizes) -> tuple[Measure, int]:
    latencies: list[float] = []
    errors = 0
    issued = 0
    deadline = time.monotonic() + sizes.phase_timeout_s
    async with grpc.aio.insecure_channel(agent.address) as channel:
        client = AgentClient(channel)
        # envs kept 5 s after their last worker, as a scheduler keeps a warm env: a short-lived
        # worker then does not cost a create and a delete at the agent
        pool = WorkerPool(
            client,
            idle_timeout_s=60.0,
            worker_stderr=asyncio.subprocess.DEVNULL,
            env_keepalive_s=5.0,
        )

        async def runner() -> None:
            nonlocal issued, errors
            while issued < len(keys) and time.monotonic() < deadline:
                key = keys[issued]
                issued += 1
                t0 = time.perf_counter()
                try:
                    worker = await pool.pop_worker(key)
                except TaskFailed as exc:
                    errors += 1
                    print(f"worker start failed: {exc}", flush=True)
                    continue
                latencies.append(time.perf_counter() - t0)
                await _end(worker)

        watch = agent.watch()
        watch.start()
        started = time.perf_counter()
        try:
            await asyncio.gather(*(runner() for _ in range(sizes.worker_concurrency)))
            await pool.quiesce()  # the last deletes are part of the work
            wall = time.perf_counter() - started
        finally:
            await pool.close()
        usage = watch.stop()
    m = Measure("raylet_sim pool + agent", wall, len(latencies), latencies, usage.cpu_s)
    m.peak_rss_bytes = usage.peak_rss_bytes
    m.errors = errors
    return m, client.calls


async def bench_worker_starts(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("worker-starts")
    packages = work / "packages"
    packages.mkdir()
    envs = await asyncio.to_thread(_build, packages, sizes.worker_envs)
    names = {
        "pool": "raylet_sim pool + agent",
        "bare": "bare python workers",
        "context": "bare, with the env's context",
    }
    measures = {step: Measure(name) for step, name in names.items()}
    rates: dict[str, list[float]] = {step: [] for step in names}
    rpcs = 0
    n, c, limit = sizes.worker_starts, sizes.worker_concurrency, sizes.phase_timeout_s
    async with AgentProcess(work / "agent-root") as agent:
        contexts = await _install(agent.address, envs)
        for r in range(sizes.worker_rounds):
            rng = random.Random(sizes.seed + r)
            picks = [rng.randrange(len(envs)) for _ in range(n)]  # the same draw for each step
            steps = list(names)
            for step in steps[r % 3 :] + steps[: r % 3]:  # the order rotates
                if step == "pool":
                    m, calls = await _pool_starts(agent, [envs[i] for i in picks], sizes)
                    rpcs += calls
                elif step == "bare":
                    m = await bare_workers(n, c, limit, name=names[step])
                else:
                    m = await bare_workers(n, c, limit, [contexts[i] for i in picks], names[step])
                rates[step].append(m.requests / m.wall_s)
                measures[step].add(m)
        cache = (await rpc.info(agent.address)).cache
    pool_m, bare_m, context_m = measures["pool"], measures["bare"], measures["context"]
    pool_m.downloads, pool_m.extractions = cache.downloads, cache.extractions
    pool_rate, bare_rate = statistics.median(rates["pool"]), statistics.median(rates["bare"])
    context_rate = statistics.median(rates["context"])
    result.figure(
        f"worker starts/s, concurrency {c}", pool_rate, bare_rate,
        "the same python processes, no env machinery", "workers/s",
        Goal("ratio", ">=", 1 / 1.1, "within 1.1x: ratio >= 0.91x"),
    )  # fmt: skip
    result.figure(
        "starts/s, env's context (cwd, PYTHONPATH), no agent", context_rate, bare_rate,
        "the same python processes, no env machinery", "workers/s",
    )  # fmt: skip
    result.figure(
        "starts/s, pool + agent vs the context alone", pool_rate, context_rate,
        "the same processes with the env's context, no agent or pool", "workers/s",
    )  # fmt: skip
    result.figure(
        "agent RPCs per worker start", rpcs / max(pool_m.requests, 1), 1.0,
        "one RPC per start", "RPCs", Goal("value", "<=", 0.1, "far fewer than 1: <= 0.1"),
    )  # fmt: skip
    result.figure(
        "worker start p50 latency", percentile(pool_m.latencies_s, 0.5) * 1000,
        percentile(bare_m.latencies_s, 0.5) * 1000, "bare spawn to ready line", "ms",
    )  # fmt: skip
    result.measures = [pool_m, bare_m, context_m]
    result.notes.append(
        f"{sizes.worker_rounds} rounds of {n} starts over {sizes.worker_envs} envs (drawn at "
        f"random, the same draw for each way of starting), medians; {rpcs} agent RPCs in all; "
        "CPU per request is the agent's CPU per worker start"
    )
    return result
