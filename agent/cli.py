"""``rtenv-agent``: ``serve`` runs the agent; ``config`` prints its effective settings; ``info``
prints what an agent holds."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from agent import logs, options
from agent.errors import AgentError
from agent.server import serve
from rtenv.v1 import agent_pb2, agent_pb2_grpc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtenv-agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    options.add_arguments(sub.add_parser("serve", help="run the agent"))
    options.add_arguments(
        sub.add_parser("config", help="print the effective settings and where each came from")
    )
    i = sub.add_parser("info", help="print the envs and URIs an agent holds")
    i.add_argument("--address", required=True, help="unix:PATH or HOST:PORT")
    i.add_argument("--limit", type=int, default=0, help="at most this many envs (0: the cap)")
    i.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the agent")
    i.add_argument("--token-file", help="a file holding the agent's token, if it wants one")
    return parser


def format_info(reply: agent_pb2.GetRuntimeEnvsInfoReply) -> str:
    """The info reply as two tables and a cache line."""
    lines = [f"{'ENV ID':<34}{'REFS':>5}  {'STATE':<9}URIS"]
    for env in reply.envs:
        uris = ", ".join(env.uris) or "-"
        lines.append(f"{env.runtime_env_id:<34}{env.references:>5}  {env.state:<9}{uris}")
        if env.error:
            lines.append(f"{'':<41}error: {env.error}")
    lines.append("")
    lines.append(f"{'KIND':<13}{'REFS':>5}  {'STATE':<11}{'BYTES':>12}  URI")
    for uri in reply.uris:
        lines.append(
            f"{uri.kind:<13}{uri.references:>5}  {uri.state:<11}{uri.size_bytes:>12}  {uri.uri}"
        )
    c = reply.cache
    lines.append("")
    lines.append(
        f"envs {reply.total_envs}, cache: used {c.used_bytes} B, unused {c.unused_bytes} B "
        f"of budget {c.budget_bytes} B; downloads {c.downloads}, hits {c.hits}, "
        f"evictions {c.evictions}"
    )
    r = reply.recovery
    lines.append(
        f"at start: {r.rows_kept} packages kept, {r.rows_dropped} rows dropped, "
        f"{r.orphans_deleted} orphans deleted, {r.bytes_freed} B freed, "
        f"{r.envs_forgotten} envs forgotten, in {r.seconds:.3f}s"
    )
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    metadata = []
    if args.token_file:
        token = Path(args.token_file).read_text().strip()
        metadata.append(("authorization", f"Bearer {token}"))
    big = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]  # info lists many envs
    with grpc.insecure_channel(args.address, options=big) as channel:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = stub.GetRuntimeEnvsInfo(
                agent_pb2.GetRuntimeEnvsInfoRequest(limit=args.limit),
                timeout=args.timeout,
                wait_for_ready=True,
                metadata=metadata,
            )
        except grpc.RpcError as exc:
            print(f"rtenv-agent info: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(format_info(reply))
    return 0


def _use_uvloop_if_installed() -> None:
    """uvloop (the optional extra 'fast') runs the same code with less overhead per RPC."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return
    uvloop.install()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "info":
        return _info(args)
    try:
        settings, sources = options.resolve(args, os.environ, lambda p: p.read_text())
        if args.command == "config":
            print(options.effective(settings, sources))
            return 0
        logs.configure(settings.log_level, settings.log_format)
        # The loop hands the GIL to the unzip and hash threads every 5 ms by default, which is
        # what an RPC then waits; 1 ms keeps the loop answering while an install runs.
        sys.setswitchinterval(0.001)
        _use_uvloop_if_installed()
        return asyncio.run(serve(settings))
    except (AgentError, ValueError) as exc:
        print(f"rtenv-agent: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
