"""The uv-scale workload's oracle, pure: what its rounds' numbers mean (``benchlib/uv_scale.py``).

An ``Attempt`` is one run of an experiment's driver, ``Round`` one of the three rounds on one
root, ``Run`` one agent's three rounds. ``broken`` lists what makes a run wrong whatever the
goals say (the workload fails on it): a driver the run did not kill that failed or did not
finish (a relaunch included), a worker with another version of the stack than pinned, stock
Ray off its ``uv run`` path, a kill that hit nothing, or this agent's venvs not one per
distinct lock (two for one lock: the planted defect, ``--plant``, is caught here). A failure of
an attempt the run killed (its driver SIGKILLed, or its raylet) is expected: counted, never
broken. ``figures`` adds the goals' rows; ``misses`` labels each missed goal EXPECTED (why) or
UNEXPECTED, as the uv-run oracle does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from benchlib.figures import Figure, Goal, WorkloadResult

GOAL_DISK = 1.1  # peak disk added over the three rounds, against one env's bytes
GOAL_WARM_FIRST = 0.7  # time to first task on a warm cache, against stock's

RUN = "run"
KILLED_DRIVER = "killed-driver"  # its driver SIGKILLed mid-round
KILLED_RAYLET = "killed-raylet"  # its raylet SIGKILLed mid-round
RELAUNCH = "relaunch"  # a killed experiment run again, as its user does
KILLED = (KILLED_DRIVER, KILLED_RAYLET)


@dataclass(frozen=True)
class Attempt:
    experiment: int
    kind: str  # RUN, KILLED_DRIVER, KILLED_RAYLET, RELAUNCH
    code: int | None  # the driver's (uv run's) exit code
    done: bool  # the driver reported its last fact
    tasks: int  # tasks that reported
    failures: tuple[str, ...]  # failed tasks: the exception's class and first line
    first_task_s: float | None  # from its spawn to its first task's result
    problems: tuple[str, ...] = ()  # a worker with the wrong stack
    workers: int = 0
    workers_on_uv: int = 0
    reused: bool = False  # its workers ran a venv built before it started
    kill_landed: bool = True  # a killed attempt: the kill found its process running


@dataclass(frozen=True)
class Round:
    index: int  # 1 (uv's cache cold), 2 (the kills), 3
    attempts: tuple[Attempt, ...]
    unregistered: int  # "have not registered within the timeout" lines in its raylets' logs
    left_runtime_bytes: int  # in its sessions' runtime_resources after it
    left_agent: tuple[str, ...]  # of the agent in its root after it: sockets, holders, ...
    processes_left: int  # of its clusters, 30 s after their drivers ended

    def firsts(self) -> list[float]:
        """Each unkilled attempt's time to first task."""
        return [a.first_task_s for a in self.attempts
                if a.kind not in KILLED and a.first_task_s is not None]  # fmt: skip


@dataclass(frozen=True)
class Run:
    agent: str  # "ray" (stock) or "ours"
    experiments: int
    distinct_locks: int
    env_bytes: int  # one env: experiment 1's .venv
    added_bytes: int  # the peak over the three rounds, minus the sample before round 1
    venvs: int  # built for the workers over the rounds (Ray's temp dirs, the agent's root)
    rounds: tuple[Round, ...]
    planted: bool = False

    def attempts(self) -> list[Attempt]:
        return [a for r in self.rounds for a in r.attempts]

    def first_task(self, warm: bool) -> float:
        """The median time to first task, round 1 (cold) or rounds 2-3 (warm)."""
        found = [t for r in self.rounds if (r.index > 1) == warm for t in r.firsts()]
        return statistics.median(found) if found else float("nan")

    def unexpected_failures(self) -> list[str]:
        return [f for a in self.attempts() if a.kind not in KILLED for f in a.failures]

    def expected_failures(self) -> list[str]:
        return [f for a in self.attempts() if a.kind in KILLED for f in a.failures]


def broken(run: Run) -> list[str]:
    """What is wrong with a run whatever the goals say (empty: nothing)."""
    out = []
    for r in run.rounds:
        for a in r.attempts:
            where = f"{run.agent}, round {r.index}, experiment {a.experiment} ({a.kind})"
            if a.kind in KILLED:
                if not a.kill_landed:
                    out.append(f"{where}: the kill found nothing running: no kill was tested")
                continue
            if a.code != 0 or not a.done:
                out.append(f"{where}: its driver exited {a.code}, done={a.done}")
            out += [f"{where}: {p}" for p in a.problems]
    workers = sum(a.workers for a in run.attempts())
    on_uv = sum(a.workers_on_uv for a in run.attempts())
    if run.agent == "ray":
        if on_uv != workers:
            out.append(f"ray: {workers - on_uv} of Ray's {workers} workers did not run uv")
        return out
    if on_uv:
        out.append(f"ours: {on_uv} of {workers} workers ran uv: this agent did not build")
    if run.venvs > run.distinct_locks:
        out.append(f"ours: {run.venvs} venvs for {run.distinct_locks} distinct lock(s): a "
                   "second venv for the same lock")  # fmt: skip
    elif run.venvs < run.distinct_locks:
        out.append(f"ours: {run.venvs} venv(s) for {run.distinct_locks} distinct locks: shared "
                   "across locks")  # fmt: skip
    return out


def figures(result: WorkloadResult, stock: Run, ours: Run) -> list[Figure]:
    """Both agents' rows, side by side; returns those with goals."""
    k = ours.experiments
    one_env = "one env's bytes (experiment 1's .venv)"
    relaunches = [a for a in ours.attempts() if a.kind == RELAUNCH]
    stock_relaunches = [a for a in stock.attempts() if a.kind == RELAUNCH]

    def total(run: Run, what: str) -> float:
        rounds = run.rounds
        if what == "unregistered":
            return float(sum(r.unregistered for r in rounds))
        if what == "left":
            return float(sum(len(r.left_agent) for r in rounds))
        return float(sum(r.left_runtime_bytes for r in rounds))

    rows = [
        result.figure(
            f"peak disk added by {k} experiments over 3 rounds, this agent",
            float(ours.added_bytes), float(ours.env_bytes), one_env, "bytes",
            Goal("ratio", "<=", GOAL_DISK),
        ),
        result.figure(
            f"peak disk added by {k} experiments over 3 rounds, Ray's agent",
            float(stock.added_bytes), float(stock.env_bytes), one_env, "bytes",
        ),
        result.figure(
            "time to first task, warm cache (rounds 2-3), median", ours.first_task(True),
            stock.first_task(True), "the same on Ray's agent", "s",
            Goal("ratio", "<=", GOAL_WARM_FIRST),
        ),
        result.figure(
            "time to first task, cold cache (round 1), median", ours.first_task(False),
            stock.first_task(False), "the same on Ray's agent", "s",
        ),
        result.figure(
            "tasks failed that the run did not kill, this agent",
            float(len(ours.unexpected_failures())), float(len(stock.unexpected_failures())),
            "Ray's agent's", "tasks", Goal("value", "==", 0, "none: == 0"),
        ),
        result.figure(
            "workers that never registered, this agent", total(ours, "unregistered"),
            total(stock, "unregistered"), "Ray's agent's", "workers",
            Goal("value", "==", 0, "none: == 0"),
        ),
        result.figure(
            "the agent's left-overs in its root after the rounds, this agent",
            total(ours, "left"), total(stock, "left"), "Ray's agent's", "items",
            Goal("value", "==", 0, "nothing left: == 0"),
        ),
        result.figure(
            "bytes left in the Ray temp dirs' runtime_resources after the rounds, this agent",
            total(ours, "runtime"), total(stock, "runtime"), "Ray's agent's", "bytes",
            Goal("value", "==", 0, "nothing left: == 0"),
        ),
        result.figure(
            "relaunched experiments that reused the env, this agent",
            float(sum(a.reused for a in relaunches)), float(sum(a.reused for a in
                                                                stock_relaunches)),
            "Ray's agent's", "experiments",
            Goal("value", "==", float(len(relaunches) or 1), "every relaunch"),
        ),
        result.figure(
            "venvs built for the workers over the rounds, this agent", float(ours.venvs),
            float(stock.venvs), "Ray's agent's", "venvs",
            Goal("value", "==", float(ours.distinct_locks), "one per distinct lock"),
        ),
    ]  # fmt: skip
    return [f for f in rows if f.goal is not None]


def misses(rows: Sequence[Figure], ours: Run) -> list[str]:
    """Each missed goal among ``rows``: EXPECTED (why) or UNEXPECTED."""
    out = []
    planted_rows = ("peak disk", "venvs built", "reused the env")
    for f in rows:
        if f.goal_met:
            continue
        if ours.planted and any(p in f.metric for p in planted_rows):
            why = "--plant: one experiment's line makes this agent build a second venv"
            out.append(f"EXPECTED miss: {f.metric}: {why}")
        else:
            out.append(f"UNEXPECTED miss: {f.metric}")
    return out
