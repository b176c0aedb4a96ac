"""The uv-scale benchmark's oracle (``scripts/benchlib/uv_scale_oracle.py``) tells a broken run
from a missed goal, an expected failure (what the run killed) from an unexpected one, and fails
on the planted defect, a second venv for the same lock, naming it."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the benchmark's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from benchlib.figures import WorkloadResult  # noqa: E402
from benchlib.proc_cpu import role  # noqa: E402
from benchlib.uv_scale_oracle import (  # noqa: E402
    KILLED_DRIVER,
    KILLED_RAYLET,
    RELAUNCH,
    RUN,
    Attempt,
    Round,
    Run,
    broken,
    figures,
    misses,
)

MiB = 2**20
K = 5


def _attempt(i: int, kind: str = RUN, first: float = 30.0, **kw: object) -> Attempt:
    base = Attempt(experiment=i, kind=kind, code=0, done=True, tasks=6, failures=(),
                   first_task_s=first, workers=6, workers_on_uv=0)  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _round(index: int, first: float, **kw: object) -> Round:
    attempts = [_attempt(i, first=first) for i in range(1, K + 1)]
    if index == 2:  # experiment 1's driver and 2's raylet killed, both relaunched
        killed = ("WorkerCrashedError: the worker died",)
        attempts[0] = _attempt(1, KILLED_DRIVER, code=-9, done=False, tasks=1)
        attempts[1] = _attempt(2, KILLED_RAYLET, code=1, done=False, failures=killed)
        attempts += [_attempt(1, RELAUNCH, first=first, reused=True),
                     _attempt(2, RELAUNCH, first=first, reused=True)]  # fmt: skip
    base = Round(index=index, attempts=tuple(attempts), unregistered=0, left_runtime_bytes=0,
                 left_agent=(), processes_left=0)  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _run(agent: str, first: float, **kw: object) -> Run:
    rounds = tuple(_round(i, first if i > 1 else first * 2) for i in (1, 2, 3))
    base = Run(agent=agent, experiments=K, distinct_locks=1, env_bytes=500 * MiB,
               added_bytes=510 * MiB, venvs=1, rounds=rounds)  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _on_uv(run: Run) -> Run:
    """Every worker of ``run`` on ``uv run`` (stock Ray's path), its relaunches not reusing."""
    rounds = tuple(
        dataclasses.replace(r, attempts=tuple(
            dataclasses.replace(a, workers_on_uv=a.workers, reused=False) for a in r.attempts
        ), left_runtime_bytes=2500 * MiB)
        for r in run.rounds
    )  # fmt: skip
    return dataclasses.replace(run, rounds=rounds)


STOCK = _on_uv(_run("ray", 40.0, added_bytes=8000 * MiB, venvs=17))
GOOD = _run("ours", 25.0)


def _judge(ours: Run) -> tuple[list[str], list[str]]:
    rows = figures(WorkloadResult("uv-scale"), STOCK, ours)
    return broken(STOCK) + broken(ours), misses(rows, ours)


def test_the_agent_as_issue_39_means_it_meets_every_goal() -> None:
    assert _judge(GOOD) == ([], [])


def test_what_the_run_killed_fails_as_expected_and_is_told_apart() -> None:
    assert GOOD.expected_failures() == ["WorkerCrashedError: the worker died"]
    assert GOOD.unexpected_failures() == []
    # the warm median leaves the killed attempts out, the relaunches in
    assert GOOD.first_task(True) == 25.0
    assert GOOD.first_task(False) == 50.0


def test_the_planted_second_venv_for_one_lock_fails_the_run_naming_it() -> None:
    planted = dataclasses.replace(GOOD, venvs=2, planted=True)
    bad, missed = _judge(planted)
    assert bad == ["ours: 2 venvs for 1 distinct lock(s): a second venv for the same lock"]
    assert missed == [
        "EXPECTED miss: venvs built for the workers over the rounds, this agent: --plant: one "
        "experiment's line makes this agent build a second venv"
    ]


def test_a_task_failing_where_nothing_was_killed_is_an_unexpected_miss() -> None:
    r3 = GOOD.rounds[2]
    failing = (dataclasses.replace(r3.attempts[0], failures=("RayTaskError: boom",)),
               *r3.attempts[1:])  # fmt: skip
    run = dataclasses.replace(
        GOOD, rounds=(*GOOD.rounds[:2], dataclasses.replace(r3, attempts=failing))
    )
    bad, missed = _judge(run)
    assert bad == []
    assert missed == ["UNEXPECTED miss: tasks failed that the run did not kill, this agent"]


def test_a_relaunch_that_fails_or_a_kill_that_hit_nothing_is_a_broken_run() -> None:
    r2 = GOOD.rounds[1]
    attempts = list(r2.attempts)
    attempts[-1] = dataclasses.replace(attempts[-1], code=1, done=False)
    attempts[0] = dataclasses.replace(attempts[0], kill_landed=False)
    run = dataclasses.replace(
        GOOD, rounds=(GOOD.rounds[0], dataclasses.replace(r2, attempts=tuple(attempts)),
                      GOOD.rounds[2]),
    )  # fmt: skip
    assert broken(run) == [
        "ours, round 2, experiment 1 (killed-driver): the kill found nothing running: no kill "
        "was tested",
        "ours, round 2, experiment 2 (relaunch): its driver exited 1, done=False",
    ]


def test_left_overs_unregistered_workers_slow_starts_and_rebuilds_miss_unexpectedly() -> None:
    r3 = dataclasses.replace(GOOD.rounds[2], unregistered=2, left_agent=("socket agent-x.sock",))
    slow = dataclasses.replace(GOOD, rounds=(*GOOD.rounds[:2], r3))
    assert _judge(slow)[1] == [
        "UNEXPECTED miss: workers that never registered, this agent",
        "UNEXPECTED miss: the agent's left-overs in its root after the rounds, this agent",
    ]
    slower = [
        tuple(dataclasses.replace(a, reused=False, first_task_s=35.0) for a in r.attempts)
        for r in GOOD.rounds
    ]
    rounds = tuple(
        dataclasses.replace(r, attempts=a) for r, a in zip(GOOD.rounds, slower, strict=True)
    )
    assert _judge(dataclasses.replace(GOOD, rounds=rounds, added_bytes=600 * MiB))[1] == [
        "UNEXPECTED miss: peak disk added by 5 experiments over 3 rounds, this agent",
        "UNEXPECTED miss: time to first task, warm cache (rounds 2-3), median",
        "UNEXPECTED miss: relaunched experiments that reused the env, this agent",
    ]


def test_a_baseline_off_uv_run_or_this_agent_on_it_is_a_broken_run() -> None:
    assert broken(dataclasses.replace(GOOD, agent="ray")) == [
        "ray: 102 of Ray's 102 workers did not run uv"
    ]
    assert broken(_on_uv(GOOD)) == ["ours: 102 of 102 workers ran uv: this agent did not build"]


def test_each_process_of_a_cluster_is_named_by_its_role() -> None:
    worker = ["/x/bin/python", "/x/ray/_private/workers/default_worker.py", "--temp-dir=/t"]
    assert role(["/x/ray/core/src/ray/gcs/gcs_server", "--log_dir=/t"]) == "gcs"
    assert role(["/x/ray/core/src/ray/raylet/raylet", "--x"]) == "raylet"
    assert role(worker) == "worker"
    assert role(["ray::IDLE"]) == "worker"
    assert role(["/home/u/.local/bin/uv", "run", "--python", "3.11", "python", *worker[1:]]) == (
        "worker-uv"
    )
    assert role(["/py", "-u", "-I", "-m", "agent", "ray-agent", "--root=/r"]) == "agent"
    assert role(["/py", "/x/ray/_private/runtime_env/agent/main.py"]) == "agent"
    assert role(["/py", "/x/ray/dashboard/agent.py"]) == "other"
    assert role(["ray::RuntimeEnvAgent"]) == "agent"  # the titles Ray's processes give themselves
    assert role(["ray::DashboardAgent"]) == "other"
    assert role(["ray::Holder"]) == "worker"
