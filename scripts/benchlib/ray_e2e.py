"""The end-to-end workload's Ray driver, a child process of the benchmark (the benchmark itself
never imports ray): ``python -m benchlib.ray_e2e --address GCS --base-url URL ...`` connects to a
running Ray node, submits ``--tasks`` tasks at once, in ``--envs`` runs of consecutive tasks
with one env each (task i in env i * envs // tasks, as jobs that each run many tasks), env k a
working_dir zip (``e2eJ.zip``, J = k % ``--zips``, from the package server) and
``env_vars={"BENCH_ENV": k}``; each task reads a file of its working_dir and its env var. It
prints one JSON line: time to the first finished task and to the last (from the first
submission), how many results were wrong, how many worker processes ran them.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import time
from typing import Any


def _task(i: int) -> tuple[int, str, str, int]:
    """What a task sees: its index, its env var, its working_dir's file, its worker's pid."""
    found = sorted(glob.glob("**/input.txt", recursive=True))
    text = ""
    if found:
        with open(found[0]) as f:
            text = f.read().strip()
    return i, os.environ.get("BENCH_ENV", ""), text, os.getpid()


def _env_of(i: int, args: argparse.Namespace) -> int:
    k: int = i * args.envs // args.tasks
    return k


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--zips", type=int, required=True)
    p.add_argument("--envs", type=int, required=True)
    p.add_argument("--tasks", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args()

    import ray

    ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        remote: Any = ray.remote(num_cpus=1)(_task)
        envs = [
            {
                "working_dir": f"{args.base_url}/e2e{k % args.zips}.zip",
                "env_vars": {"BENCH_ENV": str(k)},
            }
            for k in range(args.envs)
        ]
        started = time.perf_counter()
        refs = [
            remote.options(runtime_env=envs[_env_of(i, args)]).remote(i) for i in range(args.tasks)
        ]
        ready, _ = ray.wait(refs, num_returns=1, timeout=args.timeout)
        first = time.perf_counter() - started
        if not ready:
            print("no task finished in time", file=sys.stderr)
            return 1
        results = ray.get(refs, timeout=args.timeout)
        wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    wrong = sum(
        1
        for i, env, text, _ in results
        if env != str(_env_of(i, args)) or text != f"e2e{_env_of(i, args) % args.zips}"
    )
    report = {
        "tasks": len(results),
        "first_s": first,
        "wall_s": wall,
        "wrong": wrong,
        "workers": len({pid for *_, pid in results}),
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
