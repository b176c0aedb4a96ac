"""``raylet-sim``: the simulated scheduler's command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from raylet_sim.demo import run_demo
from raylet_sim.interrupt import STOP_SIGNALS, Interrupt, QuietOnClose


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one line, not the usage above them (the agent's own
    command line does the same; the scheduler imports nothing of the agent): an echoed
    argument has its control characters escaped and is cut at 300 characters."""

    def error(self, message: str) -> NoReturn:
        text = message.encode("unicode_escape").decode("ascii")
        cut = text if len(text) <= 300 else f"{text[:300]}... ({len(text)} characters)"
        self.exit(2, f"{self.prog}: {cut} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="raylet-sim", description=__doc__)
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


def _mistake(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    for name, value in (
        ("tasks", args.tasks),
        ("envs", args.envs),
        ("concurrency", args.concurrency),
    ):
        if value < 1:
            return f"--{name} must be at least 1, got {value}"
    if not (math.isfinite(args.idle_timeout) and args.idle_timeout > 0):
        return f"--idle-timeout must be a number of seconds above 0, got {args.idle_timeout}"
    if args.package_kib < 0:
        return f"--package-kib must be at least 0, got {args.package_kib}"
    if args.workdir is not None:
        try:  # made here, so that a path that cannot be a folder is a mistake, not a traceback
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"--workdir {shown(args.workdir)} cannot be a folder: {exc.strerror or exc}"
    return None


def shown(value: str, limit: int = 120) -> str:
    """A value from the command line, quoted and cut to ``limit`` characters for a message."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    mistake = _mistake(args)
    if mistake is not None:
        print(f"raylet-sim: {mistake}", file=sys.stderr)
        return 2
    # Ctrl-C, SIGTERM (kill, timeout) and SIGHUP (a closing terminal) stop the run alike
    interrupt = Interrupt(STOP_SIGNALS)
    out = QuietOnClose(sys.stdout, interrupt)  # `raylet-sim demo | head`: a quiet end
    try:
        with interrupt.raising():
            code = asyncio.run(interrupt.run(run_demo(args, out, interrupt=interrupt)))
    except KeyboardInterrupt:  # before the run began, or as asyncio shut down after it
        code = None
    if code is None:
        if interrupt.signal is signal.SIGPIPE:
            return interrupt.exit_code
        with contextlib.suppress(OSError):  # a closed terminal takes no line
            print(
                f"raylet-sim: {interrupt.said}; the node stopped, its temp files removed",
                file=sys.stderr,
            )
        return interrupt.exit_code
    return code


if __name__ == "__main__":
    sys.exit(main())
