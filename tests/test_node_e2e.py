"""End to end: a real Node, the real agent as its sidecar process, a real package server on
127.0.0.1 and real worker processes that import their py_modules and read their working dir."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raylet_sim.node import Node
from raylet_sim.pool import TaskSpec
from raylet_sim.samples import EnvSpec, PackageServer, Samples, build_samples
from raylet_sim.sidecar import MAX_UNIX_PATH_BYTES, AgentSidecar, SidecarError, socket_address
from rtenv.v1 import agent_pb2
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

QUIET = ("--log-level", "WARNING")


@dataclass
class Setup:
    node: Node
    samples: Samples
    server: PackageServer

    async def info(self) -> agent_pb2.GetRuntimeEnvsInfoReply:
        assert self.node.client is not None
        return await self.node.client.info()

    def env_id(self, env: EnvSpec) -> str:
        assert self.node.pool is not None
        return self.node.pool.slots[env.serialized].runtime_env_id

    async def run(self, env: EnvSpec, index: int) -> dict[str, Any]:
        result: dict[str, Any] = await self.node.run(
            TaskSpec(env.serialized, "task:run", (index,)), task_id=str(index)
        )
        return result


@asynccontextmanager
async def node_setup(n_envs: int) -> AsyncIterator[Setup]:
    """Sample packages served on 127.0.0.1 and a started Node whose idle workers stay."""
    base = short_tempdir()
    server = PackageServer()
    await server.start()
    samples = build_samples(n_envs, server.base_url, seed=7, filler_bytes=2048)
    server.packages.update(samples.packages)
    node = Node(base / "root", idle_timeout_s=60.0, agent_args=QUIET)
    try:
        await asyncio.wait_for(node.start(), 60)
        yield Setup(node, samples, server)
    finally:
        await asyncio.wait_for(node.stop(), 60)
        await server.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert node.sidecar.process is not None
    assert node.sidecar.process.returncode is not None, "the agent outlived its node"


def uri_refs(info: agent_pb2.GetRuntimeEnvsInfoReply) -> dict[tuple[str, str], int]:
    return {(u.kind, u.uri): u.references for u in info.uris}


def expected_uri_refs(s: Setup, envs: list[EnvSpec]) -> dict[tuple[str, str], int]:
    """Each live env holds one reference on each package it names."""
    refs: Counter[tuple[str, str]] = Counter()
    for env in envs:
        refs[("working_dir", f"{s.server.base_url}/{env.working_dir}.zip")] += 1
        for module in env.py_modules:
            refs[("py_modules", f"{s.server.base_url}/{module}.zip")] += 1
    return dict(refs)


def gone_from(workers: dict[int, Any], pid: int) -> Callable[[], bool]:
    return lambda: all(w.pid != pid for w in workers.values())


async def test_workers_of_one_env_share_one_agent_reference_and_all_return_to_zero() -> None:
    async with node_setup(3) as s:
        pool = s.node.pool
        assert pool is not None
        a, b = s.samples.envs[0], s.samples.envs[1]
        plan = [a, a, a, a, b, b]
        results = await asyncio.wait_for(
            asyncio.gather(*(s.run(env, i) for i, env in enumerate(plan))), 60
        )
        pids = [r.pop("pid") for r in results]
        for i, (env, result) in enumerate(zip(plan, results, strict=True)):
            assert result == env.expected(i, s.samples.values)  # py_modules and working_dir
        assert len(set(pids[:4])) == 4, "four concurrent tasks of env a ran on four workers"
        assert len(set(pids)) == 6
        assert pool.slots[a.serialized].count == 4
        assert pool.slots[b.serialized].count == 2
        pool.check_invariants()

        info = await s.info()
        assert info.total_envs == 2
        assert {e.runtime_env_id: e.references for e in info.envs} == {
            s.env_id(a): 1,
            s.env_id(b): 1,
        }, "the pool holds one reference per env, however many workers"
        assert uri_refs(info) == expected_uri_refs(s, [a, b])
        assert all(n == 1 for n in s.server.gets.values()), s.server.gets

        await asyncio.wait_for(pool.close(), 30)
        assert not pool.workers
        assert not pool.slots
        info = await s.info()
        assert info.total_envs == 0
        assert list(info.envs) == []
        assert info.uris, "the packages stay cached"
        assert all(u.references == 0 for u in info.uris), uri_refs(info)


async def test_the_agent_drops_an_env_only_when_its_last_worker_exits() -> None:
    async with node_setup(2) as s:
        pool = s.node.pool
        assert pool is not None
        a, b = s.samples.envs
        results = await asyncio.gather(*(s.run(env, i) for i, env in enumerate([a, a, a, b])))
        a_pids = [r["pid"] for r in results[:3]]
        a_id, b_id = s.env_id(a), s.env_id(b)
        for left, pid in zip((2, 1, 0), a_pids, strict=True):
            os.kill(pid, signal.SIGKILL)
            await wait_until(gone_from(pool.workers, pid), what=f"worker {pid} reaped")
            pool.check_invariants()
            if left:
                refs = {e.runtime_env_id: e.references for e in (await s.info()).envs}
                assert refs == {a_id: 1, b_id: 1}, f"with {left} workers of env a alive"

        async def a_dropped() -> bool:
            return {e.runtime_env_id for e in (await s.info()).envs} == {b_id}

        await wait_until(a_dropped, timeout_s=15, what="env a deleted at the agent")
        assert a.serialized not in pool.slots
        held = {k: n for k, n in uri_refs(await s.info()).items() if n}
        assert held == expected_uri_refs(s, [b])


async def test_an_agent_that_exits_at_start_fails_with_its_stderr_tail() -> None:
    base = short_tempdir()
    node = Node(base / "root", agent_args=["--no-such-flag"])
    try:
        with pytest.raises(SidecarError) as failed:
            await asyncio.wait_for(node.start(), 60)
        message = str(failed.value)
        assert "exited with code 2" in message
        assert "unrecognized arguments: --no-such-flag" in message
        assert node.sidecar.process is not None
        assert node.sidecar.process.returncode == 2
    finally:
        await asyncio.wait_for(node.stop(), 30)
        shutil.rmtree(base, ignore_errors=True)


async def test_an_agent_that_never_serves_fails_within_the_health_timeout_with_its_log() -> None:
    base = short_tempdir()
    script = "import sys, time\nsys.stderr.write('stuck-agent-marker\\n')\ntime.sleep(120)\n"
    sidecar = AgentSidecar(
        base / "root", command=[sys.executable, "-c", script], health_timeout_s=2.0
    )
    started = time.monotonic()
    try:
        with pytest.raises(SidecarError) as failed:
            await asyncio.wait_for(sidecar.start(), 60)
        assert time.monotonic() - started < 20
        assert "did not report SERVING within 2s" in str(failed.value)
        assert "stuck-agent-marker" in str(failed.value)
        assert sidecar.process is not None
        assert sidecar.process.returncode is not None, "the stuck agent was left running"
    finally:
        await asyncio.wait_for(sidecar.stop(grace_s=5), 30)
        shutil.rmtree(base, ignore_errors=True)


async def test_a_root_too_long_for_af_unix_serves_on_a_short_fallback_socket() -> None:
    base = short_tempdir()
    root = base / ("d" * 90) / "root"
    assert len(os.fsencode(str(root / "agent.sock"))) > MAX_UNIX_PATH_BYTES
    address = socket_address(root)
    path = Path(address.removeprefix("unix:"))
    assert address.startswith("unix:")
    assert len(os.fsencode(str(path))) <= MAX_UNIX_PATH_BYTES
    assert socket_address(root) == address, "the fallback is stable for a root"
    node = Node(root, agent_args=QUIET)
    try:
        await asyncio.wait_for(node.start(), 60)
        assert node.sidecar.address == address
        assert path.is_socket()
        assert node.client is not None
        info = await node.client.info()
        assert info.total_envs == 0
    finally:
        await asyncio.wait_for(node.stop(), 30)
        with suppress(FileNotFoundError):
            path.unlink()
        with suppress(OSError):  # the fallback's own folder; rmdir: if empty, and nothing more
            path.parent.rmdir()
        shutil.rmtree(base, ignore_errors=True)
