"""Regression tests for bugs the chaos runs found in the pool, each pinned deterministically."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from raylet_sim.client import AgentClient, RetryPolicy
from raylet_sim.pool import WorkerPool
from tests.helpers import wait_until
from tests.test_pool_unit import harness, key


async def test_a_delete_after_the_node_closed_its_channel_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, base: Path
) -> None:
    """Chaos seed 20261130: a worker reaped after close() scheduled a delete on a closed
    channel, and the task died with UsageError ('Task exception was never retrieved')."""
    channel = grpc.aio.insecure_channel(f"unix:{base / 'none.sock'}")
    pool = WorkerPool(AgentClient(channel, RetryPolicy(attempts=1)))
    await channel.close()
    with caplog.at_level(logging.WARNING, logger="raylet_sim.pool"):
        await pool._delete("0123456789abcdef")  # must not raise
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
