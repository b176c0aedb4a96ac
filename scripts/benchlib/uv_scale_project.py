"""The uv-scale workload's experiment: its driver (``launch.py``) and what its facts say.

The driver is the uv-run workload's (``tests/harness/uv_projects.LAUNCH_HEAD``: a start fact,
then ``import ray``) with a bare ``ray.init()`` and ``TASKS`` tasks that import the stack
(numpy, scipy, pandas, scikit-learn, and torch with ``--heavy``: the modules are named in the
environment, ``SCALE_MODULES``), fit a small model and report, from the worker: its pid, its
python, the stack's versions, whether a uv is among its ancestors, and its own CPU seconds
(``resource.getrusage`` of the worker process: all it ran so far, its start included). The
driver reports each task's result or its failure (``failed``: the exception's class, its first
and last line), then ``done``; a driver killed midway reports what it had.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the tests' offline material (tests/harness/), pytest-free
    sys.path.append(str(REPO))
from tests.harness.uv_projects import LAUNCH_HEAD, worker_facts  # noqa: E402

TASKS = 6
_BODY = """
import resource


def facts(kind):
    import importlib

    versions = {}
    for name in os.environ["SCALE_MODULES"].split(","):
        versions[name] = importlib.import_module(name).__version__
    ancestors = _ancestors()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "kind": kind, "t": time.time(), "pid": os.getpid(), "executable": sys.executable,
        "virtual_env": os.environ.get("VIRTUAL_ENV"), "versions": versions,
        "uv_ancestor": any(a and os.path.basename(a[0]) == "uv" for a in ancestors),
        "ancestors": [" ".join(a)[:300] for a in ancestors[:6]],
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


@ray.remote
def task(i):
    import numpy
    from sklearn.linear_model import LogisticRegression

    rng = numpy.random.default_rng(i)
    x = rng.normal(size=(2000, 20))
    LogisticRegression(max_iter=200).fit(x, x[:, 0] > 0)
    time.sleep(1.0)  # the experiment runs a while: a kill comes mid-round
    return facts("task")


def report(ref):
    try:
        print("FACT " + json.dumps(ray.get(ref)), flush=True)
    except Exception as exc:  # a task failed: its class, first and last line; the run goes on
        lines = str(exc).strip().splitlines() or [""]
        why = lines[0][:200] + (" ... " + lines[-1][:200] if len(lines) > 1 else "")
        fact = {"kind": "failed", "t": time.time(), "error": f"{type(exc).__name__}: {why}"}
        print("FACT " + json.dumps(fact), flush=True)


ray.init()
env = ray.get_runtime_context().runtime_env
print("FACT " + json.dumps({"kind": "init", "t": time.time(), "runtime_env": dict(env)}),
      flush=True)
pending = [task.remote(i) for i in range(int(os.environ.get("SCALE_TASKS") or 6))]
first, pending = ray.wait(pending, num_returns=1)
report(first[0])
for ref in pending:
    report(ref)
print("FACT " + json.dumps({"kind": "done", "t": time.time()}), flush=True)
"""
LAUNCH = LAUNCH_HEAD + _BODY


def failures(facts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The failed tasks' reasons, in order."""
    return [str(f["error"]) for f in facts if f.get("kind") == "failed"]


def first_task_at(facts: Sequence[Mapping[str, Any]]) -> float | None:
    """``time.time()`` of the first task's result, None when no task reported."""
    times = [float(f["t"]) for f in facts if f.get("kind") == "task"]
    return min(times) if times else None


def wrong_versions(facts: Sequence[Mapping[str, Any]], pins: Sequence[str]) -> list[str]:
    """Each worker that imported a stack module at another version than pinned."""
    want = {p.split("==")[0].replace("scikit-learn", "sklearn"): p.split("==")[1] for p in pins}
    out = []
    for f in worker_facts(facts):
        for name, version in dict(f.get("versions", {})).items():
            if name in want and not str(version).startswith(want[name]):
                out.append(f"worker pid {f['pid']} imported {name} {version}, pinned {want[name]}")
    return out


def worker_executables(facts: Sequence[Mapping[str, Any]]) -> set[str]:
    """The pythons the experiment's workers ran (their venvs' ``bin/python``)."""
    return {str(f["executable"]) for f in worker_facts(facts)}
