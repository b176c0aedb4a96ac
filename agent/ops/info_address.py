"""``rtenv-agent info --address``: one agent asked over gRPC for its envs and the packages it
knows, printed as two tables and a cache line (or its reply as JSON).

A ``unix:`` path longer than a socket address may be (AF_UNIX, 107 bytes) is reached through
its folder: the folder is opened (``O_PATH``, which needs no read right) and the socket
connected as ``/proc/self/fd/<fd>/<name>``, which the kernel resolves with no such limit, links
followed as any connect follows them. So the link a Ray node's agent leaves in a long root
(``<root>/agent-<node>.sock``, pointing to its socket under a shorter folder:
``ray_agent.grpc_address``) is asked as it is named. Only a socket whose file name alone is too
long for that is refused, in words for ``info``.

Synchronous: ``info`` is a short-lived command with no event loop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
from google.protobuf import json_format

from agent.app.token import read_token
from agent.core.errors import AgentError, echo_label
from agent.core.units import human_bytes, plural
from agent.ops.startup import MAX_UNIX_PATH_BYTES, split_host_port, unix_path
from rtenv.v1 import agent_pb2, agent_pb2_grpc

CONNECT_TIMEOUT_S = 2.0  # an agent that is running accepts a connection at once
INFO_TIMEOUT_S = 10.0  # the answer's deadline unless --timeout says
_FD_PATH = "/proc/self/fd"
_RUNNING = "is the agent running? it prints its address when it starts"
_PROG = "rtenv-agent info"
_ADDRESS_CHARS = 600  # of an address echoed in a message (a path may be 4096 bytes)


class Unreachable(Exception):
    """The address cannot be connected to: ``message`` says why, for ``info``; ``exit_code``
    2 when no socket could be reached at that path (a usage mistake), else 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class Target:
    """Where info connects: ``address`` as given (for messages), ``dial`` as connected to
    (a long unix path reached through its folder), ``path`` the unix socket's (None: TCP)."""

    address: str
    dial: str
    path: str | None


def ask(args: argparse.Namespace) -> int:
    """The --address form of ``info``: 0, 1 (no answer) or 2 (a usage mistake)."""
    try:
        path = unix_path(args.address)
        if path is None:
            split_host_port(args.address)
        token = read_token(args.token_file) if args.token_file else None
    except AgentError as exc:
        print(f"{_PROG}: {exc.message}", file=sys.stderr)
        return 2
    address = args.address if path is None else f"unix:{path}"
    try:
        with reach(address, path) as target:
            return _ask(target, args, token)
    except Unreachable as exc:
        print(f"{_PROG}: cannot connect to {_shown(address)}: {exc.message}", file=sys.stderr)
        return exc.exit_code


def _shown(address: str) -> str:
    """The address in a message: as given when printable, else quoted; cut when very long."""
    return echo_label(address, _ADDRESS_CHARS)


@contextlib.contextmanager
def reach(address: str, path: str | None) -> Iterator[Target]:
    """The target for ``address``: as it is, or a unix path over AF_UNIX's limit through its
    folder, held open while the caller connects. Unreachable when even the name is too long,
    the folder is missing (the socket file then does not exist) or cannot be opened."""
    if path is None or len(os.fsencode(path)) <= MAX_UNIX_PATH_BYTES:
        yield Target(address, address, path)
        return
    folder, name = os.path.split(path)
    try:
        fd = os.open(folder, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise Unreachable(f"the socket file does not exist ({_RUNNING})") from None
    except OSError as exc:
        raise Unreachable(f"cannot open its folder: {exc.strerror or exc}") from None
    try:
        dial = f"{_FD_PATH}/{fd}/{name}"
        if len(os.fsencode(dial)) > MAX_UNIX_PATH_BYTES:
            raise Unreachable(
                f"its path is {len(os.fsencode(path))} bytes, over the {MAX_UNIX_PATH_BYTES} "
                f"a unix socket's may be (AF_UNIX), and its file name alone "
                f"({len(os.fsencode(name))} bytes) is too long to reach through its folder; "
                "make a link with a shorter name to the socket and give info that",
                exit_code=2,
            )
        yield Target(address, f"unix:{dial}", dial)
    finally:
        os.close(fd)


def _ask(target: Target, args: argparse.Namespace, token: bytes | None) -> int:
    address = _shown(target.address)
    if (problem := _connect_problem(target)) is not None:  # known at once: no 2 s wait
        print(f"{_PROG}: cannot connect to {address}: {problem}", file=sys.stderr)
        return 1
    metadata = [("authorization", f"Bearer {token.decode()}")] if token else []
    channel_options = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),  # info lists many envs
    ]
    with grpc.insecure_channel(target.dial, options=channel_options) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            print(
                f"{_PROG}: cannot connect to {address} within {CONNECT_TIMEOUT_S:g}s ({_RUNNING})",
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
            print(f"{_PROG}: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
            return 1
    if args.json:
        print(json_format.MessageToJson(reply, preserving_proto_field_name=True))
    else:
        print(format_info(reply))
    return 0


def _connect_problem(target: Target) -> str | None:
    """What one plain connect tells at once, where gRPC would retry for the whole connect wait
    and then say only that it cannot connect: no socket file there, a file that is no socket,
    or nothing listening (a killed agent's leftover socket file; a TCP port refused). None: it
    connected, or took longer than the wait (gRPC's wait then says so)."""
    family: socket.AddressFamily
    connect_to: str | tuple[str, int]
    if target.path is not None:
        try:
            mode = os.stat(target.path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return f"the socket file does not exist ({_RUNNING})"
        except OSError:
            return None  # not ours to tell (a folder we may not search): the connect says
        if not stat.S_ISSOCK(mode):
            return "the file there is not a socket (the agent prints its address when it starts)"
        family, connect_to = socket.AF_UNIX, target.path
    else:
        connect_to = split_host_port(target.address)
        family = socket.AF_INET6 if ":" in connect_to[0] else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(CONNECT_TIMEOUT_S)
            probe.connect(connect_to)
    except ConnectionRefusedError:
        return f"nothing listens there ({_RUNNING}; a killed agent leaves its socket file)"
    except OSError:
        return None  # a timeout, a name to resolve, a route: gRPC's own wait says
    return None


def format_info(reply: agent_pb2.GetRuntimeEnvsInfoReply) -> str:
    """The info reply as two tables and a cache line, sizes in binary units. Under an env:
    its error, the jobs that created it (newest last; a client's text, quoted if not
    printable) and whether its latest create asked for eager_install. A package by its URI and
    its folder, in the words ``info --root`` uses (installing, ready, unused)."""
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
    # its folder under uris/ (<kind>-<hash of the URI>), as info --root shows it: none yet
    # while installing
    folders = [os.path.basename(uri.local_path) or "-" for uri in reply.uris]
    width = max([len("FOLDER"), *map(len, folders)]) + 2
    lines.append(f"{'KIND':<13}{'REFS':>5}  {'STATE':<11}{'SIZE':>10}  {'FOLDER':<{width}}URI")
    for uri, folder in zip(reply.uris, folders, strict=True):
        size = human_bytes(uri.size_bytes) if uri.local_path else "-"
        lines.append(
            f"{uri.kind:<13}{uri.references:>5}  {uri.state:<11}{size:>10}  "
            f"{folder:<{width}}{uri.uri}"
        )
    if len(reply.uris) < reply.total_uris:
        lines.append(f"... {reply.total_uris - len(reply.uris)} more not shown (the reply's cap)")
    lines.extend(_builds(reply.builds))
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


def _builds(builds: Iterable[agent_pb2.BuildInfo]) -> list[str]:
    """The builds in flight, one line each and who waits on it: none when there are none."""
    lines: list[str] = []
    for b in builds:
        if not lines:
            lines += ["", f"{'BUILDING':<13}{'FOR':>7}  {'SO FAR':>10}  URI"]
        lines.append(
            f"{b.kind:<13}{b.elapsed_seconds:>6.0f}s  {human_bytes(b.bytes_so_far):>10}  {b.uri}"
        )
        said = ["queued for an install slot"] if b.queued else []
        if b.env_ids:
            said.append(f"waited on by {plural(len(b.env_ids), 'create')} ({', '.join(b.env_ids)})")
        elif b.kept:
            said.append("kept going past a setup timeout: no create waits")
        if b.job_ids:
            said.append(f"jobs: {', '.join(map(echo_label, b.job_ids))}")
        if said:
            lines.append(f"{'':<13}{'; '.join(said)}")
    return lines
