"""``rtenv-agent``: ``serve`` runs the agent; ``info`` prints what an agent holds."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import grpc

from agent.archive import ArchiveLimits
from agent.config import Settings
from agent.errors import AgentError
from agent.fetch import FetchLimits
from agent.runtime_env import EnvLimits
from agent.server import serve
from rtenv.v1 import agent_pb2, agent_pb2_grpc

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(text: str) -> int:
    """'10GiB', '500M', '4096' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 4096, 500M or 10GiB")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtenv-agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d_env, d_arc, d_fetch = EnvLimits(), ArchiveLimits(), FetchLimits()

    s = sub.add_parser("serve", help="run the agent")
    s.add_argument("--root", type=Path, required=True, help="the agent's directory (cache, socket)")
    s.add_argument(
        "--address", default="", help="unix:PATH or HOST:PORT (default unix:ROOT/agent.sock)"
    )
    s.add_argument(
        "--cache-budget",
        type=parse_bytes,
        default=10 * 1024**3,
        help="bytes of unused packages kept cached (default 10GiB)",
    )
    s.add_argument("--parent-pid", type=int, help="shut down when this process exits")
    s.add_argument("--allow-remote", action="store_true", help="allow a non-loopback TCP address")
    s.add_argument("--python", default=sys.executable, help="py_executable given to workers")
    s.add_argument(
        "--default-setup-timeout",
        type=float,
        default=600.0,
        help="seconds an env's setup may take when the request names none (600)",
    )
    s.add_argument(
        "--max-env-var-bytes",
        type=parse_bytes,
        default=d_env.max_env_var_bytes,
        help="bytes of env vars a worker may be given, PYTHONPATH included (1MiB)",
    )
    s.add_argument("--max-uris", type=int, default=d_env.max_uris, help="URIs per env (256)")
    s.add_argument(
        "--max-download-bytes",
        type=parse_bytes,
        default=d_fetch.max_download_bytes,
        help="largest package download (16GiB)",
    )
    s.add_argument(
        "--max-archive-entries",
        type=int,
        default=d_arc.max_entries,
        help="entries per zip (100000)",
    )
    s.add_argument(
        "--max-uncompressed-bytes",
        type=parse_bytes,
        default=d_arc.max_uncompressed_bytes,
        help="bytes one zip may unpack to (16GiB)",
    )
    s.add_argument(
        "--max-compression-ratio",
        type=float,
        default=d_arc.max_ratio,
        help="unpacked bytes per zip byte, past 16MiB unpacked (200)",
    )
    s.add_argument(
        "--reset-state",
        action="store_true",
        help="move an unusable ROOT/state.db aside (kept, renamed) and start from an empty cache",
    )
    s.add_argument(
        "--no-state-db",
        action="store_true",
        help="keep the cache index in memory only: a restart forgets the cache",
    )
    s.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")

    i = sub.add_parser("info", help="print the envs and URIs an agent holds")
    i.add_argument("--address", required=True, help="unix:PATH or HOST:PORT")
    i.add_argument(
        "--limit", type=int, default=0, help="at most this many envs (0: the agent's cap)"
    )
    i.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the agent")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    base = Settings(root=args.root)
    return replace(
        base,
        address=args.address,
        cache_budget_bytes=args.cache_budget,
        parent_pid=args.parent_pid,
        allow_remote=args.allow_remote,
        py_executable=args.python,
        default_setup_timeout_s=args.default_setup_timeout,
        persist=not args.no_state_db,
        reset_state=args.reset_state,
        env=replace(base.env, max_env_var_bytes=args.max_env_var_bytes, max_uris=args.max_uris),
        fetch=replace(base.fetch, max_download_bytes=args.max_download_bytes),
        archive=replace(
            base.archive,
            max_entries=args.max_archive_entries,
            max_uncompressed_bytes=args.max_uncompressed_bytes,
            max_ratio=args.max_compression_ratio,
        ),
    )


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
    with grpc.insecure_channel(args.address) as channel:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = stub.GetRuntimeEnvsInfo(
                agent_pb2.GetRuntimeEnvsInfoRequest(limit=args.limit),
                timeout=args.timeout,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            print(f"rtenv-agent info: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(format_info(reply))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "info":
        return _info(args)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return asyncio.run(serve(_settings(args)))
    except AgentError as exc:
        print(f"rtenv-agent: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
