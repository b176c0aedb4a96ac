"""``raylet-sim``: the simulated scheduler's command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from raylet_sim.demo import run_demo


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raylet-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a whole node with a workload and check it")
    demo.add_argument("--tasks", type=int, default=400, help="tasks to run (400)")
    demo.add_argument("--envs", type=int, default=36, help="distinct runtime envs (36)")
    demo.add_argument("--concurrency", type=int, default=8, help="tasks at once (8)")
    demo.add_argument("--workdir", help="where the agent's root and logs go (a temp dir)")
    demo.add_argument("--keep", action="store_true", help="keep the workdir afterwards")
    demo.add_argument("--seed", type=int, default=1, help="the workload's random seed (1)")
    demo.add_argument(
        "--idle-timeout",
        type=float,
        default=2.0,
        help="seconds an idle worker waits for another task (2)",
    )
    demo.add_argument(
        "--package-kib",
        type=int,
        default=256,
        help="filler KiB in each working dir, half that in each py_module (256)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name, value in (
        ("tasks", args.tasks),
        ("envs", args.envs),
        ("concurrency", args.concurrency),
    ):
        if value < 1:
            print(f"raylet-sim: --{name} must be at least 1, got {value}", file=sys.stderr)
            return 2
    return asyncio.run(run_demo(args))


if __name__ == "__main__":
    sys.exit(main())
