"""The chaos run on real Ray: rounds of K clusters on one root, faults while they work, and the
oracle's looks.

A round starts every cluster's driver (``attempts.start``), then injects seeded faults
(``faults.inject``) every few seconds into the clusters at work until the round's share of the
run's kills has landed; each cluster's supervisor (``_supervise``) relaunches an attempt that a
fault ended, as its user would, sometimes with a crash point armed in its agents. Then the faults
stop, every cluster finishes its work (relaunched if need be), and at the quiet point (every
driver done, none stopped) the root is looked at with every agent's view; then the drivers stop
their clusters and the root is looked at again, stopped. After the last round the oracle judges
every unit of work and every attempt (``oracle.judge``).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosray import attempts, checks, faults, oracle
from chaosray.attempts import Attempt, Cluster
from chaosray.faults import KINDS, World

STOP_S = 60.0  # a released driver, to stop its cluster and exit
RELAUNCHES = 8  # per cluster and round: past that the round goes on without it (a violation)
_STEP_S = (0.5, 2.5)  # between two faults
_FAULTS_SHARE = 0.75  # of a round's deadline, the most its faults may take
DEAD_LEAVE_S = 5.0  # what a killed cluster left, to go before it is killed


@dataclass(frozen=True)
class Plan:
    seed: int
    rounds: int
    kills: int  # SIGKILLs across the run (crash points that fire included)
    tasks: int  # units of work per attempt
    concurrency: int
    round_s: float  # a round's deadline
    crash_share: float  # of relaunches, those with a crash point armed
    budget: int


@dataclass
class Tally:
    injected: Counter[str] = field(default_factory=Counter)  # fault kind -> injected
    kills: Counter[str] = field(default_factory=Counter)  # kind -> SIGKILLs (crash:* fired)
    faults: list[oracle.Fault] = field(default_factory=list)
    ends: list[oracle.AttemptEnd] = field(default_factory=list)
    outcomes: list[oracle.Outcome] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # the runner's own (fate, the root)
    notes: list[str] = field(default_factory=list)
    rounds_done: int = 0


@dataclass
class Rig:
    """What the run works with."""

    clusters: Sequence[Cluster]
    python: str  # the Ray python the switch is on in
    driver: Path
    env: Mapping[str, str]
    cases: Sequence[Mapping[str, Any]]  # each {"name", "runtime_env", "expect", "paths"}
    root: Path
    world: World
    on_round: Callable[[int, Tally], None] = lambda r, t: None


def _spec(plan: Plan, rig: Rig, r: int, c: Cluster) -> dict[str, Any]:
    return {
        "cases": [{k: v for k, v in case.items() if k != "paths"} for case in rig.cases],
        "tasks": plan.tasks,
        "concurrency": plan.concurrency,
        "seed": plan.seed * 1000 + r * 10 + c.index,
        "hold_s": [0.2, 1.5],
        "actor_share": 0.25,
        "round": r,
        "wait_release": True,
    }


def _record(tally: Tally, rig: Rig, attempt: Attempt) -> None:
    """An ended (or released) attempt's outcomes and end, for the oracle."""
    paths = {str(c["name"]): tuple(c["paths"]) for c in rig.cases}
    for o in attempt.outcomes:
        tally.outcomes.append(
            oracle.Outcome(
                attempt.cluster.index,
                attempt.number,
                str(o["case"]),
                paths.get(str(o["case"]), ()),
                float(o["t0"]),
                float(o["t1"]),
                bool(o["ok"]),
                str(o.get("error", "")),
                str(o.get("message", "")),
                tuple(str(m) for m in o.get("mismatch", ())),
                str(o.get("how", "task")),
            )
        )
    done = attempt.done.is_set() and attempt.code == 0
    c, n, why = attempt.cluster.index, attempt.number, attempt.why()
    tally.ends.append(oracle.AttemptEnd(c, n, done, why, attempt.started, time.time()))
    if attempt.crash_point:
        tally.faults.append(faults.crash_fault(attempt))
        if not done and not attempt.killed:
            tally.kills[f"crash:{attempt.crash_point}"] += 1


async def _supervise(
    plan: Plan, rig: Rig, tally: Tally, r: int, c: Cluster, live: dict[int, Attempt],
    calm: asyncio.Event,
) -> None:  # fmt: skip
    """Keep cluster ``c`` at work this round: relaunch each attempt a fault ended, until one is
    done (it then waits at the quiet point)."""
    rng = random.Random(plan.seed * 7919 + r * 31 + c.index)
    crash = ""
    for _ in range(RELAUNCHES + 1):
        attempt = await attempts.start(c, rig.python, rig.driver, _spec(plan, rig, r, c), rig.env,
                                       crash)  # fmt: skip
        live[c.index] = attempt
        await attempts.until_over(attempt)
        if attempt.done.is_set():
            return
        if not attempt.killed and not attempt.crash_point:  # a violation: say what Ray said
            attempt.logs = await asyncio.to_thread(attempts.last_words, c)
        if left := await attempts.clear(c, DEAD_LEAVE_S):
            tally.notes.append(f"{attempt.label}: killed what its end left: {left[:3]}")
        _record(tally, rig, attempt)
        crash = ""
        if c.nodes == 1 and not calm.is_set() and rng.random() < plan.crash_share:
            crash = rng.choice(faults.CRASH_POINTS)
    tally.violations.append(
        f"round {r}: cluster {c.index} never finished ({RELAUNCHES} relaunches)"
    )


def _targets(live: Mapping[int, Attempt]) -> list[Attempt]:
    return [a for a in live.values() if a.ready.is_set() and not a.done.is_set() and not a.killed
            and not a.ended.is_set()]  # fmt: skip


def _count(tally: Tally, kind: str, fault: oracle.Fault | None) -> None:
    if fault is not None or kind == "server":  # a spell of the server's: its own record
        tally.injected[kind] += 1
    if fault is not None:
        tally.faults.append(fault)
        if KINDS[kind].kill:
            tally.kills[kind] += 1


async def _spell(rig: Rig, tally: Tally, kind: str, target: Attempt) -> None:
    _count(tally, kind, await faults.inject(rig.world, kind, target))


async def _faults(plan: Plan, rig: Rig, tally: Tally, r: int, live: dict[int, Attempt]) -> None:
    """Inject faults until this round's share of the kills has landed (or its deadline). A
    fault that lasts (an agent stopped, the disk full, the server's spell) goes on beside the
    kills, one of each kind at a time."""
    rng = rig.world.rng
    share = math.ceil(plan.kills / plan.rounds)
    goal = min(plan.kills, share * (r + 1))
    deadline = time.monotonic() + plan.round_s * _FAULTS_SHARE
    spells: dict[str, asyncio.Future[None]] = {}
    for _ in range(10_000):  # bounded by the deadline
        if sum(tally.kills.values()) >= goal or time.monotonic() > deadline:
            break
        await asyncio.sleep(rng.uniform(*_STEP_S))
        targets = _targets(live)
        kind = faults.draw(rng)
        if not targets or (kind in spells and not spells[kind].done()):
            continue
        target = rng.choice(sorted(targets, key=lambda a: a.cluster.index))
        if KINDS[kind].kill:
            _count(tally, kind, await faults.inject(rig.world, kind, target))
        else:
            spells[kind] = asyncio.ensure_future(_spell(rig, tally, kind, target))
    await asyncio.gather(*spells.values())


async def one_round(plan: Plan, rig: Rig, tally: Tally, r: int) -> None:
    live: dict[int, Attempt] = {}
    calm = asyncio.Event()
    keepers = [
        asyncio.ensure_future(_supervise(plan, rig, tally, r, c, live, calm)) for c in rig.clusters
    ]
    await _faults(plan, rig, tally, r, live)
    calm.set()
    _, pending = await asyncio.wait(keepers, timeout=plan.round_s)
    for task in pending:
        task.cancel()
    for a in live.values():
        if not a.done.is_set():
            tally.violations.append(f"round {r}: {a.label} not done by the round's deadline")
    if not pending:
        problems = await asyncio.to_thread(
            checks.quiet_problems, rig.root, [c.ray_tmp for c in rig.clusters], plan.budget
        )
        tally.violations += [f"round {r}, quiet root: {p}" for p in problems]
    for a in live.values():
        attempts.release(a)
    for a in live.values():
        if not await attempts.wait_ended(a, STOP_S):
            tally.notes.append(f"{a.label}: did not stop its cluster in {STOP_S:.0f} s")
    for c in rig.clusters:
        if left := await attempts.clear(c):
            tally.notes.append(f"round {r}: cluster {c.index} left processes: {left[:3]}")
    for a in live.values():
        if a.done.is_set():
            _record(tally, rig, a)
    problems = await asyncio.to_thread(checks.stopped_root_problems, rig.root)
    tally.violations += [f"round {r}, stopped root: {p}" for p in problems]
    tally.rounds_done += 1
    rig.on_round(r, tally)


async def run(plan: Plan, rig: Rig) -> tuple[Tally, oracle.Verdict]:
    """Every round, then the oracle's verdict on all of it."""
    tally = Tally()
    for r in range(plan.rounds):
        await one_round(plan, rig, tally, r)
    await asyncio.gather(*rig.world.fate_checks)
    return tally, judged(tally, rig)


def judged(tally: Tally, rig: Rig) -> oracle.Verdict:
    every = tally.faults + faults.server_faults(rig.world.server)
    cases = {o.case for o in tally.outcomes}  # those sent: a short run may not reach them all
    verdict = oracle.judge(tally.outcomes, every, tally.ends, cases)
    verdict.violations = tally.violations + rig.world.fate_problems + verdict.violations
    return verdict
