"""Every size the workloads use, with the full defaults and the tiny ``--smoke`` ones."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from benchlib.packages import BigSpec

MiB = 2**20


@dataclass(frozen=True)
class Sizes:
    seed: int = 1
    # hot and persistence
    hot_rounds: int = 5
    hot_pairs_c1: int = 1000
    hot_pairs_c64: int = 3000
    hot_warmup_pairs: int = 200
    uvloop: bool = True  # measure uvloop too, when it is installed
    # cold-large, stampede, loop-blocking
    big: BigSpec = field(default_factory=BigSpec)
    cold_rounds: int = 5
    cold_link_rate: int = 128 * 2**20  # cold-large again from a server limited to this
    stampede_envs: int = 50
    stampede_rounds: int = 2
    loop_period_s: float = 0.01
    loop_idle_calls: int = 300
    loop_rounds: int = 3
    # churn
    churn_pairs: int = 2000
    churn_zips: int = 200
    churn_concurrency: int = 16
    churn_budget_bytes: int = 5 * MiB
    churn_zipf_s: float = 1.1
    churn_payload_bytes: tuple[int, int] = (10_000, 90_000)  # each zip's data file, uniform
    # recovery
    recovery_rows: int = 10_000
    recovery_rounds: int = 3
    rss_envs: int = 100_000
    rss_concurrency: int = 64
    rss_time_limit_s: float = 150.0
    # worker-starts
    worker_starts: int = 500
    worker_envs: int = 20
    worker_concurrency: int = 8
    worker_rounds: int = 2
    # peer-e2e (--peer ray): a Ray node runs tasks over runtime envs sharing working_dir zips
    e2e_tasks: int = 500
    e2e_envs: int = 50
    e2e_zips: int = 5
    e2e_cpus: int = 2
    e2e_rounds: int = 2
    # fleet: nodes on private roots and on one shared root, one package server with a limited
    # rate (a cluster's package store: its link is what the nodes share)
    fleet_nodes: int = 8
    fleet_envs: int = 20
    fleet_package_bytes: int = 1 * MiB  # each env's zip: random bytes, incompressible
    fleet_rate_bytes: int = 32 * MiB  # per second, all connections together
    fleet_rounds: int = 3
    # pip
    pip_jobs: int = 10
    pip_payload_kib: int = 256
    # shared-wheels: distinct uv sets sharing one large wheel
    shared_wheel_sets: int = 10
    shared_wheel_bytes: int = 64 * MiB
    # uv-run (only when named): K experiments, each a bare ray.init() under `uv run`
    uv_run_experiments: int = 3
    uv_run_big_mib: float = 150.0  # the large dependency's incompressible payload
    uv_run_plant: bool = False  # one experiment's lock differs: the one-venv goal must miss
    # uv-full (only when named, root): K experiments on lock A and one on lock B, a small disk
    uv_full_experiments: int = 3
    uv_full_big_mib: float = 200.0  # the large dependency's payload, each of its two versions
    uv_full_ours_only: bool = False  # this agent's round alone (stock's: an earlier run's)
    # uv-scale (only when named): K experiments on a real many-file stack, three rounds, kills
    uv_scale_experiments: int = 5
    uv_scale_heavy: bool = False  # torch with its CUDA wheels (GBs) besides the light stack
    uv_scale_plant: bool = False  # one experiment's line makes this agent build a second venv
    uv_scale_stagger_s: float = 10.0  # between two experiments' launches (0: all at once)
    # a bound on any one phase, so nothing can run away
    phase_timeout_s: float = 600.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.__dict__ if isinstance(value, BigSpec) else value
        return out


SMOKE = Sizes(
    fleet_nodes=3,  # 7 agents to start, not 17: the smoke run stays within seconds
    fleet_envs=4,
    fleet_package_bytes=64 * 1024,
    fleet_rate_bytes=8 * MiB,
    fleet_rounds=1,
    pip_jobs=2,
    pip_payload_kib=4,
    shared_wheel_sets=2,
    shared_wheel_bytes=256 * 1024,
    hot_rounds=1,
    hot_pairs_c1=40,
    hot_pairs_c64=150,
    hot_warmup_pairs=10,
    big=BigSpec(small_files=40, small_max_bytes=2000, large_random_mb=(1,), large_text_mb=(1,)),
    stampede_envs=5,
    cold_rounds=1,
    stampede_rounds=1,
    loop_idle_calls=20,
    loop_rounds=1,
    churn_pairs=80,
    churn_zips=20,
    churn_concurrency=4,
    churn_budget_bytes=100_000,
    churn_payload_bytes=(2_000, 20_000),
    recovery_rows=100,
    recovery_rounds=1,
    rss_envs=300,
    rss_time_limit_s=20.0,
    worker_starts=12,
    worker_envs=3,
    worker_concurrency=4,
    worker_rounds=1,
    e2e_tasks=20,
    e2e_envs=4,
    e2e_zips=2,
    e2e_rounds=1,
    phase_timeout_s=40.0,
)


def with_overrides(base: Sizes, overrides: dict[str, Any]) -> Sizes:
    """``base`` with the fields ``overrides`` sets (None: not given); other keys are ignored."""
    names = {f.name for f in fields(Sizes)}
    return replace(base, **{k: v for k, v in overrides.items() if k in names and v is not None})
