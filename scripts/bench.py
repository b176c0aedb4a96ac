"""Benchmarks: the agent as its users feel it, next to a baseline measured in the same run.

Machines here are shared and noisy: absolute times are context, the ratios are the result.
Workloads (``--only NAME`` runs some):

- persistence: cache-hit create+delete pairs per second through a real agent process over its
  unix socket, with the cache index (state.db) and without it (--no-state-db), same run,
  interleaved rounds. The ratio is the hot-path cost of persistence.
- recovery: start time of an agent whose root holds 10,000 cached packages with their rows,
  against the start time of an agent on an empty root.

Writes a table to stdout and every figure with its baseline and ratio to bench-results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.runtime_env import UriKey, UriKind
from agent.state_db import FILE_NAME, StateDB, UriRow
from agent.store import package_dir
from rtenv.v1 import agent_pb2, agent_pb2_grpc

# gRPC waits a second before its first reconnect by default: that, not the agent, would be timed
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 100),
]


@dataclass
class Figure:
    workload: str
    metric: str
    value: float
    baseline: float
    baseline_name: str
    unit: str

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")


# -- an agent process ----------------------------------------------------------------------


class AgentProcess:
    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.address = f"unix:{root / 'agent.sock'}"
        self._extra = extra
        self.proc: asyncio.subprocess.Process | None = None
        self.ready_s = 0.0

    async def __aenter__(self) -> AgentProcess:
        started = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "serve", "--root", str(self.root),
            "--log-level", "WARNING", *self._extra,
        )  # fmt: skip
        await _wait_serving(self.address, self.proc, 60.0)
        self.ready_s = time.monotonic() - started
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _wait_serving(address: str, proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address, options=FAST_RECONNECT) as channel:
        health = cast(Any, health_pb2_grpc.HealthStub(channel))
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise SystemExit(f"the agent exited with {proc.returncode}")
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.005)
    raise SystemExit(f"the agent did not serve within {timeout_s}s")


def _small_zip(path: Path, name: str) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "VALUE = 1\n")
    path.write_bytes(buf.getvalue())


# -- persistence ---------------------------------------------------------------------------


async def _pairs_per_second(address: str, env: str, pairs: int, concurrency: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        first = await stub.CreateRuntimeEnv(
            agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env), timeout=60
        )  # holds the env: every pair below is a cache hit
        left = pairs

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                reply = await stub.CreateRuntimeEnv(
                    agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env), timeout=30
                )
                await stub.DeleteRuntimeEnv(
                    agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=reply.runtime_env_id),
                    timeout=30,
                )

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        await stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=first.runtime_env_id), timeout=30
        )
    return pairs / elapsed


async def bench_persistence(work: Path, pairs: int, rounds: int) -> list[Figure]:
    pkg = work / "pkg.zip"
    _small_zip(pkg, "hotmod")
    env = json.dumps({"py_modules": [f"file://{pkg}"], "env_vars": {"A": "1"}})
    figures = []
    for concurrency in (1, 16):
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):  # interleaved, so drift on the machine hits both alike
            for persist in (True, False):
                root = work / f"root-{persist}-{concurrency}"
                extra = () if persist else ("--no-state-db",)
                async with AgentProcess(root, *extra) as agent:
                    rate = await _pairs_per_second(agent.address, env, pairs, concurrency)
                rates[persist].append(rate)
                shutil.rmtree(root)
        figures.append(
            Figure(
                "persistence",
                f"cache-hit create+delete pairs/s, concurrency {concurrency}",
                statistics.median(rates[True]),
                statistics.median(rates[False]),
                "the same agent without state.db (--no-state-db)",
                "pairs/s",
            )
        )
    return figures


# -- recovery ------------------------------------------------------------------------------


async def _fill_root(root: Path, rows: int) -> None:
    """A root as a long-running agent would leave it: ``rows`` packages and their rows."""
    (root / "uris").mkdir(parents=True)
    db = StateDB(root / FILE_NAME)
    await db.open()
    now = int(time.time() * 1000)
    for i in range(rows):
        key = UriKey(UriKind.PY_MODULES, f"https://packages.invalid/p{i}.zip")
        path = package_dir(root, key)
        (path / f"m{i}").mkdir(parents=True)
        (path / f"m{i}" / "__init__.py").write_text("VALUE = 1\n")
        await db.record_install(UriRow(key.kind.value, key.uri, path.name, 10, None, now + i))
    await db.close()


async def bench_recovery(work: Path, rows: int, rounds: int) -> list[Figure]:
    full, empty, own = [], [], []
    filled = work / "filled"
    await _fill_root(filled, rows)
    for i in range(rounds):
        root = work / f"recover-{i}"
        shutil.copytree(filled, root, symlinks=True)
        async with AgentProcess(root) as agent:
            full.append(agent.ready_s)
            async with grpc.aio.insecure_channel(agent.address) as channel:
                stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
                info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(limit=1))
            if info.recovery.rows_kept != rows:
                raise SystemExit(f"recovery kept {info.recovery.rows_kept} of {rows} rows")
            own.append(info.recovery.seconds)
        shutil.rmtree(root)
        root = work / f"empty-{i}"
        async with AgentProcess(root) as agent:
            empty.append(agent.ready_s)
        shutil.rmtree(root)
    return [
        Figure(
            "recovery",
            f"recovery step itself, {rows} packages (agent's own timing)",
            statistics.median(own),
            statistics.median(empty),
            "start to SERVING on an empty root",
            "s",
        ),
        Figure(
            "recovery",
            f"start to SERVING with {rows} cached packages",
            statistics.median(full),
            statistics.median(empty),
            "start to SERVING on an empty root",
            "s",
        ),
    ]


# -- driver --------------------------------------------------------------------------------

WORKLOADS: dict[str, Callable[[Path, argparse.Namespace], Awaitable[list[Figure]]]] = {
    "persistence": lambda work, a: bench_persistence(work, a.pairs, a.rounds),
    "recovery": lambda work, a: bench_recovery(work, a.rows, a.rounds),
}


def _table(figures: list[Figure]) -> str:
    lines = [f"{'workload':<12} {'metric':<52} {'value':>10} {'baseline':>10} {'ratio':>7}"]
    for f in figures:
        lines.append(
            f"{f.workload:<12} {f.metric:<52} {f.value:>10.3f} {f.baseline:>10.3f} {f.ratio:>7.2f}"
        )
        lines.append(f"{'':<12}   baseline: {f.baseline_name}; unit {f.unit}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="rtenv-bench-", dir="/tmp"))
    figures: list[Figure] = []
    try:
        for name in args.only or list(WORKLOADS):
            (work / name).mkdir()
            figures += await WORKLOADS[name](work / name, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(_table(figures))
    _write_results(Path(args.out), figures, args)
    print(f"\nwrote {args.out}")


def _write_results(path: Path, figures: list[Figure], args: argparse.Namespace) -> None:
    results = [{**asdict(f), "ratio": f.ratio} for f in figures]
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "args": vars(args)}
    path.write_text(json.dumps({"meta": meta, "figures": results}, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per persistence round")
    parser.add_argument("--rows", type=int, default=10_000, help="cached packages to recover")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument("--out", default="bench-results.json")
    asyncio.run(main(parser.parse_args()))
