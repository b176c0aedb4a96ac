"""Regression tests for bugs the chaos runs found in the pool, each pinned deterministically."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from pathlib import Path

import grpc
import pytest

from raylet_sim import workers as workers_module
from raylet_sim.client import AgentClient, RetryPolicy
from raylet_sim.pool import TaskFailed, TaskSpec, WorkerPool, WorkerState
from raylet_sim.workers import Worker
from tests.harness.polling import wait_until
from tests.harness.stub_agent import INFO, absent, harness, key


async def test_a_delete_after_the_node_closed_its_channel_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, base: Path
) -> None:
    """Chaos seed 20261130: a worker reaped after close() scheduled a delete on a closed
    channel, and the task died with UsageError ('Task exception was never retrieved')."""
    channel = grpc.aio.insecure_channel(f"unix:{base / 'none.sock'}")
    pool = WorkerPool(AgentClient(channel, RetryPolicy(attempts=1)))
    await channel.close()
    with caplog.at_level(logging.WARNING, logger="raylet_sim.slots"):
        await pool.env_slots._delete("0123456789abcdef")  # must not raise
    assert "not sent" in caplog.text
    assert pool.stats.deletes == 0


async def test_close_waits_for_a_create_in_flight_and_sends_its_delete_first() -> None:
    """Chaos seed 20261130 (300 rounds): a create answered after close() had stopped the
    workers scheduled its delete on the node's closed channel; the reference was lost."""
    async with harness() as h:
        h.stub.hold = asyncio.Event()
        pop = asyncio.create_task(h.pool.pop_worker(key("late")))
        await wait_until(lambda: len(h.stub.creates()) == 1, what="the create in flight")
        pop.cancel()
        closing = asyncio.create_task(h.pool.close())
        await wait_until(lambda: not h.pool.slots, what="the cancelled pop to uncount")
        assert not closing.done(), "close() returned with a create still in flight"
        h.stub.hold.set()
        await asyncio.wait_for(closing, 10)
        assert len(h.stub.deletes()) == 1
        assert all(n == 0 for n in h.stub.refs.values()), h.stub.refs


async def test_a_pop_right_after_the_idle_timer_fired_never_gets_the_worker_being_stopped() -> None:
    """Issue 12 (demo --tasks 2000 --envs 100 failed WORKER_DIED 'Connection lost'): the idle
    timer closed a worker's stdin but left it IDLE in the idle list, and the next pop of its key
    handed that dying worker a task. The worker is SIGSTOPped so it cannot exit and be reaped
    first: the pop races the timer deterministically."""
    async with harness(idle_timeout_s=0.05) as h:
        first = await h.pool.pop_worker(key("a"))
        os.kill(first.pid, signal.SIGSTOP)  # alive, but it cannot read its EOF and exit
        try:
            h.pool.push_worker(first)
            stdin = first.process.stdin
            assert stdin is not None
            await wait_until(stdin.is_closing, what="the idle timer to close its stdin")
            second = await asyncio.wait_for(h.pool.pop_worker(key("a")), 30)
            assert second is not first, "the pool handed out the worker it is stopping"
            assert first.state is WorkerState.STOPPING
            h.pool.check_invariants()
            assert second.pid != first.pid
            assert h.pool.slots[key("a")].count == 2  # the one stopping counts until reaped
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first.pid, signal.SIGCONT)
        await wait_until(absent(h.pool.workers, first.worker_id), what="the stopped one reaped")
        h.pool.push_worker(second)
        assert (await h.pool.run(TaskSpec(key("a"), INFO)))["pid"] == second.pid
        h.pool.check_invariants()


async def test_check_invariants_reports_a_worker_being_stopped_in_the_idle_list() -> None:
    """P0: a STOPPING worker must not be found where pops look for idle workers."""
    async with harness() as h:
        worker = await h.pool.pop_worker(key("a"))
        h.pool.push_worker(worker)
        h.pool.check_invariants()
        h.pool._terminate(worker)
        h.pool.check_invariants()
        h.pool._idle[key("a")] = [worker]  # what the pool did before the fix
        with pytest.raises(AssertionError, match=r"P0: worker .* is stopping in the idle list"):
            h.pool.check_invariants()
        h.pool._idle[key("a")] = []


async def test_a_task_cancelled_mid_call_does_not_leave_its_reply_to_the_next_task() -> None:
    """Found while making Ctrl-C clean (issue 12): a task cancelled while its worker ran it put
    the worker back in the idle list; the next task of the key got the cancelled one's reply."""
    async with harness() as h:
        cancelled = asyncio.create_task(h.pool.run(TaskSpec(key("a"), "time:sleep", (0.3,))))
        await wait_until(
            lambda: [w.state for w in h.pool.workers.values()] == [WorkerState.BUSY],
            timeout_s=30,
            what="a busy worker",
        )
        (busy,) = h.pool.workers.values()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        result = await asyncio.wait_for(h.pool.run(TaskSpec(key("a"), INFO)), 30)
        assert isinstance(result, dict), f"the next task got the cancelled one's reply: {result}"
        assert result["pid"] != busy.pid
        await wait_until(absent(h.pool.workers, busy.worker_id), what="the cancelled one to exit")
        h.pool.check_invariants()


@pytest.mark.parametrize("exited_first", [False, True], ids=["stopping", "exited"])
async def test_a_worker_whose_pool_closes_while_it_starts_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch, exited_first: bool
) -> None:
    """Found in review: close() stopped a worker still starting (STOPPING, stdin closed), and
    its ready line then made it BUSY and handed it a task that could only die. The pop now
    fails as the pool shutting down, whether its ready line is read while the worker stops or
    (``exited``, the CI flake's other half) the worker is gone first, its line never read."""
    go = asyncio.Event()
    real_wait_ready = workers_module.wait_ready

    async def held_wait_ready(worker: Worker) -> None:
        await go.wait()
        if exited_first:
            assert worker.process.stdout is not None
            await worker.process.stdout.read()  # its ready line, and EOF: nothing left
        await real_wait_ready(worker)

    monkeypatch.setattr(workers_module, "wait_ready", held_wait_ready)
    async with harness() as h:
        pop = asyncio.create_task(h.pool.pop_worker(key("a")))
        await wait_until(lambda: len(h.pool.workers) == 1, what="the worker spawned")
        (worker,) = h.pool.workers.values()
        closing = asyncio.create_task(h.pool.close())
        if exited_first:
            await wait_until(lambda: worker.state is WorkerState.EXITED, timeout_s=30, what="exit")
        else:
            # One turn of the loop runs close() to its first wait: the worker is STOPPING, its
            # stdin closed, and its exit cannot be reaped yet (that needs another turn). Polling
            # for STOPPING let a quick worker exit unseen (the CI flake).
            await asyncio.sleep(0)
            stopping = worker.state  # a local: mypy would narrow worker.state for good
            assert stopping is WorkerState.STOPPING, stopping
        go.set()
        with pytest.raises(TaskFailed, match="shutting down"):
            await asyncio.wait_for(pop, 30)
        assert worker.state is not WorkerState.BUSY
        await asyncio.wait_for(closing, 30)
        assert not h.pool.workers
        h.pool.check_invariants()


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("pass", "exited before reporting ready"),
        ("print('hello')", "wrote b'hello\\n', not ready"),
    ],
)
async def test_a_worker_that_fails_to_start_is_told_apart_from_a_slow_one(
    script: str, why: str
) -> None:
    """wait_ready said "did not report ready within 30s" for a worker that had exited at once:
    its message now says which of exit, a wrong first line or the timeout it was."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        with pytest.raises(TaskFailed, match=f"worker {process.pid} {re.escape(why)}$"):
            await workers_module.wait_ready(Worker(1, "k", process), timeout_s=30)
    finally:
        await asyncio.wait_for(process.wait(), 30)
