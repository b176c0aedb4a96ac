"""rtenv-agent: serve runs the agent; config prints its effective settings; info prints what an
agent holds, or what a root's shared index holds; ray-agent is the agent as a Ray raylet starts
it; ray runs Ray's own CLI with its raylets starting this agent (rtenv-agent ray start --head
...), and ray enable switches a Python environment's Ray nodes to this agent."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from agent.app.config import Settings
from agent.core.errors import AgentError
from agent.core.units import parse_duration
from agent.install.venvs.wheel_cache import find_uv
from agent.ops import (
    config_view,
    info_address,
    keeper,
    logs,
    loops,
    option_sources,
    options,
    ray_agent,
    ray_flags,
    root_view,
)
from agent.ops.entry import serve
from agent.ops.server import LoadPlugins
from agent.ops.startup import file_root_warning, missing_folders
from agent.ops.usage import OneLineParser, WrapAtSpaces


@dataclass(frozen=True)
class TopLayer:
    """What the entry point (``agent.launcher.main``, the top layer) hands this command line:
    the parts that may import Ray, which no module of ops imports."""

    ray: Callable[[Sequence[str]], int]  # rtenv-agent ray ARGS: its exit code
    load_plugins: LoadPlugins  # the host of Ray's runtime env plugins, for a Ray door


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A units parser as an argparse type: its message, not argparse's 'invalid value'."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _version() -> str:
    try:
        return metadata.version("runtime-env-agent")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="rtenv-agent", description=__doc__, formatter_class=WrapAtSpaces)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    options.add_arguments(
        sub.add_parser("serve", help="run the agent", formatter_class=WrapAtSpaces)
    )
    config = sub.add_parser(
        "config",
        help="print the effective settings and where each came from",
        formatter_class=WrapAtSpaces,
    )
    options.add_arguments(config)
    config.add_argument("--json", action="store_true", help="print them as one JSON object")
    i = sub.add_parser(
        "info",
        help="print what one agent holds (--address) or what a root's shared index holds (--root)",
        formatter_class=WrapAtSpaces,
    )
    where = i.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--address",
        metavar="ADDR",
        help="unix:PATH or HOST:PORT of one agent: its envs and the packages it knows, over gRPC",
    )
    where.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help="a cache root: its shared index, read from DIR/state.db with no agent needed (the "
        "agents serving it, alive or dead, and its packages); several agents may serve one "
        "root, each on its own socket: ask one with --address",
    )
    i.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="--address: at most this many envs (0: the cap)",
    )
    i.add_argument(
        "--timeout",
        type=_arg(parse_duration),
        default=None,
        metavar="DURATION",
        help="--address: time to wait for the answer (90, 90s, 2m; default 10s)",
    )
    i.add_argument(
        "--token-file",
        metavar="FILE",
        help="--address: a file holding the agent's token, if it wants one",
    )
    i.add_argument("--json", action="store_true", help="print it as JSON (exact bytes)")
    # Both parse their own arguments (main hands them over before this parser runs): listed
    # here for --help.
    sub.add_parser(
        "ray-agent",
        add_help=False,
        help="the agent as a Ray raylet starts it (Ray's agent flags; rtenv-agent ray-agent -h)",
    )
    sub.add_parser(
        "ray",
        add_help=False,
        help="Ray's own CLI, its raylets starting this agent: rtenv-agent ray start --head ...; "
        "rtenv-agent ray stop [--temp-dir DIR | --address HOST:PORT]: only the nodes of that temp "
        "dir or cluster, by PID; and rtenv-agent ray enable|disable|enabled [--python PATH | "
        "--user | --project DIR]: every Ray node that python (or every venv of yours, or of "
        "DIR) starts (a bare ray.init() too) runs this agent",
    )
    return parser


def _info(args: argparse.Namespace) -> int:
    return _info_root(args) if args.root is not None else info_address.ask(args)


def _info_root(args: argparse.Namespace) -> int:
    """The root's shared index, read from its state.db (no agent asked: ``root_view``)."""
    for flag, value in (
        ("--limit", args.limit),
        ("--timeout", args.timeout),
        ("--token-file", args.token_file),
    ):
        if value is not None:
            print(
                f"rtenv-agent info: {flag} applies to --address only (--root reads "
                "DIR/state.db, asking no agent)",
                file=sys.stderr,
            )
            return 2
    try:
        view = root_view.read_root(args.root)
    except root_view.RootViewError as exc:
        print(f"rtenv-agent info: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(root_view.root_json(view) if args.json else root_view.format_root(view))
    return 0


def _run(settings: Settings, top: TopLayer, keeper_pid: int | None = None) -> int:
    # The loop hands the GIL to the unzip and hash threads every 5 ms by default, which is
    # what an RPC then waits; 1 ms keeps the loop answering while an install runs.
    sys.setswitchinterval(0.001)
    # uvloop (the extra 'fast') when installed, unless RTENV_EVENT_LOOP says (agent.ops.loops);
    # chosen before anything touches the root. The start-up log says which loop runs.
    with asyncio.Runner(loop_factory=loops.loop_factory(os.environ)) as runner:
        return runner.run(
            serve(
                settings,
                freeze_heap=True,
                keeper_pid=keeper_pid,
                load_plugins=top.load_plugins,
            )
        )


def _ray_agent(argv: Sequence[str], top: TopLayer) -> int:
    # Ray's raylet ends its agent with SIGKILL: the process it starts only keeps the agent,
    # which runs in a child and stops cleanly when its keeper is killed (``keeper``)
    raylet, keeper_pid = os.getppid(), None
    if raylet > 1:  # else the raylet is gone already: prepare says so
        keeper_pid = os.getpid()
        agent = keeper.split()
        if agent:
            return keeper.keep(agent)
    try:
        prepared = ray_agent.prepare(argv, os.environ, getppid=lambda: raylet)
        try:
            return _run(prepared.settings, top, keeper_pid)
        finally:
            prepared.cleanup()
    except ray_flags.Refused as exc:
        _start_failed(argv, f"{ray_flags.PROG}: {exc}")
        return 2
    except (AgentError, ValueError) as exc:
        _start_failed(argv, f"{ray_flags.PROG}: {getattr(exc, 'message', exc)}")
        return 2
    finally:
        logs.shutdown()  # the log's writer thread: what is queued is written


def _start_failed(argv: Sequence[str], line: str) -> None:
    """The one line of a failed start, on stderr and in the files a Ray user reads (Ray's
    ``runtime_env_agent.err`` and ``.log`` in the session's logs: ``ray_flags.failure_files``),
    whatever failed (flags that do not parse included): a raylet's agent that exits at once
    leaves its reason there. A file already receiving stderr is not written twice."""
    print(line, file=sys.stderr, flush=True)
    try:
        stderr = os.fstat(2)
    except OSError:
        stderr = None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for path in ray_flags.failure_files(argv):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as out:
                info = os.fstat(out.fileno())
                if stderr is not None and (stderr.st_dev, stderr.st_ino) == (
                    info.st_dev,
                    info.st_ino,
                ):
                    continue  # stderr is this file: the line is in it
                out.write(f"{stamp} ERROR {line}\n" if path.suffix == ".log" else f"{line}\n")
        except OSError:
            continue  # a folder we cannot write: stderr has the line


def main(argv: Sequence[str] | None, top: TopLayer) -> int:
    """``rtenv-agent ARGV`` (None: this process's arguments); ``top``: what the entry point
    hands down (``rtenv-agent ray`` and Ray's plugin host)."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["ray-agent"]:
        return _ray_agent(given[1:], top)
    if given[:1] == ["ray"]:
        return top.ray(given[1:])
    args = _parser().parse_args(given)
    if args.command == "info":
        return _info(args)
    try:
        settings, sources = option_sources.resolve(args, os.environ, lambda p: p.read_text())
        if args.command == "config":
            loops.loop_factory(os.environ)  # a mistaken RTENV_EVENT_LOOP is serve's mistake too
            shown = config_view.effective_json if args.json else config_view.effective
            print(shown(settings, sources, uv=find_uv()))
            for missing in missing_folders(settings.allow_file_roots):  # as serve warns
                print(f"rtenv-agent: warning: {file_root_warning(missing)}", file=sys.stderr)
            return 0
        logs.configure(settings.log_level, settings.log_format)
        return _run(settings, top)
    except (AgentError, ValueError) as exc:
        print(f"rtenv-agent: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
