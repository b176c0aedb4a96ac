"""A Ray driver the end-to-end tests run as a process of its own:
``python tests/harness/ray_driver.py SCENARIO ARGS.json`` with RAY_ADDRESS and
RTENV_E2E_NODE_IP (the node it runs on) set.

It connects to the cluster (through Ray Client's server when ARGS name ``ray_client``), runs
one scenario and prints its result as one line, ``RESULT <json>``; an interactive scenario also
prints ``STEP <json>`` lines and then waits for a line on stdin before going on. This file runs
as ``__main__``, so Ray pickles its functions by value: the workers need nothing of the
repository. It never touches the agent: everything it learns, it learns through Ray (what a
task saw, what Ray raised).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

Json = dict[str, Any]
GET_S = 120.0  # bound on any ray.get (a task's env setup included)


def _command(argv: list[str]) -> Json:
    """A command the worker runs as a user's code would (``python`` found on its PATH): its
    exit status and the end of its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=GET_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"code": None, "out": f"{type(exc).__name__}: {exc}"}
    return {"code": done.returncode, "out": (done.stdout + done.stderr)[-2000:]}


def probe(spec: Json) -> Json:
    """What a worker sees: its cwd, files read relative to it, modules imported (their VALUE),
    env vars, commands run (``_command``), its python, its node and its runtime env as Ray
    reports it."""
    files: Json = {}
    for name in spec.get("files", []):
        path = Path(name)
        files[name] = path.read_text() if path.is_file() else None
    modules: Json = {}
    for name in spec.get("modules", []):
        try:
            modules[name] = str(importlib.import_module(name).VALUE)
        except Exception as exc:  # reported to the test, which says what it expected
            modules[name] = f"!{type(exc).__name__}: {exc}"
    time.sleep(float(spec.get("sleep_s", 0)))
    context = ray.get_runtime_context()
    return {
        "cwd": os.getcwd(),
        "files": files,
        "modules": modules,
        "env": {name: os.environ.get(name) for name in spec.get("env", [])},
        "node": context.get_node_id(),
        "pid": os.getpid(),
        "executable": sys.executable,
        "commands": [_command(argv) for argv in spec.get("commands", [])],
        "runtime_env": dict(context.runtime_env),
    }


@ray.remote
def probe_task(spec: Json) -> Json:
    return probe(spec)


@ray.remote
class Prober:
    def probe(self, spec: Json) -> Json:
        return probe(spec)


def _outcome(ref: Any) -> Json:
    """A result, or the error Ray raised (its type and text)."""
    try:
        value: Json = ray.get(ref, timeout=GET_S)
        return value
    except ray.exceptions.RuntimeEnvSetupError as exc:
        return {"error": "RuntimeEnvSetupError", "message": str(exc)}
    except ray.exceptions.ActorDiedError as exc:
        # an actor whose env could not be set up dies with the setup error as its cause
        return {"error": "ActorDiedError", "message": str(exc)}


def _step(payload: Json) -> None:
    """Tell the test where we are, then wait for its go-ahead (one line on stdin)."""
    print("STEP " + json.dumps(payload), flush=True)
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the test closed stdin before the go-ahead")


def probe_cases(args: Json) -> Json:
    """Each case's env, as a task and (unless ``tasks_only``) as an actor."""
    out: Json = {}
    for case in args["cases"]:
        env, spec = case["runtime_env"], case.get("spec", {})
        task = probe_task.options(runtime_env=env).remote(spec)
        entry = {"task": _outcome(task)}
        if not args.get("tasks_only"):
            actor = Prober.options(runtime_env=env).remote()  # type: ignore[attr-defined]
            entry["actor"] = _outcome(actor.probe.remote(spec))
            ray.kill(actor)
        out[case["name"]] = entry
    return out


def job(args: Json) -> Json:
    """The job's own env (given to ray.init, so local folders are uploaded): a task and an
    actor with no env of their own inherit it."""
    spec = args.get("spec", {})
    task = _outcome(probe_task.remote(spec))
    actor = Prober.remote()  # type: ignore[attr-defined]
    return {"task": task, "actor": _outcome(actor.probe.remote(spec))}


def hold(args: Json) -> Json:
    """An actor holds the env while the test looks at the agent; then it is killed (its worker
    exits and the delete reaches the agent) and the test looks again; then the driver exits."""
    actor = Prober.options(runtime_env=args["runtime_env"]).remote()  # type: ignore[attr-defined]
    seen = _outcome(actor.probe.remote(args.get("spec", {})))
    _step({"held": seen})
    ray.kill(actor)
    _step({"killed": True})
    return {"held": seen}


def _nodes() -> list[Json]:
    nodes: list[Json] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes


def alive_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in _nodes() if n["Alive"])


def wait_nodes(count: int, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = alive_nodes()
        if len(nodes) == count:
            return nodes
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(nodes)} nodes alive after {timeout_s}s, expected {count}")
        time.sleep(0.2)


def spread(args: Json) -> Json:
    """Tasks of one env spread over the nodes, a round of one per node at a time, until each
    alive node ran one (bounded rounds); then one task pinned to each node, so every node is
    shown to serve the env whatever SPREAD chose."""
    nodes = wait_nodes(args["nodes"], float(args.get("wait_s", 60)))
    env, spec = args["runtime_env"], args.get("spec", {})
    results: list[Json] = []
    for _ in range(int(args.get("rounds", 3))):
        refs = [
            probe_task.options(runtime_env=env, scheduling_strategy="SPREAD").remote(spec)
            for _ in range(int(args.get("tasks", len(nodes))))
        ]
        results += [_outcome(ref) for ref in refs]
        if {r.get("node") for r in results} >= set(nodes):
            break
    for node in nodes:
        pinned = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        results.append(
            _outcome(probe_task.options(runtime_env=env, scheduling_strategy=pinned).remote(spec))
        )
    return {"nodes": nodes, "results": results}


def wait_dead(args: Json) -> Json:
    """Wait until Ray marks ``node`` dead; report the alive nodes then."""
    deadline = time.monotonic() + float(args.get("timeout_s", 60))
    while args["node"] in alive_nodes():
        if time.monotonic() > deadline:
            raise SystemExit(f"node {args['node']} still alive after {args.get('timeout_s')}s")
        time.sleep(0.2)
    dead = [n for n in _nodes() if n["NodeID"] == args["node"]]
    return {"alive": alive_nodes(), "dead": [{"alive": n["Alive"]} for n in dead]}


SCENARIOS = {
    "probe": probe_cases,
    "job": job,
    "hold": hold,
    "spread": spread,
    "wait_dead": wait_dead,
}


def main() -> None:
    scenario, args = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    run = SCENARIOS[scenario]
    client = args.get("ray_client")  # "ray://host:port": through Ray Client's server instead
    where: Json = {"address": client} if client else {
        "address": os.environ["RAY_ADDRESS"],
        "_node_ip_address": os.environ["RTENV_E2E_NODE_IP"],  # the node's IP, not 127.0.0.1
    }  # fmt: skip
    ray.init(
        **where, runtime_env=args.get("job_env"), logging_level=logging.WARNING,
        log_to_driver=False,
    )  # fmt: skip
    try:
        result = run(args)
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
