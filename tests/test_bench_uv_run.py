"""The uv-run benchmark's oracle (``scripts/benchlib/uv_run_oracle.py``) tells a broken run from
a missed goal, and an expected miss from an unexpected one: the planted lock (``--plant``)
makes the one-venv goal miss, as expected; a venv shared across two locks, or not shared
across one, is a broken run; stock Ray off its uv-run path is a broken baseline."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the benchmark's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from benchlib.figures import WorkloadResult  # noqa: E402
from benchlib.uv_run_oracle import BUILT, PENDING, Outcome, broken, figures, misses, mode_of  # noqa: E402

MiB = 2**20
STOCK = Outcome(
    agent="ray", mode="copy", experiments=3, distinct_locks=1, problems=(), workers=15,
    workers_on_uv=15, venvs=3, processes_left=0, env_bytes=400 * MiB, added_bytes=1200 * MiB,
    wall_s=60.0, first_task_s=50.0, left_bytes=1200 * MiB,
)  # fmt: skip
# this agent as issue 30 item 1 means it: one venv, no worker on uv, nothing left, faster
GOOD = dataclasses.replace(
    STOCK, agent="ours", workers_on_uv=0, venvs=1, added_bytes=420 * MiB, wall_s=40.0,
    first_task_s=20.0, left_bytes=0,
)  # fmt: skip


def _judge(ours: Outcome, planted: bool = False) -> tuple[list[str], list[str]]:
    result = WorkloadResult("uv-run")
    rows = figures(result, STOCK, ours)
    return broken(STOCK) + broken(ours), misses(rows, ours, planted)


def test_the_agent_as_item_1_means_it_meets_every_goal() -> None:
    assert mode_of(GOOD) == BUILT
    assert _judge(GOOD) == ([], [])


def test_a_planted_lock_makes_the_one_venv_goal_miss_as_expected() -> None:
    planted = dataclasses.replace(GOOD, distinct_locks=2, venvs=2)
    bad, missed = _judge(planted, planted=True)
    assert bad == []
    assert len(missed) == 1
    assert missed[0].startswith("EXPECTED miss: [copy] venvs built")
    assert "--plant" in missed[0]


def test_a_venv_shared_across_two_locks_is_a_broken_run() -> None:
    bad, _ = _judge(dataclasses.replace(GOOD, distinct_locks=2, venvs=1), planted=True)
    assert bad == ["ours, copy: 1 venv(s) for 2 distinct locks: shared across locks"]


def test_one_lock_built_three_times_is_a_broken_run_and_an_unexpected_miss() -> None:
    bad, missed = _judge(dataclasses.replace(GOOD, venvs=3))
    assert bad == ["ours, copy: 3 venvs for 1 distinct lock(s): not shared"]
    assert missed == ["UNEXPECTED miss: [copy] venvs built for the workers, this agent"]


def test_a_slow_agent_is_an_unexpected_miss_not_a_broken_run() -> None:
    bad, missed = _judge(dataclasses.replace(GOOD, wall_s=55.0))
    assert bad == []
    assert missed == ["UNEXPECTED miss: [copy] wall of 3 experiments"]


def test_before_item_1_the_agents_misses_are_expected_and_its_k_venvs_consistent() -> None:
    pending = dataclasses.replace(STOCK, agent="ours", left_bytes=0)
    assert mode_of(pending) == PENDING
    bad, missed = _judge(pending)
    assert bad == []
    assert missed
    assert all(m.startswith("EXPECTED miss: ") for m in missed)
    assert all("item 1 not in this checkout" in m for m in missed)


def test_a_baseline_off_the_uv_run_path_or_a_failed_driver_is_a_broken_run() -> None:
    off_path = dataclasses.replace(STOCK, workers_on_uv=10)
    assert broken(off_path) == ["ray, copy: 5 of Ray's workers did not run uv"]
    failed = dataclasses.replace(GOOD, problems=("experiment 2: its driver exited 1",))
    assert broken(failed) == ["ours, copy: experiment 2: its driver exited 1"]
    mixed = dataclasses.replace(GOOD, workers_on_uv=4)
    assert broken(mixed) == ["ours, copy: 4 of 15 workers ran uv: neither all nor none"]
    left = dataclasses.replace(GOOD, processes_left=2)
    assert broken(left) == ["ours, copy: 2 process(es) of a cluster outlived its driver"]
