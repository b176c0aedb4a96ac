"""The pool's client retries UNAVAILABLE with a jittered exponential backoff (issue 12, item 6).

A real gRPC server (the stub agent of the pool's tests) on a unix socket answers UNAVAILABLE a
few times; the client's sleep and its random source are injected, so the waits are exact.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest

from raylet_sim.client import AgentClient, RetryPolicy
from tests.harness.in_process import served
from tests.harness.stub_agent import StubAgent, key
from tests.harness.tempdirs import short_tempdir

POLICY = RetryPolicy(attempts=4, backoff_initial_s=0.1, backoff_max_s=2.0, jitter=0.5)


@asynccontextmanager
async def stub_channel() -> AsyncIterator[tuple[StubAgent, grpc.aio.Channel]]:
    base = short_tempdir()
    stub = StubAgent(base)
    try:
        async with served(stub, base) as channel:
            yield stub, channel
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _waits(draw: Callable[[], float], failures: int = 3) -> list[float]:
    """The waits of one create that meets ``failures`` UNAVAILABLE answers, then succeeds."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with stub_channel() as (stub, channel):
        stub.unavailable = failures
        client = AgentClient(channel, POLICY, sleep=sleep, draw=draw)
        await client.create(key("a"))
        assert client.calls == failures + 1
    return waits


async def test_each_retry_waits_the_doubled_backoff_less_a_drawn_share_of_it() -> None:
    draws = iter([0.0, 0.5, 0.9])
    waits = await _waits(lambda: next(draws))
    assert waits == pytest.approx([0.1, 0.2 * 0.75, 0.4 * 0.55])


async def test_two_clients_with_different_random_sources_do_not_retry_in_lockstep() -> None:
    first = await _waits(random.Random(1).random)
    second = await _waits(random.Random(2).random)
    assert first != second
    for waits in (first, second):
        for retry, wait in enumerate(waits, start=1):
            backoff = 0.1 * 2 ** (retry - 1)
            assert backoff * 0.5 <= wait <= backoff


def test_the_wait_is_capped_at_backoff_max_and_never_below_its_unjittered_share() -> None:
    for retry in range(1, 20):
        for draw in (0.0, 0.25, 0.999999):
            backoff = min(0.1 * 2 ** (retry - 1), POLICY.backoff_max_s)
            assert backoff * (1 - POLICY.jitter) < POLICY.wait_s(retry, draw) <= backoff
    assert POLICY.wait_s(30, 0.0) == POLICY.backoff_max_s
    assert RetryPolicy(jitter=0.0).wait_s(2, 0.7) == pytest.approx(0.2)
