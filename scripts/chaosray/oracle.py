"""The oracle of the chaos run on real Ray: which failures the run caused, and which are bugs.

Pure: it is given what happened (the faults the runner injected, each unit of work's outcome as
its driver reported it, how each driver attempt ended) and returns the violations, and per fault
kind the failures it explains. The rules, in order:

1. A unit of work that ran and saw files other than its env's (missing, extra, changed, at its
   first look or its last) is a violation, whatever else happened: no fault excuses a task
   seeing a half-built or deleted package.
2. A unit that failed is expected only when a fault the run injected can have caused it:
   - a fault on a node of its cluster (SIGKILL of a raylet, the GCS, a keeper, an agent, the
     driver) explains a failure of that driver attempt in flight at the fault, or submitted up
     to ``SETTLE_S`` after it (Ray takes that long to see a node dead), and, when it killed the
     cluster (``fatal``: its only node, or its head, the GCS, the driver), every failure the
     attempt reported after it; an agent armed to kill itself at a crash point (one-node
     clusters only) explains its attempt's failures once it fired (the attempt died undone);
   - a worker SIGKILLed on its cluster while the unit was in flight;
   - an agent of its cluster stopped (SIGSTOP) while it was in flight;
   - the shared disk full while it was in flight;
   - a package server fault on a path the unit's env downloads, while it was in flight or up to
     ``JOIN_S`` before (a create joins a build another agent of the root started earlier).
   Any other failure is a violation. Where several faults could have caused a failure, it is
   counted for the likeliest: one on its attempt first, then a worker's, the server's, a window.
3. A driver attempt that ended without saying it was done (it died, exited non-zero, or hung
   past its deadline) is a violation unless a fault ended its cluster, or the shared disk was
   full during its life (Ray's own files of its session are on that disk: a node starting then
   fails to start).
4. Every env case the run sent ran ok at least once: a case that always fails, each time beside
   a fault that could explain it, is broken, not unlucky (a short run need not send every case).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

JOIN_S = 60.0  # a create may join a build started this long before it (then fail with it)
SETTLE_S = 30.0  # a dead node seen by Ray (its health checks): units placed on it meanwhile fail


class Scope(Enum):
    """What a fault can break."""

    ATTEMPT = "attempt"  # the driver attempt on its cluster, from the fault on
    IN_FLIGHT = "in flight"  # the units of its cluster in flight at the fault
    WINDOW = "window"  # the units of its cluster (or every cluster) in flight during it
    PATH = "path"  # the units whose env downloads its path


# fault kind -> what it can break; "crash:<point>" is ATTEMPT, "server:<how>" is PATH
SCOPES = {
    "raylet": Scope.ATTEMPT,
    "gcs": Scope.ATTEMPT,
    "keeper": Scope.ATTEMPT,
    "agent": Scope.ATTEMPT,
    "driver": Scope.ATTEMPT,
    "worker": Scope.IN_FLIGHT,
    "sigstop": Scope.WINDOW,
    "disk-full": Scope.WINDOW,
}


def scope_of(kind: str) -> Scope:
    if kind.startswith("crash:"):
        return Scope.ATTEMPT
    if kind.startswith("server:"):
        return Scope.PATH
    return SCOPES[kind]


@dataclass(frozen=True)
class Fault:
    kind: str
    t0: float  # when it was injected (just before the signal, the resize, the reply)
    t1: float  # when it ended (t0 for a kill)
    cluster: int | None = None  # None: every cluster (the shared disk, the package server)
    attempt: int | None = None  # the driver attempt it hit (ATTEMPT faults)
    path: str = ""  # PATH faults: the server path
    fatal: bool = False  # ATTEMPT faults: it killed the cluster (the runner saw it dead)


@dataclass(frozen=True)
class Outcome:
    cluster: int
    attempt: int
    case: str
    paths: tuple[str, ...]  # the server paths its env downloads
    t0: float  # submitted
    t1: float  # its result (or failure) reported
    ok: bool
    error: str = ""
    message: str = ""
    mismatch: tuple[str, ...] = ()
    how: str = "task"


@dataclass(frozen=True)
class AttemptEnd:
    cluster: int
    attempt: int
    done: bool  # the driver said it was done, and exited 0
    why: str = ""  # how it ended otherwise (an exit code, a deadline, its last words)
    t0: float = 0.0  # its life: started, ended
    t1: float = 0.0


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    explained: Counter[str] = field(default_factory=Counter)  # fault kind -> failures it caused
    ok: int = 0
    failed: int = 0


_ORDER = (Scope.ATTEMPT, Scope.IN_FLIGHT, Scope.PATH, Scope.WINDOW)  # the likeliest cause first


def _explains(f: Fault, o: Outcome, undone: set[tuple[int, int]]) -> bool:
    scope = scope_of(f.kind)
    if scope is Scope.PATH:
        return f.path in o.paths and o.t0 - JOIN_S <= f.t0 <= o.t1
    if f.cluster is not None and f.cluster != o.cluster:
        return False
    if scope is Scope.ATTEMPT:
        if f.attempt != o.attempt or o.t1 < f.t0:
            return False
        if f.kind.startswith("crash:"):  # armed all along: it fired if the attempt died
            return (o.cluster, o.attempt) in undone
        return f.fatal or o.t0 <= f.t0 + SETTLE_S
    if scope is Scope.IN_FLIGHT:
        return o.t0 <= f.t0 <= o.t1
    return f.t0 <= o.t1 and o.t0 <= f.t1  # WINDOW: the two overlap


def _label(o: Outcome) -> str:
    return f"cluster {o.cluster} attempt {o.attempt}: {o.how} of {o.case}"


def judge(
    outcomes: Iterable[Outcome],
    faults: Sequence[Fault],
    ends: Iterable[AttemptEnd],
    cases: Iterable[str] = (),
) -> Verdict:
    """The violations among what happened, and the failures each fault kind explains.
    ``cases``: the env cases that must each have run ok once."""
    verdict = Verdict()
    outcomes = list(outcomes)
    ends = list(ends)
    undone = {(e.cluster, e.attempt) for e in ends if not e.done}
    ordered = sorted(faults, key=lambda f: _ORDER.index(scope_of(f.kind)))
    for o in outcomes:
        if o.mismatch:
            verdict.violations.append(f"{_label(o)} saw other files: {', '.join(o.mismatch)}")
            continue
        if o.ok:
            verdict.ok += 1
            continue
        verdict.failed += 1
        cause = next((f for f in ordered if _explains(f, o, undone)), None)
        if cause is None:
            verdict.violations.append(
                f"{_label(o)} failed with no fault to cause it: {o.error}: {o.message[:300]}"
            )
        else:
            verdict.explained[cause.kind] += 1
    for end in ends:
        if end.done:
            continue
        ended = any(
            (
                scope_of(f.kind) is Scope.ATTEMPT
                and f.cluster == end.cluster
                and f.attempt == end.attempt
            )
            or (f.kind == "disk-full" and f.t0 <= end.t1 and end.t0 <= f.t1)
            for f in faults
        )
        if not ended:
            verdict.violations.append(
                f"cluster {end.cluster} attempt {end.attempt} ended with no fault to end it: "
                f"{end.why[:1700]}"
            )
    worked = {o.case for o in outcomes if o.ok}
    if never := sorted(set(cases) - worked):
        verdict.violations.append(f"env cases that never ran ok: {', '.join(never)}")
    return verdict
