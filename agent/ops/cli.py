"""rtenv-agent: serve runs the agent; config prints its effective settings; info prints what an
agent holds, or what a root's shared index holds; ray-agent is the agent as a Ray raylet starts
it; ray runs Ray's own CLI with its raylets starting this agent (rtenv-agent ray start --head
...), and ray enable switches a Python environment's Ray nodes to this agent."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import socket
import stat
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from agent.app.config import Settings
from agent.app.token import read_token
from agent.core.errors import AgentError, echo_label
from agent.core.units import human_bytes, parse_duration, plural
from agent.ops import keeper, logs, loops, options, ray_agent, ray_flags, root_view
from agent.ops.entry import serve
from agent.ops.startup import check_address, file_root_warning, missing_folders, split_host_port
from agent.ops.usage import OneLineParser
from rtenv.v1 import agent_pb2, agent_pb2_grpc

CONNECT_TIMEOUT_S = 2.0  # info: an agent that is running accepts a connection at once
INFO_TIMEOUT_S = 10.0  # info --address: the answer's deadline unless --timeout says


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps help at spaces only: a path or a flag is never cut at its hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(
            " ".join(text.split()), width, break_on_hyphens=False, break_long_words=False
        )


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
    parser = OneLineParser(prog="rtenv-agent", description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    options.add_arguments(
        sub.add_parser("serve", help="run the agent", formatter_class=_HelpFormatter)
    )
    options.add_arguments(
        sub.add_parser(
            "config",
            help="print the effective settings and where each came from",
            formatter_class=_HelpFormatter,
        )
    )
    i = sub.add_parser(
        "info",
        help="print what one agent holds (--address) or what a root's shared index holds (--root)",
        formatter_class=_HelpFormatter,
    )
    where = i.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--address",
        metavar="ADDR",
        help="unix:PATH or HOST:PORT of one agent: its envs and the packages it knows, over gRPC",
    )
    where.add_argument(
        "--root", type=Path, metavar="DIR",
        help="a cache root: its shared index, read from DIR/state.db with no agent needed (the "
        "agents serving it, alive or dead, and its packages); several agents may serve one "
        "root, each on its own socket: ask one with --address",
    )  # fmt: skip
    i.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="--address: at most this many envs (0: the cap)",
    )
    i.add_argument(
        "--timeout", type=_arg(parse_duration), default=None, metavar="DURATION",
        help="--address: time to wait for the answer (90, 90s, 2m; default 10s)",
    )  # fmt: skip
    i.add_argument(
        "--token-file",
        metavar="FILE",
        help="--address: a file holding the agent's token, if it wants one",
    )
    i.add_argument("--json", action="store_true", help="print it as JSON (exact bytes)")
    # Both parse their own arguments (main hands them over before this parser runs): listed
    # here for --help.
    sub.add_parser(
        "ray-agent", add_help=False,
        help="the agent as a Ray raylet starts it (Ray's agent flags; rtenv-agent ray-agent -h)",
    )  # fmt: skip
    sub.add_parser(
        "ray", add_help=False,
        help="Ray's own CLI, its raylets starting this agent: rtenv-agent ray start --head ...; "
        "rtenv-agent ray stop [--temp-dir DIR | --address HOST:PORT]: only the nodes of that temp "
        "dir or cluster, by PID; and rtenv-agent ray enable|disable|enabled [--python PATH]: every "
        "Ray node that python starts (a bare ray.init() too) runs this agent",
    )  # fmt: skip
    return parser


def format_info(reply: agent_pb2.GetRuntimeEnvsInfoReply) -> str:
    """The info reply as two tables and a cache line, sizes in binary units. Under an env:
    its error, the jobs that created it (newest last; a client's text, quoted if not
    printable) and whether its latest create asked for eager_install."""
    lines = [f"{'ENV ID':<34}{'REFS':>5}  {'STATE':<9}URIS"]
    for env in reply.envs:
        uris = ", ".join(env.uris) or "-"
        lines.append(f"{env.runtime_env_id:<34}{env.references:>5}  {env.state:<9}{uris}")
        if env.error:
            lines.append(f"{'':<41}error: {env.error}")
        said = [f"jobs: {', '.join(map(echo_label, env.job_ids))}"] if env.job_ids else []
        if env.eager_install:
            said.append("eager_install")
        if said:
            lines.append(f"{'':<41}{'; '.join(said)}")
    if len(reply.envs) < reply.total_envs:
        lines.append(f"... {reply.total_envs - len(reply.envs)} more not shown (the reply's cap)")
    lines.append("")
    lines.append(f"{'KIND':<13}{'REFS':>5}  {'STATE':<11}{'SIZE':>10}  URI")
    for uri in reply.uris:
        size = human_bytes(uri.size_bytes)
        lines.append(f"{uri.kind:<13}{uri.references:>5}  {uri.state:<11}{size:>10}  {uri.uri}")
    if len(reply.uris) < reply.total_uris:
        lines.append(f"... {reply.total_uris - len(reply.uris)} more not shown (the reply's cap)")
    c = reply.cache
    lines.append("")
    lines.append(
        f"{plural(reply.total_envs, 'env')}, cache: used {human_bytes(c.used_bytes)}, "
        f"unused {human_bytes(c.unused_bytes)} of budget {human_bytes(c.budget_bytes)}; "
        f"{plural(c.downloads, 'download')}, {plural(c.hits, 'hit')}, "
        f"{plural(c.evictions, 'eviction')}"
    )
    r = reply.recovery
    lines.append(
        f"at start: {plural(r.rows_kept, 'package')} kept, {plural(r.rows_dropped, 'row')} "
        f"dropped, {plural(r.orphans_deleted, 'orphan')} deleted, {human_bytes(r.bytes_freed)} "
        f"freed, {plural(r.envs_forgotten, 'env')} forgotten, in {r.seconds:.3f}s"
    )
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    if args.root is not None:
        return _info_root(args)
    try:
        address = check_address(args.address, allow_remote=True)
        token = read_token(args.token_file) if args.token_file else None
    except AgentError as exc:
        print(f"rtenv-agent info: {exc.message}", file=sys.stderr)
        return 2
    if (problem := _connect_problem(address)) is not None:  # known at once: no 2 s wait
        print(f"rtenv-agent info: cannot connect to {address}: {problem}", file=sys.stderr)
        return 1
    metadata = [("authorization", f"Bearer {token.decode()}")] if token else []
    channel_options = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),  # info lists many envs
    ]
    with grpc.insecure_channel(address, options=channel_options) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            print(
                f"rtenv-agent info: cannot connect to {address} within {CONNECT_TIMEOUT_S:g}s "
                "(is the agent running? it prints its address when it starts)",
                file=sys.stderr,
            )
            return 1
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = stub.GetRuntimeEnvsInfo(
                agent_pb2.GetRuntimeEnvsInfoRequest(limit=args.limit or 0),
                timeout=INFO_TIMEOUT_S if args.timeout is None else args.timeout,
                metadata=metadata,
            )
        except grpc.RpcError as exc:
            hint = ""
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                hint = " (info: pass --token-file FILE)" if token is None else ""
            print(f"rtenv-agent info: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
            return 1
    if args.json:
        print(json_format.MessageToJson(reply, preserving_proto_field_name=True))
    else:
        print(format_info(reply))
    return 0


def _connect_problem(address: str) -> str | None:
    """What one plain connect tells at once, where gRPC would retry for the whole connect wait
    and then say only that it cannot connect: no socket file there, a file that is no socket,
    or nothing listening (a killed agent's leftover socket file; a TCP port refused). None: it
    connected, or took longer than the wait (gRPC's wait then says so)."""
    running = "is the agent running? it prints its address when it starts"
    target: str | tuple[str, int]
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return f"the socket file does not exist ({running})"
        except OSError:
            return None  # not ours to tell (a folder we may not search): the connect says
        if not stat.S_ISSOCK(mode):
            return "the file there is not a socket (the agent prints its address when it starts)"
        family, target = socket.AF_UNIX, path
    else:
        target = split_host_port(address)
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(CONNECT_TIMEOUT_S)
            probe.connect(target)
    except ConnectionRefusedError:
        return f"nothing listens there ({running}; a killed agent leaves its socket file)"
    except OSError:
        return None  # a timeout, a name to resolve, a route: gRPC's own wait says
    return None


def _info_root(args: argparse.Namespace) -> int:
    """The root's shared index, read from its state.db (no agent asked: ``root_view``)."""
    for flag, value in (("--limit", args.limit), ("--timeout", args.timeout),
                        ("--token-file", args.token_file)):  # fmt: skip
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


def _run(settings: Settings, keeper_pid: int | None = None) -> int:
    # The loop hands the GIL to the unzip and hash threads every 5 ms by default, which is
    # what an RPC then waits; 1 ms keeps the loop answering while an install runs.
    sys.setswitchinterval(0.001)
    # uvloop (the extra 'fast') when installed, unless RTENV_EVENT_LOOP says (agent.ops.loops);
    # chosen before anything touches the root. The start-up log says which loop runs.
    with asyncio.Runner(loop_factory=loops.loop_factory(os.environ)) as runner:
        return runner.run(serve(settings, freeze_heap=True, keeper_pid=keeper_pid))


def _ray_agent(argv: Sequence[str]) -> int:
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
            return _run(prepared.settings, keeper_pid)
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
                    info.st_dev, info.st_ino
                ):  # fmt: skip
                    continue  # stderr is this file: the line is in it
                out.write(f"{stamp} ERROR {line}\n" if path.suffix == ".log" else f"{line}\n")
        except OSError:
            continue  # a folder we cannot write: stderr has the line


def _ray(argv: Sequence[str]) -> int:
    # The launcher sits above ops (it imports ray); loaded by name here only, so that nothing
    # the server imports reaches it (tests/test_layers.py).
    launcher = importlib.import_module("agent.ray.launcher")
    code: int = launcher.main(argv)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["ray-agent"]:
        return _ray_agent(given[1:])
    if given[:1] == ["ray"]:
        return _ray(given[1:])
    args = _parser().parse_args(given)
    if args.command == "info":
        return _info(args)
    try:
        settings, sources = options.resolve(args, os.environ, lambda p: p.read_text())
        if args.command == "config":
            loops.loop_factory(os.environ)  # a mistaken RTENV_EVENT_LOOP is serve's mistake too
            print(options.effective(settings, sources))
            for missing in missing_folders(settings.allow_file_roots):  # as serve warns
                print(f"rtenv-agent: warning: {file_root_warning(missing)}", file=sys.stderr)
            return 0
        logs.configure(settings.log_level, settings.log_format)
        return _run(settings)
    except (AgentError, ValueError) as exc:
        print(f"rtenv-agent: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
