"""pip: N concurrent jobs with the same requirement set share one venv built once by the agent,
against one venv per job (what per-job installs would cost), built at once by the same pip.

Offline: the wheels are written by hand (a zip with its .dist-info) into a local wheelhouse, and
every install runs with --no-index --find-links. Figures: wall time and disk bytes, as ratios.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.config import Sizes
from benchlib.figures import Measure, WorkloadResult
from benchlib.procs import AgentProcess
from benchlib.wheels import per_job_venv, write_wheel
from rtenv.v1 import agent_pb2

_PACKAGES = ("benchalpha", "benchbeta", "benchgamma")


def _du(path: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, names in os.walk(path) for f in names)


async def bench_pip(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("pip")
    wheelhouse = work / "wheelhouse"
    wheelhouse.mkdir()
    for name in _PACKAGES:
        data = (name * (sizes.pip_payload_kib * 1024 // len(name) + 1)).encode()
        write_wheel(wheelhouse, name, {"data.txt": data})
    jobs = sizes.pip_jobs
    options = ["--no-index", "--find-links", str(wheelhouse)]

    shared = Measure("agent: one shared venv")
    os.environ.update({"PIP_CONFIG_FILE": os.devnull})  # the agent process inherits it
    async with AgentProcess(work / "root") as agent:
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = rpc.stub(channel)

            async def job(i: int) -> None:
                packages = list(_PACKAGES) if i % 2 else list(reversed(_PACKAGES))
                env = {"pip": {"packages": packages, "pip_install_options": options},
                       "env_vars": {"JOB": str(i)}}  # fmt: skip
                t0 = time.perf_counter()
                await stub.CreateRuntimeEnv(
                    agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=json.dumps(env)),
                    timeout=600,
                )
                shared.latencies_s.append(time.perf_counter() - t0)

            started = time.perf_counter()
            await asyncio.gather(*(job(i) for i in range(jobs)))
            shared.wall_s = time.perf_counter() - started
            shared.requests = jobs
            info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest())
        shared.extractions = info.cache.extractions
        venvs = [u for u in info.uris if u.kind == "pip"]
        shared_bytes = sum(_du(Path(u.local_path)) for u in venvs)

    per_job = Measure("one venv per job (same pip, same wheels)")
    started = time.perf_counter()
    targets = [work / f"job{i}" for i in range(jobs)]
    await asyncio.gather(*(per_job_venv(t, wheelhouse, _PACKAGES) for t in targets))
    per_job.wall_s = time.perf_counter() - started
    per_job.requests = jobs
    per_job_bytes = sum(_du(work / f"job{i}") for i in range(jobs))

    result.measures += [shared, per_job]
    result.figure(
        f"wall, {jobs} concurrent jobs, one requirement set", shared.wall_s, per_job.wall_s,
        f"{jobs} per-job venvs built at once", "s",
    )  # fmt: skip
    result.figure(
        f"disk bytes, {jobs} jobs", float(shared_bytes), float(per_job_bytes),
        f"{jobs} per-job venvs", "bytes",
    )  # fmt: skip
    result.notes.append(
        f"{len(venvs)} venv(s) built by the agent for {jobs} jobs ({shared.extractions} "
        f"install(s)); requirement lists given in two orders"
    )
    return result
