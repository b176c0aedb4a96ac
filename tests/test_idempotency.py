"""Unit tests for RequestLog: a request id is answered again, never run twice."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agent.app.idempotency import RequestLog
from agent.core.errors import RequestIdReused

DEADLINE_S = 5.0


class Op:
    """A counted operation; when ``gate`` is given it holds until the gate is set."""

    def __init__(self, result: str, *, gate: asyncio.Event | None = None) -> None:
        self.result = result
        self.gate = gate
        self.calls = 0
        self.started = asyncio.Event()
        self.fail_next: Exception | None = None

    async def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return f"{self.result}#{self.calls}"


async def joined_run(
    log: RequestLog, request_id: str, op: Callable[[], Awaitable[str]]
) -> asyncio.Task[str]:
    """Start ``log.run`` in a task and return once it is parked in the log.

    ``entered`` is set right before ``run`` is called; ``run`` reaches its first await without
    yielding, so once the test sees ``entered`` the task is waiting inside the log.
    """
    entered = asyncio.Event()

    async def call() -> str:
        entered.set()
        return await log.run("create", request_id, "fp", op)

    task = asyncio.create_task(call())
    async with asyncio.timeout(DEADLINE_S):
        await entered.wait()
    return task


async def test_same_request_id_runs_once_and_is_answered_again() -> None:
    log = RequestLog(capacity=10)
    op = Op("r")
    first = await log.run("create", "id-1", "fp", op)
    second = await log.run("create", "id-1", "fp", op)
    assert first == second == "r#1"
    assert op.calls == 1
    assert len(log) == 1


async def test_other_rpc_or_other_id_runs_separately() -> None:
    log = RequestLog(capacity=10)
    op = Op("r")
    assert await log.run("create", "id-1", "fp", op) == "r#1"
    assert await log.run("delete", "id-1", "fp", op) == "r#2"
    assert await log.run("create", "id-2", "fp", op) == "r#3"
    assert op.calls == 3


async def test_concurrent_duplicate_joins_the_call_in_flight() -> None:
    log = RequestLog(capacity=10)
    gate = asyncio.Event()
    op = Op("first", gate=gate)
    first = asyncio.create_task(log.run("create", "id-1", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    retry_op = Op("retry")
    retry = await joined_run(log, "id-1", retry_op)
    assert not retry.done()
    gate.set()
    async with asyncio.timeout(DEADLINE_S):
        results = await asyncio.gather(first, retry)
    assert list(results) == ["first#1", "first#1"]
    assert (op.calls, retry_op.calls) == (1, 0)


async def test_failed_attempt_is_forgotten_so_a_retry_runs_again() -> None:
    log = RequestLog(capacity=10)
    op = Op("r")
    op.fail_next = ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        await log.run("create", "id-1", "fp", op)
    assert len(log) == 0
    assert await log.run("create", "id-1", "fp", op) == "r#2"
    assert op.calls == 2


async def test_a_joined_retry_gets_the_failure_of_the_attempt_in_flight() -> None:
    log = RequestLog(capacity=10)
    gate = asyncio.Event()
    op = Op("r", gate=gate)
    op.fail_next = ValueError("boom")
    first = asyncio.create_task(log.run("create", "id-1", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    retry_op = Op("retry")
    retry = await joined_run(log, "id-1", retry_op)
    gate.set()
    async with asyncio.timeout(DEADLINE_S):
        outcomes = await asyncio.gather(first, retry, return_exceptions=True)
    assert [str(o) for o in outcomes] == ["boom", "boom"]
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert (op.calls, retry_op.calls) == (1, 0)


async def test_cancelled_attempt_lets_a_later_retry_run_afresh() -> None:
    log = RequestLog(capacity=10)
    op = Op("r", gate=asyncio.Event())
    first = asyncio.create_task(log.run("create", "id-1", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert len(log) == 0
    retry_op = Op("retry")
    assert await log.run("create", "id-1", "fp", retry_op) == "retry#1"
    assert retry_op.calls == 1


async def test_a_retry_joined_to_a_cancelled_attempt_runs_it_itself() -> None:
    log = RequestLog(capacity=10)
    op = Op("r", gate=asyncio.Event())
    first = asyncio.create_task(log.run("create", "id-1", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    retry_op = Op("retry")
    retry = await joined_run(log, "id-1", retry_op)
    first.cancel()
    async with asyncio.timeout(DEADLINE_S):
        assert await retry == "retry#1"
    assert first.cancelled()
    assert (op.calls, retry_op.calls) == (1, 1)
    assert await log.run("create", "id-1", "fp", Op("third")) == "retry#1"


async def test_cancelling_a_joined_retry_leaves_the_attempt_running() -> None:
    log = RequestLog(capacity=10)
    gate = asyncio.Event()
    op = Op("r", gate=gate)
    first = asyncio.create_task(log.run("create", "id-1", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    retry = await joined_run(log, "id-1", Op("retry"))
    retry.cancel()
    with pytest.raises(asyncio.CancelledError):
        await retry
    gate.set()
    async with asyncio.timeout(DEADLINE_S):
        assert await first == "r#1"


async def test_same_id_with_another_fingerprint_is_request_id_reused() -> None:
    log = RequestLog(capacity=10)
    gate = asyncio.Event()
    op = Op("r", gate=gate)
    first = asyncio.create_task(log.run("create", "id-1", "fp-a", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    with pytest.raises(RequestIdReused, match="'id-1' was already used for a different create"):
        await log.run("create", "id-1", "fp-b", op)  # while in flight
    gate.set()
    async with asyncio.timeout(DEADLINE_S):
        assert await first == "r#1"
    with pytest.raises(RequestIdReused):
        await log.run("create", "id-1", "fp-b", op)  # after success
    assert op.calls == 1


async def test_capacity_bound_evicts_the_oldest_request_ids() -> None:
    log = RequestLog(capacity=2)
    op = Op("r")
    for request_id in ("id-1", "id-2", "id-3"):
        await log.run("create", request_id, "fp", op)
    assert len(log) == 2
    assert await log.run("create", "id-3", "fp", op) == "r#3"  # remembered
    assert await log.run("create", "id-2", "fp", op) == "r#2"  # remembered
    assert op.calls == 3
    assert await log.run("create", "id-1", "fp", op) == "r#4"  # forgotten: runs again
    assert len(log) == 2


async def test_capacity_eviction_never_forgets_an_attempt_in_flight() -> None:
    """A retry of a still-running request joins it even after newer requests filled the log."""
    log = RequestLog(capacity=1)
    gate = asyncio.Event()
    op = Op("slow", gate=gate)
    slow = asyncio.create_task(log.run("create", "id-slow", "fp", op))
    async with asyncio.timeout(DEADLINE_S):
        await op.started.wait()
    assert await log.run("create", "id-fast", "fp", Op("fast")) == "fast#1"
    retry_op = Op("retry", gate=gate)
    retry = await joined_run(log, "id-slow", retry_op)
    gate.set()
    async with asyncio.timeout(DEADLINE_S):
        results = await asyncio.gather(slow, retry)
    assert list(results) == ["slow#1", "slow#1"]
    assert retry_op.calls == 0


async def test_an_empty_request_id_is_never_cached() -> None:
    log = RequestLog(capacity=10)
    op = Op("r")
    assert await log.run("create", "", "fp", op) == "r#1"
    assert await log.run("create", "", "other-fp", op) == "r#2"
    assert op.calls == 2
    assert len(log) == 0
