"""Watch mode: a worker re-hashes its packages and reports a vanished or changed file to the pool.

First the Watcher on its own (a temp dir, checks driven by hand), then real worker processes
started by a WorkerPool in watch mode against a stub agent (an in-process gRPC servicer) whose
context points the worker's cwd and PYTHONPATH at a temp dir of files.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from raylet_sim.client import AgentClient, RetryPolicy
from raylet_sim.pool import TaskSpec, WorkerPool
from raylet_sim.watch import Watcher
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.in_process import served
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

FAST = RetryPolicy(attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05, call_timeout_s=20.0)
PROBE_PY = "import os\n\ndef pid():\n    return os.getpid()\n"
ENV_KEY = '{"name": "watched"}'
PID = TaskSpec(ENV_KEY, "probe:pid")


def make_package(directory: Path) -> Path:
    """A package-like tree: a module the worker imports, a data file, a nested file."""
    directory.mkdir(parents=True)
    (directory / "probe.py").write_text(PROBE_PY)
    (directory / "data.txt").write_text("payload\n")
    (directory / "sub").mkdir()
    (directory / "sub" / "nested.txt").write_text("nested\n")
    return directory


# -- the Watcher alone ---------------------------------------------------------------------------


def test_watcher_reports_nothing_while_the_files_are_unchanged(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    watcher = Watcher([pkg], interval_s=3600)
    assert watcher.files == 3
    for _ in range(3):
        watcher.check()
    assert watcher.take() == []


def test_watcher_reports_a_deleted_file_as_missing_once(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    watcher = Watcher([pkg], interval_s=3600)
    (pkg / "sub" / "nested.txt").unlink()
    watcher.check()
    watcher.check()
    found = watcher.take()
    assert len(found) == 1, found
    assert found[0].endswith(f"{pkg / 'sub' / 'nested.txt'} is missing")
    watcher.check()
    assert watcher.take() == [], "a missing file is reported once, not at every check"


def test_watcher_reports_a_rewritten_file_as_changed_once(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    watcher = Watcher([pkg], interval_s=3600)
    (pkg / "data.txt").write_text("tampered\n")
    watcher.check()
    watcher.check()
    found = watcher.take()
    assert len(found) == 1, found
    assert found[0].endswith(f"{pkg / 'data.txt'} is changed")


def test_watcher_take_empties_and_later_findings_come_in_the_next_take(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    watcher = Watcher([pkg], interval_s=3600)
    (pkg / "data.txt").unlink()
    watcher.check()
    assert len(watcher.take()) == 1
    assert watcher.take() == []
    (pkg / "probe.py").write_text("# changed\n")
    watcher.check()
    later = watcher.take()
    assert len(later) == 1
    assert later[0].endswith("probe.py is changed")


def test_watcher_ignores_pycache_and_files_added_after_the_baseline(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "probe.cpython.pyc").write_bytes(b"\0")
    watcher = Watcher([pkg], interval_s=3600)
    assert watcher.files == 3
    (pkg / "__pycache__" / "probe.cpython.pyc").unlink()
    (pkg / "new.txt").write_text("added\n")
    watcher.check()
    assert watcher.take() == []


async def test_watcher_thread_finds_a_deletion_without_an_explicit_check(tmp_path: Path) -> None:
    pkg = make_package(tmp_path / "pkg")
    watcher = Watcher([pkg], interval_s=0.01)
    watcher.start()
    found: list[str] = []
    try:
        (pkg / "data.txt").unlink()

        def reported() -> bool:
            found.extend(watcher.take())
            return bool(found)

        await wait_until(reported, what="the watch thread to report the deletion")
    finally:
        watcher.stop()
    found += watcher.take()
    assert len(found) == 1, found
    assert found[0].endswith("data.txt is missing")


# -- real workers in a pool in watch mode -------------------------------------------------------


@dataclass
class StubAgent(agent_pb2_grpc.RuntimeEnvAgentServicer):
    """A fake agent whose every env runs in ``workdir`` (cwd and PYTHONPATH), under this python
    (as the agent sends it: shell words, the path quoted)."""

    workdir: Path
    refs: dict[str, int] = field(default_factory=dict)

    async def CreateRuntimeEnv(
        self,
        request: agent_pb2.CreateRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> agent_pb2.CreateRuntimeEnvReply:
        self.refs["env-watched"] = self.refs.get("env-watched", 0) + 1
        return agent_pb2.CreateRuntimeEnvReply(
            runtime_env_id="env-watched",
            context=agent_pb2.RuntimeEnvContext(
                env_vars={"PYTHONPATH": str(self.workdir)},
                cwd=str(self.workdir),
                py_executable=shlex.quote(sys.executable),
            ),
        )

    async def DeleteRuntimeEnv(
        self,
        request: agent_pb2.DeleteRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> agent_pb2.DeleteRuntimeEnvReply:
        self.refs[request.runtime_env_id] -= 1
        return agent_pb2.DeleteRuntimeEnvReply(
            remaining_references=self.refs[request.runtime_env_id]
        )


@dataclass
class Watched:
    pool: WorkerPool
    pkg: Path
    stub: StubAgent


@asynccontextmanager
async def watched_pool(*, idle_timeout_s: float, watch_interval_s: float) -> AsyncIterator[Watched]:
    """A stub agent on a unix socket and a pool in watch mode over it; all stopped after."""
    base = short_tempdir()
    pkg = make_package(base / "pkg")
    stub = StubAgent(pkg)
    try:
        async with served(stub, base) as channel:
            pool = WorkerPool(
                AgentClient(channel, FAST),
                idle_timeout_s=idle_timeout_s,
                watch_interval_s=watch_interval_s,
            )
            try:
                yield Watched(pool, pkg, stub)
            finally:
                await asyncio.wait_for(pool.close(), 30)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_an_idle_workers_vanished_file_reaches_the_pool_with_its_next_reply() -> None:
    async with watched_pool(idle_timeout_s=60, watch_interval_s=0.02) as w:
        first = await asyncio.wait_for(w.pool.run(PID), 30)
        assert w.pool.violations == []
        (w.pkg / "sub" / "nested.txt").unlink()  # the worker is idle now
        (w.pkg / "data.txt").write_text("tampered\n")
        pids = set()

        async def reported_both() -> bool:
            pids.add(await asyncio.wait_for(w.pool.run(PID), 30))
            return len(w.pool.violations) >= 2

        await wait_until(reported_both, what="the worker's replies to carry both violations")
        assert pids == {first}, "the same (idle, reused) worker ran every task"
        for _ in range(3):  # more tasks: nothing reported twice
            await asyncio.wait_for(w.pool.run(PID), 30)
        violations = sorted(w.pool.violations)
        assert len(violations) == 2, violations
        assert violations[0].endswith("data.txt is changed")
        assert violations[1].endswith(f"{w.pkg / 'sub' / 'nested.txt'} is missing")
        assert all(v.startswith(f"pid {first}:") for v in violations)


async def test_a_worker_retired_by_its_idle_timeout_delivers_its_final_report() -> None:
    # The periodic check never runs in this test's lifetime: only the last look at exit can
    # find the deletion, so the violation proves the final report reached the pool.
    async with watched_pool(idle_timeout_s=0.3, watch_interval_s=3600) as w:
        pid = await asyncio.wait_for(w.pool.run(PID), 30)
        (w.pkg / "probe.py").unlink()
        await wait_until(lambda: not w.pool.workers, timeout_s=20, what="the idle timeout")
        assert w.pool.stats.workers_exited == 1
        assert w.pool.violations == [f"pid {pid}: {w.pkg / 'probe.py'} is missing"]
        await wait_until(lambda: w.stub.refs == {"env-watched": 0}, what="the env's delete")


async def test_a_watched_worker_with_intact_files_reports_nothing_through_its_life() -> None:
    async with watched_pool(idle_timeout_s=0.3, watch_interval_s=0.01) as w:
        for _ in range(3):
            await asyncio.wait_for(w.pool.run(PID), 30)
        await wait_until(lambda: not w.pool.workers, timeout_s=20, what="the idle timeout")
        assert w.pool.stats.workers_exited == 1
        assert w.pool.violations == []
