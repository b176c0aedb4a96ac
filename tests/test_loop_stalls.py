"""What would stall the agent's event loop while it is idle: the cyclic garbage collector's
full passes over the start-up heap (``agent.ops.server.freeze_start_heap``)."""

from __future__ import annotations

import gc
import re
from pathlib import Path

from agent.ops.server import freeze_start_heap
from tests.harness.agent_process import serving, wait_health_serving
from tests.harness.in_process import running_agent
from tests.harness.metrics import scrape, value
from tests.harness.polling import wait_until


async def test_the_cli_process_freezes_its_start_up_heap_before_it_serves(base: Path) -> None:
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        await wait_health_serving(agent.address)
        pattern = re.compile(r"INFO agent\.ops\.server: start-up heap frozen: (\d+) objects$", re.M)
        await wait_until(
            lambda: pattern.search(agent.log_text()) is not None, timeout_s=10,
            what="the start-up heap's freeze logged",
        )  # fmt: skip
        match = pattern.search(agent.log_text())
        assert match is not None
        # the modules, protobuf descriptors and gRPC server of a started agent: tens of
        # thousands of objects a full collection no longer walks
        assert int(match.group(1)) > 10_000, agent.log_text()


def test_a_frozen_heap_leaves_the_collector_only_what_was_made_after() -> None:
    tracked = len(gc.get_objects())
    try:
        frozen = freeze_start_heap()
        assert frozen >= tracked
        young = [[i] for i in range(1000)]  # tracked containers made after the freeze
        assert len(gc.get_objects()) < 2 * len(young) + 1000 < frozen
        assert all(any(x is y for y in gc.get_objects()) for x in young[:3])
    finally:
        gc.unfreeze()  # this test process's heap back to the oldest generation
    assert gc.get_freeze_count() == 0


async def test_the_collectors_pauses_are_scraped_by_generation_while_the_agent_runs() -> None:
    callbacks = list(gc.callbacks)
    async with running_agent(metrics_address="127.0.0.1:0") as ra:
        assert len(gc.callbacks) == len(callbacks) + 1
        before = await scrape(ra.agent.metrics_address)
        full = value(before, "rtenv_gc_pause_seconds_count", {"generation": "2"})
        gc.collect()  # a full pass, in this process (the agent's)
        gc.collect(0)
        after = await scrape(ra.agent.metrics_address)
        assert value(after, "rtenv_gc_pause_seconds_count", {"generation": "2"}) >= full + 1
        assert value(after, "rtenv_gc_pause_seconds_count", {"generation": "0"}) >= 1
        assert value(after, "rtenv_gc_pause_seconds_sum", {"generation": "2"}) > 0
        inf = {"generation": "2", "le": "+Inf"}
        assert value(after, "rtenv_gc_pause_seconds_bucket", inf) == value(
            after, "rtenv_gc_pause_seconds_count", {"generation": "2"}
        )
    assert gc.callbacks == callbacks, "the stopped agent left its callback in gc.callbacks"
