"""churn: create+delete pairs over many small zips (http, from the package server) chosen by
Zipf, under a cache budget that holds a fraction of them, so the agent evicts all the time.

The figures: pairs per second against the same trace on an agent whose budget holds every zip
(so the cost of eviction and re-downloading shows), the hit rate against an exact LRU
simulation of the same trace with the same budget, and the peak of the unused bytes, sampled
with GetRuntimeEnvsInfo every 20 ms, against the budget.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.baselines import lru_simulation
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult
from benchlib.packages import build_small_zip
from benchlib.procs import AgentProcess, read_all
from benchlib.shared import Shared
from rtenv.v1 import agent_pb2

_SAMPLE_PERIOD_S = 0.02


def zipf_trace(n_keys: int, length: int, s: float, rng: random.Random) -> list[int]:
    """``length`` keys drawn by Zipf(s) over ``n_keys``; which key gets which rank is shuffled."""
    ranked = list(range(n_keys))
    rng.shuffle(ranked)
    weights = [1 / (rank + 1) ** s for rank in range(n_keys)]
    return rng.choices(ranked, weights=weights, k=length)


def build_zips(directory: Path, sizes: Sizes) -> dict[int, int]:
    rng = random.Random(sizes.seed)
    lo, hi = sizes.churn_payload_bytes
    return {
        k: build_small_zip(directory / f"churn{k}.zip", f"churn{k}", rng.randint(lo, hi), k)
        for k in range(sizes.churn_zips)
    }


async def _run(
    root: Path, budget: int, trace: list[int], envs: list[str], sizes: Sizes, shared: Shared
) -> tuple[Measure, int, int, agent_pb2.CacheStats]:
    """The trace through a new agent with ``budget``: its measure, the peak unused bytes seen,
    how many samples saw the unused bytes over the budget, and the agent's cache figures."""
    server = await shared.server()
    peak = over = 0
    await asyncio.to_thread(read_all, shared.packages.glob("churn*.zip"))

    def sample(reply: agent_pb2.GetRuntimeEnvsInfoReply) -> None:
        nonlocal peak, over
        peak = max(peak, reply.cache.unused_bytes)
        over += reply.cache.unused_bytes > budget

    async with (
        AgentProcess(root, "--cache-budget", str(budget)) as agent,
        grpc.aio.insecure_channel(agent.address) as channel,
        grpc.aio.insecure_channel(agent.address) as probe_channel,
    ):
        stub = rpc.stub(channel)
        deadline = time.monotonic() + sizes.phase_timeout_s
        gets = await server.total_gets()
        watch = agent.watch()
        watch.start()
        work = asyncio.ensure_future(
            rpc.pairs(
                stub, lambda i: envs[trace[i]], len(trace), sizes.churn_concurrency,
                deadline_s=deadline,
            )
        )  # fmt: skip
        samples = await rpc.probe_info(
            rpc.stub(probe_channel), _SAMPLE_PERIOD_S, until=work,
            max_calls=int(sizes.phase_timeout_s / _SAMPLE_PERIOD_S) + 1, deadline_s=deadline,
            on_reply=sample,
        )  # fmt: skip
        calls = await work
        usage = watch.stop()
        final = await rpc.info(agent.address)
        sample(final)
        name = f"agent, budget {budget / 2**20:.1f} MiB"
        m = Measure(name, calls.wall_s, 2 * calls.pairs, calls.create_s, usage.cpu_s)
        m.peak_rss_bytes = usage.peak_rss_bytes
        m.downloads = await server.total_gets() - gets
        m.extractions = final.cache.extractions
        m.errors = calls.errors + samples.errors
        if calls.error_sample:
            print(f"churn: {calls.errors} errors, e.g. {calls.error_sample}", flush=True)
    return m, peak, over, final.cache


async def churn_inputs(sizes: Sizes, shared: Shared) -> tuple[dict[int, int], list[str], list[int]]:
    """The churn workload's zips (built and served; their sizes by key), one env per zip, and
    the Zipf trace of env indexes: the same for this agent's churn and the peer run's."""
    server = await shared.server()
    sizes_by_key = await asyncio.to_thread(build_zips, shared.packages, sizes)
    envs = [
        json.dumps({"py_modules": [f"{server.base_url}/churn{k}.zip"]})
        for k in range(sizes.churn_zips)
    ]
    trace = zipf_trace(
        sizes.churn_zips, sizes.churn_pairs, sizes.churn_zipf_s, random.Random(sizes.seed)
    )
    return sizes_by_key, envs, trace


async def bench_churn(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("churn")
    sizes_by_key, envs, trace = await churn_inputs(sizes, shared)
    budget = sizes.churn_budget_bytes
    everything = sum(sizes_by_key.values())
    roomy, _, _, _ = await _run(work / "roomy", 4 * everything, trace, envs, sizes, shared)
    roomy.name = "agent, budget holds all"
    tight, peak, over, cache = await _run(work / "tight", budget, trace, envs, sizes, shared)
    lru_hits, lru_evictions = lru_simulation(trace, sizes_by_key, budget)
    pairs = len(trace)
    tight_pairs = tight.requests // 2
    hit_rate = 1 - (tight.downloads or 0) / tight_pairs if tight_pairs else 0.0
    result.figure(
        f"pairs/s, concurrency {sizes.churn_concurrency}", tight_pairs / tight.wall_s,
        roomy.requests / 2 / roomy.wall_s, "the same trace, a budget that holds every zip",
        "pairs/s",
    )  # fmt: skip
    result.figure(
        "hit rate (1 - downloads at the source/creates)", hit_rate, lru_hits / pairs,
        "exact LRU simulation of the same trace and budget", "fraction",
        Goal("ratio", ">=", 1.0),
    )  # fmt: skip
    result.figure(
        "peak unused bytes (sampled every 20 ms)", peak, budget, "the budget", "bytes",
        Goal("ratio", "<=", 1.0),
    )  # fmt: skip
    result.figure(
        "evictions", cache.evictions, lru_evictions, "the LRU simulation's evictions", "count"
    )
    result.measures = [tight, roomy]
    result.notes.append(
        f"{pairs} pairs over {sizes.churn_zips} zips by Zipf({sizes.churn_zipf_s}), "
        f"{everything / 2**20:.1f} MiB unpacked in all, budget {budget / 2**20:.1f} MiB; "
        f"agent: {cache.evictions} evictions, {cache.hits} hits by its count; "
        f"LRU simulation: {lru_hits} hits, {lru_evictions} evictions; "
        f"{over} samples saw unused bytes over the budget"
    )
    return result
