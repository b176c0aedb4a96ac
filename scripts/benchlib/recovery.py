"""recovery: the start of an agent whose root holds many cached packages with their rows, against
the start of an agent on an empty root; and the agent's memory with very many envs in its tables.

The memory figure creates distinct small envs (each its own env_vars, all sharing one file://
package) through many concurrent creates, as many as fit in a bounded time (said so when that is
fewer than asked), then reads VmRSS and VmHWM from /proc/PID/status. Goal (issue 17): the RSS
it grew by, per env, under 1 kB (1,024 bytes) with 100,000 envs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path

import grpc

from agent.core.uris import UriKey, UriKind
from agent.install.disk.root import package_dir
from agent.state.state_db import FILE_NAME, StateDB, UriRow
from benchlib import rpc
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult
from benchlib.packages import build_small_zip
from benchlib.procs import AgentProcess, BenchError, ProcWatch, status_bytes
from rtenv.v1 import agent_pb2


def _keys(rows: int) -> list[UriKey]:
    return [UriKey(UriKind.PY_MODULES, f"https://packages.invalid/p{i}.zip") for i in range(rows)]


def _fill_dirs(root: Path, rows: int) -> None:
    for i, key in enumerate(_keys(rows)):
        path = package_dir(root, key)
        (path / f"m{i}").mkdir(parents=True)
        (path / f"m{i}" / "__init__.py").write_text("VALUE = 1\n")


async def _fill_root(root: Path, rows: int) -> None:
    """A root as a long-running agent would leave it: ``rows`` packages and their rows."""
    (root / "uris").mkdir(parents=True)
    await asyncio.to_thread(_fill_dirs, root, rows)
    db = StateDB(root / FILE_NAME)
    await db.open()
    now = int(time.time() * 1000)
    for i, key in enumerate(_keys(rows)):
        path = package_dir(root, key)
        await db.obtain((key.kind.value, key.uri), path.name, take_ref=False)  # the claim
        await db.record_install(UriRow(key.kind.value, key.uri, path.name, 10, now + i))
    await db.close()


async def _restarts(work: Path, sizes: Sizes, result: WorkloadResult) -> None:
    rows = sizes.recovery_rows
    full: list[float] = []
    empty: list[float] = []
    own: list[float] = []
    filled = work / "filled"
    await _fill_root(filled, rows)
    full_m, empty_m = Measure(f"start, {rows} packages"), Measure("start, empty root")
    for i in range(sizes.recovery_rounds):
        root = work / f"recover-{i}"
        await asyncio.to_thread(shutil.copytree, filled, root, symlinks=True)
        async with AgentProcess(root) as agent:
            full.append(agent.ready_s)
            info = await rpc.info(agent.address)
            if info.recovery.rows_kept != rows:
                raise BenchError(f"recovery kept {info.recovery.rows_kept} of {rows} rows")
            own.append(info.recovery.seconds)
            full_m.add(Measure(full_m.name, agent.ready_s, 1, [agent.ready_s],
                               peak_rss_bytes=status_bytes(agent.pid, "VmHWM")))  # fmt: skip
        async with AgentProcess(work / f"empty-{i}") as agent:
            empty.append(agent.ready_s)
            empty_m.add(Measure(empty_m.name, agent.ready_s, 1, [agent.ready_s],
                                peak_rss_bytes=status_bytes(agent.pid, "VmHWM")))  # fmt: skip
    base = "start to SERVING on an empty root"
    result.figure(
        f"start to SERVING with {rows} cached packages", statistics.median(full),
        statistics.median(empty), base, "s",
    )  # fmt: skip
    result.figure(
        f"recovery step, {rows} packages (agent's timing)", statistics.median(own),
        statistics.median(empty), base, "s",
    )  # fmt: skip
    result.measures += [full_m, empty_m]


async def _memory(work: Path, sizes: Sizes, result: WorkloadResult) -> None:
    target = sizes.rss_envs
    pkg = work / "shared.zip"
    await asyncio.to_thread(build_small_zip, pkg, "sharedmod", 512, 3)
    uri = f"file://{pkg}"

    def env(i: int) -> str:
        return json.dumps({"py_modules": [uri], "env_vars": {"BENCH_ENV": str(i)}})

    async with (
        AgentProcess(work / "rss-root") as agent,
        grpc.aio.insecure_channel(agent.address) as channel,
    ):
        stub = rpc.stub(channel)
        await stub.CreateRuntimeEnv(
            agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env(-1)), timeout=60
        )  # the package installed, the agent warm
        idle_rss = status_bytes(agent.pid, "VmRSS")
        watch = ProcWatch(agent.pid)
        watch.start()
        calls, _ = await rpc.creates(
            stub, env, target, sizes.rss_concurrency,
            deadline_s=time.monotonic() + sizes.rss_time_limit_s,
        )  # fmt: skip
        usage = watch.stop()
        rss = status_bytes(agent.pid, "VmRSS")
        total = (await rpc.info(agent.address)).total_envs
    made = len(calls.create_s)
    m = Measure(f"agent, {made} envs created", calls.wall_s, made, calls.create_s, usage.cpu_s)
    m.peak_rss_bytes = usage.peak_rss_bytes
    m.errors = calls.errors
    result.measures.append(m)
    if made < target:
        result.notes.append(
            f"only {made} of {target} envs were created within the {sizes.rss_time_limit_s:g}s "
            f"bound ({made / calls.wall_s:.0f} creates/s); the RSS is for {total} envs"
        )
    result.figure(
        f"agent RSS with {total} envs in its tables", rss / 2**20, idle_rss / 2**20,
        "the same agent with 1 env, before the creates", "MB",
    )  # fmt: skip
    per_env = (rss - idle_rss) / max(made, 1)
    result.figure(
        "RSS per env", per_env, len(env(made).encode()), "the env's JSON text", "bytes",
        Goal("value", "<", 1024, "< 1 kB (1,024 bytes)"),
    )  # fmt: skip
    result.notes.append(
        f"memory: {made} distinct envs created at concurrency {sizes.rss_concurrency} in "
        f"{calls.wall_s:.1f}s ({made / calls.wall_s:.0f} creates/s); peak RSS (VmHWM) "
        f"{usage.peak_rss_bytes / 2**20:.0f} MB"
    )


async def bench_recovery(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("recovery")
    await _restarts(work, sizes, result)
    await _memory(work, sizes, result)
    return result
