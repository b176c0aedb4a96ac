"""Regression tests for bugs the chaos runs found in the pool, each pinned deterministically."""

from __future__ import annotations

import logging

import grpc
import pytest

from raylet_sim.client import AgentClient, RetryPolicy
from raylet_sim.pool import WorkerPool
from tests.helpers import short_tempdir


async def test_a_delete_after_the_node_closed_its_channel_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Chaos seed 20261130: a worker reaped after close() scheduled a delete on a closed
    channel, and the task died with UsageError ('Task exception was never retrieved')."""
    channel = grpc.aio.insecure_channel(f"unix:{short_tempdir() / 'none.sock'}")
    pool = WorkerPool(AgentClient(channel, RetryPolicy(attempts=1)))
    await channel.close()
    with caplog.at_level(logging.WARNING, logger="raylet_sim.pool"):
        await pool._delete("0123456789abcdef")  # must not raise
    assert "not sent" in caplog.text
    assert pool.stats.deletes == 0
