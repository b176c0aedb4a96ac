"""The uv-full workload's oracle, pure: what a round on a small disk means (``uv_full.py``).

``End`` is how one driver ended, reduced from its facts; ``Outcome`` what one agent's round
measured. ``broken`` lists what makes a round mean nothing whatever the goals (the workload
fails on it); ``figures`` adds the rows (goals on this agent's, stock Ray's as their baseline:
the seed user's symptom, recorded, never judged); ``misses`` labels each missed goal EXPECTED
(with its reason) or UNEXPECTED.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchlib.figures import Figure, Goal, WorkloadResult, labelled_misses

# what a task, a driver or a worker log says when it met the full disk: the OS's words (Python's
# OSError, uv's "(os error 28)"), never the agent's own refusal ("no space left on the agent's
# disk" names no device)
NO_SPACE = re.compile(r"no space left on device|\bENOSPC\b|errno 28\b|os error 28\b", re.I)
SETUP_ERROR = "RuntimeEnvSetupError"
ROOMY_BYTES = 64 * 2**20  # free on the small disk: a cluster's start needs a few MiB of it
STARTUP_TIMEOUT = "timed out during startup"  # ray.init's own, when its raylet is not up in 30 s
# B's spawn to its first failed task: a local cluster's start (~25 s here) and a refusal
GOAL_B_FAILS_S = 60.0

PENDING = "pending"  # B was not refused with the figures: issue 39 item 2 not in this checkout
REFUSES = "refuses"  # B was refused with a RuntimeEnvSetupError naming the figures


def saw_no_space(text: str) -> bool:
    return NO_SPACE.search(text) is not None


def names_figures(text: str) -> bool:
    """Whether a refusal names the bytes needed, the bytes free and the setting to change."""
    needed = re.search(r"need\w*\D{0,40}\d", text, re.I)
    free = re.search(r"\d[\d,.]*\s*\w*\s*(are\s+)?free\b|\bfree\D{0,40}\d", text, re.I)
    setting = re.search(r"min[-_ ]free[-_ ]disk|RTENV_MIN_FREE_DISK|cache[-_ ]budget", text, re.I)
    return bool(needed and free and setting)


@dataclass(frozen=True)
class End:
    """How one driver ended: its exit code, the first error its tasks (or ``ray.init``) raised,
    how many tasks it ran and how many of them failed, and saw ENOSPC."""

    code: int | None  # None: still running when killed
    error_class: str = ""  # "" when nothing raised
    first_line: str = ""
    error_text: str = ""  # the first error's message and traceback, cut
    tasks: int = 0
    failed: int = 0
    no_space_tasks: int = 0  # of the failed, those whose error names ENOSPC
    output_no_space: bool = False  # anything the driver printed names ENOSPC
    logs_no_space: bool = False  # a log file of its Ray session names ENOSPC
    free_bytes: int = -1  # on the small disk when it ended (-1: not measured)
    seconds: float = 0.0  # from its spawn to its exit
    first_error_s: float = float("nan")  # from its spawn to its first failed task

    @property
    def ran(self) -> bool:
        """It ran every task it started, and ran some."""
        return self.code == 0 and self.tasks > 0 and self.failed == 0

    def describe(self) -> str:
        if self.ran:
            return f"exit 0, {self.tasks} tasks ran"
        raised = f"{self.error_class}: {self.first_line}" if self.error_class else "nothing raised"
        return (
            f"exit {self.code}, {self.failed} of {self.tasks} tasks failed ({self.no_space_tasks} "
            f"on ENOSPC); first: {raised[:200]}"
        )


@dataclass(frozen=True)
class Outcome:
    agent: str  # "ray" (stock) or "ours"
    a: tuple[End, ...]  # the K experiments on lock A, held until B's first launch ended
    a_after: tuple[End, ...]  # their tasks again, after B's first launch ended
    b: End  # lock B's first launch, while A's run
    b_again: End  # lock B relaunched once A's experiments ended
    worker_logs_no_space: int  # log files of workers under the sessions' logs naming ENOSPC
    half_built: int  # venvs on the small disk lacking a whole dependency, after B's failure
    staging_bytes: int  # in the agent's tmp/ and trash/ after B's failure (stock: 0)
    processes_left: int  # of a cluster, 30 s after its driver exited
    sized: bool  # the tmpfs's room holds one env and the agent's floor, not two envs' bytes

    @property
    def ends(self) -> tuple[End, ...]:
        return (*self.a, *self.a_after, self.b, self.b_again)

    @property
    def no_space_tasks(self) -> int:
        return sum(e.no_space_tasks for e in self.ends)

    @property
    def no_space_drivers(self) -> int:
        return sum(e.output_no_space for e in (*self.a, self.b, self.b_again))

    @property
    def failed_tasks(self) -> int:
        return sum(e.failed for e in self.ends)

    @property
    def a_untouched(self) -> bool:
        return all(e.ran for e in (*self.a, *self.a_after))

    @property
    def b_refused(self) -> bool:
        """B's first launch failed its tasks with a RuntimeEnvSetupError naming the figures."""
        b = self.b
        return b.error_class == SETUP_ERROR and names_figures(b.error_text) and b.failed > 0


def mode_of(ours: Outcome) -> str:
    return REFUSES if ours.b_refused else PENDING


def broken(o: Outcome) -> list[str]:
    """What makes a round mean nothing whatever the goals (empty: nothing)."""
    out = []
    if not o.sized:
        out.append(f"{o.agent}: the small disk's room is not one env but not two")
    unstarted = [e for e in (*o.a, o.b, o.b_again) if cluster_unstarted(e)]
    if unstarted:
        out.append(f"{o.agent}: {len(unstarted)} local cluster(s) did not start, not for the "
                   f"disk: {unstarted[0].first_line[:120]}")  # fmt: skip
    if o.processes_left:
        out.append(f"{o.agent}: {o.processes_left} process(es) of a cluster outlived its driver")
    return out


def cluster_unstarted(e: End) -> bool:
    """Ray's own start failed (the machine's load: its raylet has a fixed 30 s) with room on the
    disk and no ENOSPC in the driver's output or its session's logs (a full disk writes no log):
    the round measured the machine, not the disk."""
    if STARTUP_TIMEOUT not in e.first_line or e.output_no_space or e.logs_no_space:
        return False
    return e.free_bytes >= ROOMY_BYTES


_NONE = Goal("value", "==", 0, "none: == 0")
_YES = Goal("value", "==", 1, "yes: == 1")
_STOCK_IS = "Ray's agent (the baseline: the seed user's symptom)"
# each row: its metric, its unit, its figure of a round, the goal on this agent's figure
ROWS: tuple[tuple[str, str, Callable[[Outcome], float], Goal | None], ...] = (
    ("tasks that saw ENOSPC", "tasks", lambda o: o.no_space_tasks, _NONE),
    ("drivers whose output names ENOSPC", "drivers", lambda o: o.no_space_drivers, _NONE),
    ("worker logs naming ENOSPC", "files", lambda o: o.worker_logs_no_space, _NONE),
    ("tasks that failed, all drivers", "tasks", lambda o: o.failed_tasks, None),
    (
        "B refused with a RuntimeEnvSetupError naming needed, free and the setting",
        "yes",
        lambda o: o.b_refused,
        _YES,
    ),
    (
        "B's first failed task, from its spawn",
        "s",
        lambda o: o.b.first_error_s,
        Goal("value", "<=", GOAL_B_FAILS_S),
    ),
    ("half-built venvs left after B's failure", "venvs", lambda o: o.half_built, _NONE),
    (
        "bytes left in the agent's staging after B's failure",
        "bytes",
        lambda o: o.staging_bytes,
        _NONE,
    ),
    (
        "A's experiments untouched (every task ran, before and after B)",
        "yes",
        lambda o: o.a_untouched,
        _YES,
    ),
    ("B relaunched after A ended ran", "yes", lambda o: o.b_again.ran, _YES),
)


def figures(result: WorkloadResult, stock: Outcome | None, ours: Outcome) -> list[Figure]:
    """The rows: this agent's figures with their goals, stock Ray's as each one's baseline (NaN
    when this run measured this agent alone); returns those with goals."""
    rows = [
        result.figure(
            metric,
            float(value(ours)),
            float(value(stock)) if stock is not None else math.nan,
            _STOCK_IS,
            unit,
            goal,
        )
        for metric, unit, value, goal in ROWS
    ]
    return [f for f in rows if f.goal is not None]


def misses(rows: Sequence[Figure], ours: Outcome) -> list[str]:
    """Each missed goal among ``rows``: EXPECTED (why) or UNEXPECTED."""
    pending = mode_of(ours) == PENDING
    why = (
        "this agent did not refuse B with the figures: issue 39 item 2 (a venv build's estimate, "
        "eviction and guard) is not in this checkout"
    )
    return labelled_misses(rows, lambda f: why if pending else "")
