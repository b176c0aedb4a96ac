"""The worker pool against a stub agent: an in-process gRPC server of the generated servicer.

The stub records every call, can fail calls with UNAVAILABLE, hold a create, refuse an env, and
hands out a context (env vars, a temp cwd, a python); the workers are real processes.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from raylet_sim.pool import (
    ARGUMENT_LIST_TOO_LONG,
    ENV_SETUP_FAILED,
    SPAWN_FAILED,
    WORKER_DIED,
    TaskFailed,
    TaskSpec,
    WorkerState,
)
from tests.harness.polling import wait_until
from tests.harness.stub_agent import (
    FAST,
    INFO,
    Harness,
    absent,
    harness,
    key,
)

RAYLET_SIM = Path(__file__).resolve().parents[1] / "raylet_sim"


async def drained(h: Harness) -> None:
    """Close the pool; then nothing is left: no worker, no slot, no agent reference."""
    await asyncio.wait_for(h.pool.close(), 30)
    assert not h.pool.workers
    assert not h.pool.slots
    assert all(n == 0 for n in h.stub.refs.values()), h.stub.refs


async def test_concurrent_pops_of_one_key_send_one_create_and_count_every_worker() -> None:
    async with harness() as h:
        h.stub.hold = asyncio.Event()
        pops = [asyncio.create_task(h.pool.pop_worker(key("a"))) for _ in range(4)]
        await wait_until(lambda: len(h.stub.creates()) == 1, what="the create")
        await wait_until(lambda: h.pool.slots[key("a")].count == 4, what="4 starts counted")
        h.pool.check_invariants()
        h.stub.hold.set()
        workers = await asyncio.wait_for(asyncio.gather(*pops), 30)
        assert len({w.pid for w in workers}) == 4
        assert len(h.stub.creates()) == 1
        slot = h.pool.slots[key("a")]
        assert slot.count == len(h.pool.workers) == 4
        assert slot.runtime_env_id == next(iter(h.stub.refs))
        h.pool.check_invariants()
        for worker in workers:
            h.pool.push_worker(worker)
        await drained(h)
        assert len(h.stub.deletes()) == 1


async def test_two_keys_send_two_creates_and_each_holds_one_reference() -> None:
    async with harness() as h:
        await asyncio.gather(*(h.pool.run(TaskSpec(key(k), INFO)) for k in "abab"))
        assert sorted(c.env for c in h.stub.creates()) == [key("a"), key("b")]
        assert sorted(h.stub.refs.values()) == [1, 1]
        assert sum(s.count for s in h.pool.slots.values()) == len(h.pool.workers)
        h.pool.check_invariants()
        await drained(h)
        assert sorted(h.deleted_ids()) == sorted(h.stub.refs)


async def test_workers_run_with_the_contexts_env_vars_cwd_and_python() -> None:
    async with harness() as h:
        spec = TaskSpec(key("a", env_vars={"STUB_VAR": "hello"}), INFO)  # PYTHONPATH -> stubmod
        result = await h.pool.run(spec)
        assert result["var"] == "hello"
        assert result["cwd"] == str(h.stub.workdir)
        assert result["exe"] == sys.executable
        await drained(h)


async def test_delete_is_sent_only_when_the_last_worker_of_a_key_exits() -> None:
    async with harness() as h:
        workers = await asyncio.gather(*(h.pool.pop_worker(key("a")) for _ in range(3)))
        env_id = h.pool.slots[key("a")].runtime_env_id
        for left, worker in zip((2, 1, 0), workers, strict=True):
            os.kill(worker.pid, signal.SIGKILL)
            await wait_until(absent(h.pool.workers, worker.worker_id), what=f"{worker.pid} reaped")
            h.pool.check_invariants()
            if left:
                assert h.pool.slots[key("a")].count == left
                assert h.deleted_ids() == [], f"deleted with {left} workers alive"
        await wait_until(lambda: h.deleted_ids() == [env_id], what="the delete after the last")
        assert key("a") not in h.pool.slots
        assert h.stub.refs == {env_id: 0}
        await drained(h)


async def test_an_idle_worker_is_reused_for_the_next_task_of_its_key() -> None:
    async with harness() as h:
        first = await h.pool.run(TaskSpec(key("a"), INFO))
        second = await h.pool.run(TaskSpec(key("a"), INFO))
        other = await h.pool.run(TaskSpec(key("b"), INFO))
        assert first["pid"] == second["pid"] != other["pid"]
        assert h.pool.stats.workers_started == 2
        assert len(h.stub.creates()) == 2
        h.pool.check_invariants()
        await drained(h)


async def test_an_idle_worker_exits_after_its_idle_timeout_and_the_env_is_deleted() -> None:
    async with harness(idle_timeout_s=0.5) as h:
        pid = (await h.pool.run(TaskSpec(key("a"), INFO)))["pid"]
        idle_since = time.monotonic()
        assert [w.state for w in h.pool.workers.values()] == [WorkerState.IDLE]
        await wait_until(lambda: not h.pool.workers, timeout_s=10, what="the idle exit")
        assert time.monotonic() - idle_since >= 0.4, "exited before its idle timeout"
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="the delete")
        assert not h.pool.slots
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        await drained(h)


async def test_beyond_max_idle_workers_the_worker_idle_longest_is_stopped_and_its_env_deleted() -> (
    None
):
    """Issue 37 (demo --envs 100000 piled up a worker per env): two idle workers at most; a
    worker reused and back is the newest idle one, so the next over the limit stops another."""
    async with harness(max_idle_workers=2) as h:

        def pids(state: WorkerState | None = None) -> set[int]:
            return {w.pid for w in h.pool.workers.values() if state in (None, w.state)}

        a, b, c = [(await h.pool.run(TaskSpec(key(name), INFO)))["pid"] for name in "abc"]
        await wait_until(lambda: a not in pids(), what="a's worker to exit")
        assert pids() == pids(WorkerState.IDLE) == {b, c}
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="a's env deleted")
        assert key("a") not in h.pool.slots
        assert (await h.pool.run(TaskSpec(key("b"), INFO)))["pid"] == b, "b's worker reused"
        d = (await h.pool.run(TaskSpec(key("d"), INFO)))["pid"]
        await wait_until(lambda: c not in pids(), what="c's worker to exit")
        assert pids() == pids(WorkerState.IDLE) == {b, d}
        h.pool.check_invariants()
        await drained(h)


async def test_an_env_kept_alive_is_reused_by_the_next_start_without_a_create() -> None:
    """With env_keepalive_s, the last worker's exit keeps the env (and its reference) a while:
    the next start of the key reuses it, no create, no delete; close() gives it back."""
    async with harness(env_keepalive_s=30.0) as h:
        first = await h.pool.pop_worker(key("warm"))
        os.kill(first.pid, signal.SIGKILL)
        await wait_until(absent(h.pool.workers, first.worker_id), what="the worker reaped")
        assert h.pool.slots[key("warm")].count == 0
        assert h.stub.deletes() == []
        h.pool.check_invariants()
        second = await h.pool.pop_worker(key("warm"))
        assert second.pid != first.pid
        assert len(h.stub.creates()) == 1
        h.pool.push_worker(second)
        await drained(h)
        assert len(h.stub.deletes()) == 1


async def test_an_env_kept_alive_is_deleted_when_its_keepalive_expires() -> None:
    """No start of the key within env_keepalive_s: the delete goes, and the slot with it."""
    async with harness(env_keepalive_s=0.2) as h:
        worker = await h.pool.pop_worker(key("cold"))
        os.kill(worker.pid, signal.SIGKILL)
        await wait_until(lambda: len(h.stub.deletes()) == 1, what="the keep-alive to expire")
        assert key("cold") not in h.pool.slots
        assert all(n == 0 for n in h.stub.refs.values())


async def test_a_create_retried_after_unavailable_carries_the_same_request_id() -> None:
    async with harness() as h:
        h.stub.unavailable = 2
        await h.pool.run(TaskSpec(key("a"), INFO))
        creates = h.stub.creates()
        assert len(creates) == 3
        assert creates[0].request_id
        assert len({c.request_id for c in creates}) == 1
        assert h.stub.refs == {h.pool.slots[key("a")].runtime_env_id: 1}  # counted once
        h.stub.unavailable = 1  # the delete is retried with its id too
        await drained(h)
        deletes = h.stub.deletes()
        assert len(deletes) == 2
        assert deletes[0].request_id == deletes[1].request_id


async def test_retries_are_bounded_and_then_the_task_fails_with_env_setup_failed() -> None:
    async with harness() as h:
        h.stub.unavailable = 100
        with pytest.raises(TaskFailed) as failed:
            await h.pool.run(TaskSpec(key("a"), INFO))
        assert failed.value.status == ENV_SETUP_FAILED
        assert "UNAVAILABLE" in failed.value.message
        assert len(h.stub.creates()) == FAST.attempts
        assert not h.pool.slots
        assert not h.pool.workers
        h.stub.unavailable = 0
        await drained(h)


async def test_a_pop_cancelled_during_the_create_releases_its_count_and_the_env_is_deleted() -> (
    None
):
    async with harness() as h:
        h.stub.hold = asyncio.Event()
        task = asyncio.create_task(h.pool.run(TaskSpec(key("a"), INFO)))
        await wait_until(lambda: len(h.stub.creates()) == 1, what="the create in flight")
        assert h.pool.slots[key("a")].count == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert key("a") not in h.pool.slots, "the cancelled pop kept its count"
        h.pool.check_invariants()
        h.stub.hold.set()
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="the late create given back")
        assert list(h.stub.refs.values()) == [0]
        assert h.pool.stats.workers_started == 0
        await drained(h)


async def test_a_create_refused_invalid_argument_fails_with_env_setup_failed_and_no_slot() -> None:
    async with harness() as h:
        with pytest.raises(TaskFailed) as failed:
            await h.pool.run(TaskSpec(key("a", reject="bad field"), INFO))
        assert failed.value.status == ENV_SETUP_FAILED
        assert "INVALID_ARGUMENT" in failed.value.message
        assert "bad field" in failed.value.message
        assert len(h.stub.creates()) == 1, "a refusal must not be retried"
        assert not h.pool.slots
        assert not h.pool.workers
        assert h.deleted_ids() == []
        await drained(h)


async def test_e2big_at_spawn_fails_fast_with_its_status_releases_the_slot_and_no_retry() -> None:
    async with harness() as h:
        started = time.monotonic()
        with pytest.raises(TaskFailed) as failed:
            await h.pool.run(TaskSpec(key("big", big_var_kib=200), INFO))
        assert time.monotonic() - started < 5.0
        assert failed.value.status == ARGUMENT_LIST_TOO_LONG
        message = failed.value.message
        assert "argument list too long" in message.lower()
        size = re.search(r"(\d+) bytes", message)
        assert size is not None, message
        assert int(size.group(1)) >= 200 * 1024, message
        assert len(h.stub.creates()) == 1
        assert h.pool.stats.workers_started == 0
        assert key("big", big_var_kib=200) not in h.pool.slots
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="the slot's reference released")
        h.pool.check_invariants()
        result = await h.pool.run(TaskSpec(key("small", env_vars={"STUB_VAR": "ok"}), INFO))
        assert result["var"] == "ok"
        await drained(h)


async def test_a_nonexistent_py_executable_fails_with_spawn_failed_and_releases_the_slot() -> None:
    async with harness() as h:
        with pytest.raises(TaskFailed) as failed:
            await h.pool.run(TaskSpec(key("a", py_executable="/nonexistent/python3"), INFO))
        assert failed.value.status == SPAWN_FAILED
        assert "/nonexistent/python3" in failed.value.message
        assert not h.pool.slots
        assert not h.pool.workers
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="the reference released")
        await drained(h)


async def test_a_worker_killed_mid_task_fails_it_with_worker_died_and_releases_its_count() -> None:
    async with harness() as h:
        task = asyncio.create_task(h.pool.run(TaskSpec(key("a"), "time:sleep", (60,))))
        await wait_until(
            lambda: [w.state for w in h.pool.workers.values()] == [WorkerState.BUSY],
            timeout_s=30,
            what="a busy worker",
        )
        (worker,) = h.pool.workers.values()
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(TaskFailed) as failed:
            await asyncio.wait_for(task, 10)
        assert failed.value.status == WORKER_DIED
        await wait_until(lambda: not h.pool.workers and not h.pool.slots, what="released")
        await wait_until(lambda: len(h.deleted_ids()) == 1, what="the delete")
        h.pool.check_invariants()
        await drained(h)


async def test_an_eager_job_sends_its_create_with_its_job_id_and_eager_install_set() -> None:
    """The job's create is sent at start_job, before any worker; its workers then find the env
    ready (no second create), and close() gives back the job's hold with the workers'."""
    async with harness() as h:
        await h.pool.start_job("job-7", key("a"), eager_install=True)
        assert [(c.env, c.job_id, c.eager_install) for c in h.stub.creates()] == [
            (key("a"), "job-7", True)
        ]
        assert h.pool.stats.workers_started == 0
        await h.pool.run(TaskSpec(key("a"), INFO, job_id="job-7"))
        assert len(h.stub.creates()) == 1
        assert h.pool.slots[key("a")].count == 2  # the job and its idle worker
        h.pool.check_invariants()
        await drained(h)
        assert len(h.stub.deletes()) == 1


async def test_a_task_of_a_job_without_eager_install_passes_its_job_id_to_the_create() -> None:
    async with harness() as h:
        await h.pool.start_job("job-8", key("b"), eager_install=False)
        assert h.stub.creates() == []
        await h.pool.run(TaskSpec(key("b"), INFO, job_id="job-8"))
        assert [(c.job_id, c.eager_install) for c in h.stub.creates()] == [("job-8", False)]
        h.pool.finish_job("job-8")
        await drained(h)


# -- raylet_sim is language-agnostic: no agent imports, no URI parsing -------------------------

URI_NAMES = {"urlsplit", "urlparse", "urlunsplit", "urlunparse", "urljoin", "parse_qs"}


def forbidden(source: str) -> list[str]:
    """What in this source imports from ``agent`` or parses a URI."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"imports {a.name}" for a in node.names if a.name in URI_NAMES]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    modules = [arg.value]
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in URI_NAMES:
                found.append(f"uses {name}")
        for module in modules:
            if module == "agent" or module.startswith("agent."):
                found.append(f"imports {module}")
            if module.startswith("urllib"):
                found.append(f"imports {module}")
    return found


def test_the_import_check_catches_agent_imports_and_uri_parsing() -> None:
    bad = (
        "import agent.core.refs\nfrom agent import store\nimport urllib.parse\n"
        "from urllib.parse import urlsplit\nimport importlib\nimportlib.import_module('agent')\n"
    )
    assert len(forbidden(bad)) >= 5
    assert forbidden("from rtenv.v1 import agent_pb2\nimport json\n") == []


def test_raylet_sim_imports_nothing_from_agent_and_parses_no_uri() -> None:
    files = sorted(RAYLET_SIM.glob("*.py"))
    assert {
        "pool.py",
        "slots.py",
        "workers.py",
        "tasks.py",
        "client.py",
        "node.py",
        "sidecar.py",
    } <= {f.name for f in files}
    problems = {f.name: forbidden(f.read_text()) for f in files}
    assert {name: p for name, p in problems.items() if p} == {}
