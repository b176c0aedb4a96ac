"""The uv-run workload's oracle, pure: what a round's numbers mean (``benchlib/uv_run.py``).

``Outcome`` is what a round measured, reduced to the numbers the oracle judges. ``broken``
lists what makes a run wrong whatever the goals (the workload fails on it); ``figures`` adds
the goals' rows; ``misses`` labels each missed goal EXPECTED (with its reason) or UNEXPECTED.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchlib.figures import Figure, Goal, WorkloadResult, labelled_misses

GOAL_DISK = 1.15  # peak disk added by the K experiments, against one env's bytes
GOAL_WALL = 0.8  # wall of the K experiments, against stock's

PENDING = "pending"  # this agent's workers ran uv: item 1 (its own build) not in this checkout
BUILT = "built"  # no worker of this agent's ran uv: the agent built the env


@dataclass(frozen=True)
class Outcome:
    agent: str  # "ray" (stock) or "ours"
    mode: str  # UV_LINK_MODE
    experiments: int
    distinct_locks: int  # among the experiments' uv.lock files
    problems: tuple[str, ...]  # per experiment: a failed driver, a wrong worker fact
    workers: int
    workers_on_uv: int
    venvs: int  # built for the workers (under the Ray temp dirs and the agent's root)
    processes_left: int
    env_bytes: int
    added_bytes: int
    wall_s: float
    first_task_s: float  # median over the experiments
    left_bytes: int  # in the Ray temp dirs' runtime_resources after the drivers exit


def mode_of(ours: Outcome) -> str:
    """PENDING when every worker of this agent's ran uv, BUILT when none did, else ""."""
    if not ours.workers:
        return ""
    if ours.workers_on_uv == ours.workers:
        return PENDING
    return BUILT if ours.workers_on_uv == 0 else ""


def broken(o: Outcome) -> list[str]:
    """What is wrong with a round whatever the goals say (empty: nothing)."""
    where = f"{o.agent}, {o.mode}"
    out = [f"{where}: {p}" for p in o.problems]
    if o.processes_left:
        out.append(f"{where}: {o.processes_left} process(es) of a cluster outlived its driver")
    if o.agent == "ray":
        # the baseline must be what the issue describes, or the ratios mean nothing
        if o.workers_on_uv != o.workers:
            out.append(f"{where}: {o.workers - o.workers_on_uv} of Ray's workers did not run uv")
        if o.venvs != o.experiments:
            out.append(f"{where}: Ray's workers built {o.venvs} venvs, not {o.experiments}")
        return out
    mode = mode_of(o)
    if not mode:
        on_uv = f"{o.workers_on_uv} of {o.workers}"
        out.append(f"{where}: {on_uv} workers ran uv: neither all nor none")
    elif mode == PENDING and o.venvs != o.experiments:
        out.append(f"{where}: workers on uv run built {o.venvs} venvs, not {o.experiments}")
    elif mode == BUILT and o.venvs < o.distinct_locks:
        out.append(f"{where}: {o.venvs} venv(s) for {o.distinct_locks} distinct locks: shared "
                   "across locks")  # fmt: skip
    elif mode == BUILT and o.venvs > o.distinct_locks:
        out.append(f"{where}: {o.venvs} venvs for {o.distinct_locks} distinct lock(s): not shared")
    return out


def figures(result: WorkloadResult, stock: Outcome, ours: Outcome) -> list[Figure]:
    """The rows of one link mode; returns those with goals."""
    k, m = stock.experiments, stock.mode
    one_env = "one env's bytes (experiment 1's .venv alone)"
    rows = [
        result.figure(
            f"[{m}] peak disk added by {k} experiments, this agent", float(ours.added_bytes),
            float(ours.env_bytes), one_env, "bytes", Goal("ratio", "<=", GOAL_DISK),
        ),
        result.figure(
            f"[{m}] peak disk added by {k} experiments, Ray's agent", float(stock.added_bytes),
            float(stock.env_bytes), one_env, "bytes",
        ),
        result.figure(
            f"[{m}] wall of {k} experiments", ours.wall_s, stock.wall_s, "the same on Ray's agent",
            "s", Goal("ratio", "<=", GOAL_WALL),
        ),
        result.figure(
            f"[{m}] time to first task, median of {k}", ours.first_task_s, stock.first_task_s,
            "the same on Ray's agent", "s",
        ),
        result.figure(
            f"[{m}] venvs built for the workers, this agent", float(ours.venvs),
            float(stock.venvs), "Ray's agent's", "venvs",
            Goal("value", "==", 1, "one venv for all: == 1"),
        ),
        result.figure(
            f"[{m}] workers that ran uv, this agent", float(ours.workers_on_uv),
            float(ours.workers), "its workers", "workers", Goal("value", "==", 0, "none: == 0"),
        ),
        result.figure(
            f"[{m}] bytes left in the Ray temp dirs' runtime_resources, this agent",
            float(ours.left_bytes), float(stock.left_bytes), "Ray's agent's", "bytes",
            Goal("value", "==", 0, "nothing left: == 0"),
        ),
    ]  # fmt: skip
    return [f for f in rows if f.goal is not None]


def misses(rows: Sequence[Figure], ours: Outcome, planted: bool) -> list[str]:
    """Each missed goal among ``rows``: EXPECTED (why) or UNEXPECTED."""
    pending = mode_of(ours) == PENDING

    def why(f: Figure) -> str:
        if pending:
            return "this agent's workers still ran uv run (issue 30 item 1 not in this checkout)"
        if planted and "venvs built" in f.metric and ours.distinct_locks > 1:
            return f"--plant: {ours.distinct_locks} distinct locks, so one venv is impossible"
        return ""

    return labelled_misses(rows, why)
