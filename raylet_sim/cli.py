"""``raylet-sim``: the simulated scheduler's command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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


_DESCRIPTION = (
    "The simulated scheduler: a node (the runtime-env agent as its sidecar, a pool of worker "
    "processes) and its demo."
)


@dataclass(frozen=True)
class _Number:
    """A number's flag: what it is, its default and its bounds (the help and the check)."""

    flag: str
    kind: type[int] | type[float]
    what: str
    default: int | float
    low: int | float  # at least this (a float: above it)
    high: int | float  # at most this

    @property
    def bounds(self) -> str:
        if self.kind is float:
            return f"above {self.low:g} and at most {self.high:g}"
        return f"from {self.low} to {self.high}"

    def mistake(self, value: int | float) -> str | None:
        if self.kind is float:
            if math.isfinite(value) and self.low < value <= self.high:
                return None
            return f"--{self.flag} must be a number {self.bounds}, got {value:g}"
        if self.low <= value <= self.high:
            return None
        text = str(value)
        cut = text if len(text) <= 30 else f"{text[:30]}... ({len(text)} digits)"
        return f"--{self.flag} must be {self.bounds}, got {cut}"


# The bounds keep a run on one machine and its memory bounded (docs/development.md: the demo's
# processes and memory at the maximum of each), and end a run in hours, not years.
_NUMBERS = (
    _Number("tasks", int, "tasks to run", 400, 1, 1_000_000),
    _Number("envs", int, "distinct runtime envs", 36, 1, 100_000),
    _Number("concurrency", int, "tasks at once", 8, 1, 64),
    _Number("seed", int, "the workload's random seed", 1, 0, 2**32 - 1),
    _Number("idle-timeout", float, "seconds an idle worker waits for another task", 2.0, 0, 3600),
    _Number(
        "package-kib",
        int,
        "filler KiB in each working dir, half that in each py_module",
        256,
        0,
        64 * 1024,
    ),
)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="raylet-sim", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="run a whole node with a workload and check it",
        description="Run a whole node on this machine with a seeded workload of tasks over "
        "runtime envs that share packages; then check every result, and that every count is "
        "back to 0 and no file is left over.",
    )
    for number in _NUMBERS:
        demo.add_argument(
            f"--{number.flag}",
            type=number.kind,
            default=number.default,
            help=f"{number.what} ({number.default:g}; {number.bounds})",
        )
    demo.add_argument(
        "--workdir",
        help="where the agent's root and logs go: made if absent (in a folder that exists), "
        "and kept (default: a temp folder, removed after)",
    )
    demo.add_argument("--keep", action="store_true", help="keep the workdir afterwards")
    return parser


def _mistake(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    for number in _NUMBERS:
        mistake = number.mistake(getattr(args, number.flag.replace("-", "_")))
        if mistake is not None:
            return mistake
    if args.workdir is not None:
        folder = Path(args.workdir)
        try:  # made here, so that a path that cannot be a folder is a mistake, not a traceback
            folder.mkdir(exist_ok=True)
        except FileNotFoundError:
            return (
                f"--workdir {shown(args.workdir)}: no folder {shown(str(folder.parent))} to make "
                "it in (the demo makes the workdir, not its parents)"
            )
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
            after = f", {interrupt.aftermath}" if interrupt.aftermath else ""
            print(f"raylet-sim: {interrupt.said}; the node stopped{after}", file=sys.stderr)
        return interrupt.exit_code
    return code


def entry() -> NoReturn:
    """The command (``raylet-sim``, ``python -m raylet_sim``): ``main``, and after a stop signal
    (an exit code of 128 + it, which only the stop gives) an exit without the interpreter's
    teardown. By then the node is stopped, its temp files handed to their remover and the line
    said; what is left is freeing the run's memory and modules, which took 0.2 to 0.7 s of the
    stop on a busy 2-core VM."""
    code = main()
    if code < 128:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _c = main()
    sys.exit(_c)
