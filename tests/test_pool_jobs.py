"""Jobs with eager_install (Ray's meaning: a job's env is installed when the job starts, not at
its first worker), against the real agent in this process on a unix socket, a real package on
disk and real worker processes."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc

from raylet_sim.client import AgentClient
from raylet_sim.pool import TaskSpec, WorkerPool
from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

PROBE_PY = "import os\n\ndef pid():\n    return os.getpid()\n"


@dataclass
class JobSetup:
    agent: RunningAgent
    client: AgentClient
    pool: WorkerPool
    env: str  # a serialized env whose working dir holds probe.py

    async def env_info(self) -> list[agent_pb2.RuntimeEnvInfo]:
        return list((await self.client.info()).envs)

    async def references(self) -> int:
        return sum(e.references for e in await self.env_info())


@asynccontextmanager
async def job_setup() -> AsyncIterator[JobSetup]:
    base = short_tempdir()
    package = base / "wd.zip"
    package.write_bytes(workdir_zip({"probe.py": PROBE_PY}, top=None))
    try:
        async with (
            running_agent() as agent,
            grpc.aio.insecure_channel(agent.agent.address) as channel,
        ):
            client = AgentClient(channel)
            pool = WorkerPool(client, idle_timeout_s=60.0)
            try:
                yield JobSetup(agent, client, pool, env_json(f"file://{package}"))
            finally:
                await pool.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_an_eager_job_has_its_env_ready_with_a_reference_before_any_worker() -> None:
    async with job_setup() as s:
        await s.pool.start_job("job-1", s.env, eager_install=True)
        (info,) = await s.env_info()
        assert info.state == "ready"
        assert info.references == 1
        assert s.pool.slots[s.env].runtime_env_id == info.runtime_env_id
        assert s.pool.stats.workers_started == 0
        assert not s.pool.workers
        s.pool.check_invariants()

        await s.pool.run(TaskSpec(s.env, "probe:pid", job_id="job-1"))  # finds it ready
        assert s.pool.stats.creates == 1
        assert await s.references() == 1, "the pool holds one reference per key"
        s.pool.finish_job("job-1")
        assert s.pool.slots[s.env].count == 1, "its idle worker still holds the env"
        s.pool.check_invariants()


async def test_finishing_an_eager_job_without_workers_gives_its_env_back() -> None:
    async with job_setup() as s:
        await s.pool.start_job("job-1", s.env)
        assert await s.references() == 1
        s.pool.finish_job("job-1")
        assert s.env not in s.pool.slots
        await s.pool.quiesce()
        await wait_until(
            lambda: _no_refs(s),
            timeout_s=10,
            what="the agent's reference dropped",
        )
        assert s.pool.stats.deletes == 1
        s.pool.check_invariants()


async def _no_refs(s: JobSetup) -> bool:
    return await s.references() == 0


async def test_a_job_without_eager_install_creates_nothing_before_its_first_worker() -> None:
    async with job_setup() as s:
        await s.pool.start_job("job-1", s.env, eager_install=False)
        assert await s.env_info() == []
        assert not s.pool.slots
        await s.pool.run(TaskSpec(s.env, "probe:pid", job_id="job-1"))
        (info,) = await s.env_info()
        assert info.references == 1
        s.pool.finish_job("job-1")
        assert s.pool.slots[s.env].count == 1  # only its worker: the job held nothing
        s.pool.check_invariants()
