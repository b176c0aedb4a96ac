"""shared-wheels: N jobs, each with its own requirement set (a small package of its own and one
large dependency they all share), through the agent (N ``uv`` envs: N venvs, linked from one
wheel cache) against one venv per job built the way a user without the agent would (``python -m
venv`` and the same pip, offline), all at once in both cases.

Offline: the wheels are written here (the large one holds random bytes), every install names
``--no-index --find-links``, and every proxy variable points at a closed port of 127.0.0.1 for
the run. The per-job venvs are made ``--without-pip`` and filled by the bench's own pip through
``--python``: no ensurepip copy in each (a cheaper baseline than a plain ``python -m venv``, so
the ratios do not owe anything to pip's own files). Figures: disk bytes (``du -sb``: each
hardlinked inode once; the agent's whole root, its cache and index included) and wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult
from benchlib.procs import AgentProcess
from benchlib.wheels import per_job_venv, write_wheel
from rtenv.v1 import agent_pb2

_BIG = "benchbigdep"
_CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port


def _du(*paths: Path) -> int:
    """``du -sbc``: apparent bytes, each inode once across all the paths."""
    done = subprocess.run(
        ["du", "-sbc", *map(str, paths)], capture_output=True, text=True, timeout=300, check=True
    )
    return int(done.stdout.splitlines()[-1].split()[0])


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No pip configuration of this machine, every proxy at a closed loopback port (the agent
    process and the per-job pips inherit it), restored after."""
    keys = ("PIP_CONFIG_FILE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "no_proxy")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update({"PIP_CONFIG_FILE": os.devnull, "HTTP_PROXY": _CLOSED,
                       "HTTPS_PROXY": _CLOSED, "ALL_PROXY": _CLOSED})  # fmt: skip
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class WheelsRun:
    """What one run measured: the agent's venvs and root against the per-job venvs."""

    sets: int  # distinct requirement sets, each sharing the large wheel
    venvs: int  # uv venvs the agent lists after the run
    wheel_bytes: int  # the large wheel's payload
    agent_bytes: int  # du -sb of the agent's whole root
    per_job_bytes: int  # du -sbc of the per-job venvs
    agent_wall_s: float
    per_job_wall_s: float


def add_figures(result: WorkloadResult, run: WheelsRun) -> None:
    """The goals: disk at most 0.2x and wall at most 0.5x the per-job venvs'; and, so that a
    root cannot pass by being small, one venv per distinct set (an agent that merged sets, or
    lost one, misses it) and the large wheel's payload on the root at least once."""
    result.figure(
        f"disk bytes, {run.sets} sets sharing a {run.wheel_bytes / 2**20:g} MiB wheel",
        float(run.agent_bytes), float(run.per_job_bytes), f"{run.sets} per-job venvs", "bytes",
        Goal("ratio", "<=", 0.2),
    )  # fmt: skip
    result.figure(
        f"wall, {run.sets} concurrent jobs, distinct sets", run.agent_wall_s, run.per_job_wall_s,
        f"{run.sets} per-job venvs built at once", "s", Goal("ratio", "<=", 0.5),
    )  # fmt: skip
    result.figure(
        "venvs the agent built", run.venvs, run.sets, "distinct sets", "venvs",
        Goal("ratio", "==", 1.0, "one per distinct set"),
    )  # fmt: skip
    result.figure(
        "the agent's root against one copy of the large wheel", float(run.agent_bytes),
        float(run.wheel_bytes), "the wheel's payload", "bytes",
        Goal("ratio", ">=", 1.0, "the wheel there: ratio >= 1.0x"),
    )  # fmt: skip


async def bench_shared_wheels(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("shared-wheels")
    wheelhouse = work / "wheelhouse"
    wheelhouse.mkdir()
    big = sizes.shared_wheel_bytes
    write_wheel(wheelhouse, _BIG, {"payload.bin": os.urandom(big)})
    jobs = sizes.shared_wheel_sets
    sets = [[_BIG, f"benchown{i}"] for i in range(jobs)]
    for i in range(jobs):
        write_wheel(wheelhouse, f"benchown{i}", {"payload.bin": os.urandom(1024)})
    options = ["--no-index", "--find-links", str(wheelhouse)]

    agent_m = Measure("agent: one uv venv per set, one wheel cache")
    per_job = Measure("one venv per job (python -m venv, pip install)")
    with _offline():
        root = work / "root"
        async with AgentProcess(root) as agent:
            async with grpc.aio.insecure_channel(agent.address) as channel:
                stub = rpc.stub(channel)

                async def job(packages: list[str]) -> None:
                    env = {"uv": {"packages": packages, "uv_pip_install_options": options}}
                    t0 = time.perf_counter()
                    await stub.CreateRuntimeEnv(
                        agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=json.dumps(env)),
                        timeout=sizes.phase_timeout_s,
                    )
                    agent_m.latencies_s.append(time.perf_counter() - t0)

                started = time.perf_counter()
                await asyncio.gather(*(job(packages) for packages in sets))
                agent_m.wall_s = time.perf_counter() - started
                agent_m.requests = jobs
                info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest())
            agent_m.extractions = info.cache.extractions
            venvs = [u for u in info.uris if u.kind == "uv"]
            agent_bytes = _du(root)

        started = time.perf_counter()
        targets = [work / f"job{i}" for i in range(jobs)]
        await asyncio.gather(
            *(per_job_venv(t, wheelhouse, s) for t, s in zip(targets, sets, strict=True))
        )
        per_job.wall_s = time.perf_counter() - started
        per_job.requests = jobs
        per_job_bytes = _du(*targets)

    result.measures += [agent_m, per_job]
    run = WheelsRun(
        sets=jobs, venvs=len(venvs), wheel_bytes=big, agent_bytes=agent_bytes,
        per_job_bytes=per_job_bytes, agent_wall_s=agent_m.wall_s, per_job_wall_s=per_job.wall_s,
    )  # fmt: skip
    add_figures(result, run)
    result.notes.append(
        f"{len(venvs)} venv(s) built by the agent's uv for {jobs} distinct sets "
        f"({agent_m.extractions} install(s)); the agent's bytes are its whole root (du -sb: "
        "each hardlinked inode once), the per-job venvs' du -sbc over them all"
    )
    return result
