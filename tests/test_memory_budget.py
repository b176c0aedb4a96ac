"""What an env costs in memory, pinned: envs created through a real ``AgentService`` (the unit
tier's rig: a real store over ``MockPackages``, the index in memory), the bytes Python allocated
for them counted by ``tracemalloc``, per env, under a budget with margin.

The benchmark's figure is RSS per env with 100,000 envs (``scripts/bench.py --only recovery``,
goal under 1 kB); RSS is noisy, allocations are not: the same creates allocate the same bytes
every run. The envs are the benchmark's (one shared package, a variable of their own), each
created by one job, after enough creates that every bounded cache (parsed envs, shared tuples)
is full: what is left per env is what the service keeps for it.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from tests.harness.packages import env_json
from tests.harness.service_rig import service_rig

WARM = 4_200  # creates before the measure: past every bounded cache's 4,096 entries
ENVS = 6_000  # creates measured (the two tables grow through one resize each meanwhile)
BUDGET = 700  # bytes per env; today about 480 (2,000 before the records were cut down)


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def test_an_env_costs_under_the_budget_in_allocated_bytes(tmp_path: Path) -> None:
    async with service_rig(tmp_path) as r:
        r.clock.now = 1.8e9  # a timestamp in ms takes what a real one takes
        url = r.packages.add("shared")
        service = r.service

        async def create(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                env = env_json(py_modules=[url], env_vars={"BENCH_ENV": str(i)})
                await service.create(env, 0, "", job_id="01000000")

        tracemalloc.start(1)
        try:
            await create(-WARM, 0)
            before = _traced()
            await create(0, ENVS)
            grown = _traced() - before
        finally:
            tracemalloc.stop()
        assert len(service.records) == WARM + ENVS
        r.check()
        per_env = grown / ENVS
        assert per_env < BUDGET, f"{per_env:.0f} bytes allocated per env; the budget is {BUDGET}"
