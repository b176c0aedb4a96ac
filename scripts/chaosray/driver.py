"""The driver each cluster of the Ray chaos run runs: ``python driver.py SPEC_JSON_PATH``, by a
python that has Ray (stdlib and Ray only: it never imports the agent; when the Ray switch is on
for that python, its nodes run the agent, and nothing here knows).

The spec: ``{"mode": "init" | "cluster", "nodes": 3, "cases": [{"name", "runtime_env",
"expect"}...], "tasks": N, "concurrency": C, "seed": S, "hold_s": [lo, hi], "actor_share": 0.25,
"round": r}`` (optional: ``"unit_timeout_s"`` (240), ``"task_cpus"`` (0.5)). Mode ``init`` is a
bare ``ray.init(num_cpus=2)``; ``cluster`` a ``ray.cluster_utils.Cluster`` of ``nodes`` nodes of
one CPU each, then ``ray.init(address=...)``. Neither starts Ray's dashboard (two cores), nor
streams the workers' output here (``log_to_driver=False``): this process's stdout holds its own
lines only, never one cut by a worker's.

A unit of work runs in one case's runtime env: a task that looks at what it sees (``look``:
hashes every file of each folder an ``expect`` section names), sleeps a seeded time in
``hold_s`` and looks again; or an actor, created in the env and called twice (a look at once, a
look after the hold).
Each look's differences from ``expect`` come back as the unit's mismatch: any is a violation (a
task must never see a half-built or deleted package). Cases are drawn in seeded shuffled rounds
(every case once before any twice), task or actor by ``actor_share``; at most ``concurrency``
units are in flight; each is bounded by ``unit_timeout_s`` (then an outcome ``GetTimeoutError``).

Output, one line per event on stdout, ``CHAOS {json}``, flushed: ``start`` (pid), ``ready`` (the
alive nodes' ids), one ``outcome`` per unit (case, how, t0 submitted, t1 ended, ok, error class,
message, mismatch, node, pid), ``done``; each carries ``t`` (``time.time()``) and ``round``.
Every submitted unit ends in exactly one outcome, or the process dies: should Ray itself fail
(its GCS killed under the driver), every unit in flight gets an outcome naming the error, and the
driver exits 1 with the traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "CHAOS "
MESSAGE_CHARS = 300
MISMATCHES = 10  # at most, per outcome
UNIT_TIMEOUT_S = 240.0
TASK_CPUS = 0.5  # several units run at once on a node of 1 or 2 CPUs
GET_S = 30.0  # a ray.get of a result ray.wait said is ready
WAIT_S = 1.0  # one ray.wait: deadlines are checked between them
PYCACHE = "__pycache__"
Json = dict[str, Any]
Expect = Mapping[str, Mapping[str, str]]


def tree(folder: str, *, skip_pycache: bool) -> dict[str, str]:
    """Every file under ``folder`` (links not followed into folders): relative path (``/``
    separated) -> sha256 hex, or ``!<error class>`` for a file that could not be read. A
    folder that is not there holds nothing."""
    out: dict[str, str] = {}
    for top, dirs, files in os.walk(folder):
        if skip_pycache:
            dirs[:] = [d for d in dirs if d != PYCACHE]
        for name in files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            try:
                with open(path, "rb") as f:
                    out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as exc:
                out[rel] = f"!{type(exc).__name__}"
    return out


def differences(folder: str, expect: Mapping[str, str], *, skip_pycache: bool = False) -> list[str]:
    """What ``folder`` holds unlike ``expect`` (relative path -> sha256), each as ``missing P``,
    ``extra P``, ``changed P`` or ``unreadable P (Error)``, sorted by path. Pure but for reading
    the folder."""
    seen = tree(folder, skip_pycache=skip_pycache)
    out = []
    for rel in sorted(set(seen) | set(expect)):
        if rel not in seen:
            out.append(f"missing {rel}")
        elif rel not in expect:
            out.append(f"extra {rel}")
        elif seen[rel].startswith("!"):
            out.append(f"unreadable {rel} ({seen[rel][1:]})")
        elif seen[rel] != expect[rel]:
            out.append(f"changed {rel}")
    return out


def look(expect: Expect, when: str) -> list[str]:
    """This process's view against ``expect``: ``working_dir`` is the cwd, exactly;
    ``module:<name>`` the imported module's package folder, ``__pycache__`` aside. Each
    difference as ``<when>: <section>: <difference>``; a module that does not import is one."""
    out = []
    for section in sorted(expect):
        if section == "working_dir":
            folder, skip = os.getcwd(), False
        elif section.startswith("module:"):
            try:
                module = importlib.import_module(section.removeprefix("module:"))
                folder, skip = os.path.dirname(module.__file__ or ""), True
            except Exception as exc:  # the package is not there: what the oracle must hear
                out.append(f"{when}: {section}: import failed: {type(exc).__name__}: {exc}"[:300])
                continue
        else:
            out.append(f"{when}: {section}: unknown section")
            continue
        out += [
            f"{when}: {section}: {d}"
            for d in differences(folder, expect[section], skip_pycache=skip)
        ]
    return out


@dataclass(frozen=True)
class Unit:
    case: int  # index into the spec's cases
    how: str  # "task" or "actor"
    hold_s: float


def plan(cases: int, tasks: int, seed: int, round_: int, actor_share: float,
         hold_s: Sequence[float]) -> list[Unit]:  # fmt: skip
    """The units, seeded: cases in shuffled rounds (each case once before any twice), each a
    task or (with probability ``actor_share``) an actor, holding a time in ``hold_s``. Pure."""
    rng = random.Random(f"chaosray-driver:{seed}:{round_}")
    order: list[int] = []
    while len(order) < tasks and cases:
        batch = list(range(cases))
        rng.shuffle(batch)
        order += batch
    lo, hi = hold_s
    return [
        Unit(i, "actor" if rng.random() < actor_share else "task", round(rng.uniform(lo, hi), 3))
        for i in order[:tasks]
    ]


def emit(kind: str, round_: int, **fields: Any) -> None:
    line = json.dumps({"kind": kind, "t": time.time(), "round": round_, **fields})
    sys.stdout.write(PREFIX + line + "\n")
    sys.stdout.flush()


# -- in the workers ---------------------------------------------------------------------------


def task_body(expect: Expect, hold_s: float) -> Json:
    """A task's work: a look, the hold, a look; where it ran."""
    import ray

    start = look(expect, "start")
    time.sleep(hold_s)
    end = look(expect, "end")
    node = ray.get_runtime_context().get_node_id()
    return {"mismatch": start + end, "node": node, "pid": os.getpid()}


class Looker:
    """An actor's work: each call holds, then looks."""

    def __init__(self, expect: Expect) -> None:
        self._expect = expect

    def look(self, when: str, hold_s: float) -> Json:
        import ray

        time.sleep(hold_s)
        node = ray.get_runtime_context().get_node_id()
        return {"mismatch": look(self._expect, when), "node": node, "pid": os.getpid()}


# -- the driver -------------------------------------------------------------------------------


@dataclass
class _Flying:
    """A unit in flight: its refs (a task's one, an actor's two calls), its actor."""

    unit: Unit
    name: str
    t0: float
    refs: list[Any]
    actor: Any = None


def _outcome(round_: int, flying: _Flying, *, error: str = "", message: str = "",
             mismatch: Sequence[str] = (), node: str = "", pid: int = 0) -> None:  # fmt: skip
    emit(
        "outcome", round_, case=flying.name, how=flying.unit.how, t0=flying.t0, t1=time.time(),
        ok=not error and not mismatch, error=error, message=message[:MESSAGE_CHARS],
        mismatch=list(mismatch[:MISMATCHES]), node=node, pid=pid,
    )  # fmt: skip


def _start(ray: Any, spec: Json) -> Any:
    """Ray up as the spec's mode says; the Cluster in cluster mode, else None."""
    if spec["mode"] == "init":
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        return None
    if spec["mode"] != "cluster":
        raise ValueError(f"mode must be 'init' or 'cluster', not {spec['mode']!r}")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(int(spec.get("nodes", 3)) - 1):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def _submit(ray: Any, spec: Json, unit: Unit, remotes: tuple[Any, Any]) -> _Flying:
    case = spec["cases"][unit.case]
    options = {
        "runtime_env": case["runtime_env"],
        "num_cpus": float(spec.get("task_cpus", TASK_CPUS)),
        "scheduling_strategy": "SPREAD",
    }
    flying = _Flying(unit, case["name"], time.time(), [])
    task, looker = remotes
    if unit.how == "task":
        flying.refs.append(task.options(**options).remote(case["expect"], unit.hold_s))
    else:
        flying.actor = looker.options(**options).remote(case["expect"])
        flying.refs.append(flying.actor.look.remote("start", 0.0))
        flying.refs.append(flying.actor.look.remote("end", unit.hold_s))
    return flying


def _finish(ray: Any, round_: int, flying: _Flying) -> None:
    """The unit's outcome, from its results or what Ray raised; its actor killed."""
    try:
        results = [ray.get(ref, timeout=GET_S) for ref in flying.refs]
    except Exception as exc:  # what a fault did: the oracle judges it
        _outcome(round_, flying, error=type(exc).__name__, message=str(exc))
    else:
        mismatch = [line for result in results for line in result["mismatch"]]
        said = f"{len(mismatch)} differences" if mismatch else ""
        last = results[-1]
        _outcome(
            round_, flying, message=said, mismatch=mismatch, node=last["node"], pid=last["pid"]
        )
    finally:
        _drop(ray, flying, cancel=False)


def _drop(ray: Any, flying: _Flying, *, cancel: bool) -> None:
    """Kill the unit's actor (its resources freed), or with ``cancel`` its task still running;
    gone already: fine."""
    try:
        if flying.actor is not None:
            ray.kill(flying.actor, no_restart=True)
        elif cancel:
            ray.cancel(flying.refs[0], force=True)
    except Exception:  # the outcome is said already; a dead worker or node cannot be cancelled
        pass


def _run(spec: Json, round_: int) -> int:
    import ray

    units = plan(len(spec["cases"]), int(spec["tasks"]), int(spec["seed"]), round_,
                 float(spec.get("actor_share", 0.25)), spec.get("hold_s", [0.5, 2.0]))  # fmt: skip
    cluster = _start(ray, spec)
    nodes: list[Json] = ray.nodes()  # type: ignore[no-untyped-call]
    emit("ready", round_, nodes=sorted(n["NodeID"] for n in nodes if n["Alive"]))
    # max_retries=0, max_restarts=0: a retried task or a restarted actor would hide what a fault
    # did to it; the runner judges every failure
    remotes = (
        ray.remote(max_retries=0)(task_body),
        ray.remote(max_restarts=0, max_task_retries=0)(Looker),
    )
    timeout_s = float(spec.get("unit_timeout_s", UNIT_TIMEOUT_S))
    concurrency = max(1, int(spec.get("concurrency", 4)))
    queue, flying = list(units), dict[Any, _Flying]()
    try:
        while queue or flying:
            while queue and len(flying) < concurrency:
                unit = queue.pop(0)
                started = _Flying(unit, spec["cases"][unit.case]["name"], time.time(), [])
                try:
                    started = _submit(ray, spec, unit, remotes)
                except Exception as exc:  # refused at submission (a dead cluster, a bad env)
                    _outcome(round_, started, error=type(exc).__name__, message=str(exc))
                    continue
                flying[started.refs[-1]] = started
            if not flying:
                continue
            ready, _ = ray.wait(list(flying), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                _finish(ray, round_, flying.pop(ref))
            for ref, late in list(flying.items()):
                if time.time() > late.t0 + timeout_s:
                    del flying[ref]
                    _outcome(
                        round_, late, error="GetTimeoutError", message=f"not done in {timeout_s} s"
                    )
                    _drop(ray, late, cancel=True)
    except BaseException as exc:  # Ray itself failed: every unit in flight is told, then exit 1
        for left in flying.values():
            _outcome(round_, left, error=type(exc).__name__, message=f"the driver failed: {exc}")
        raise
    emit("done", round_)
    if spec.get("wait_release"):  # the runner's quiet point: every cluster done, none stopped
        sys.stdin.readline()
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: driver.py SPEC_JSON_PATH\n")
        return 2
    spec: Json = json.loads(Path(argv[1]).read_text())
    round_ = int(spec.get("round", 0))
    emit("start", round_, pid=os.getpid())
    return _run(spec, round_)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
