"""Every setting of ``rtenv-agent serve`` in one table: its flag, environment variable, TOML key,
default, and what happens at its limit.

Where a value comes from (a flag, then ``RTENV_<NAME>``, then the TOML file, then the default)
is ``option_sources``. ``rtenv-agent config`` prints the effective values and where each came
from (``config_view``). The settings table of docs/operations.md is this table (a test keeps them
in step).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.app.config import RaySettings, Settings
from agent.core.units import (
    exact_bytes,
    human_duration,
    parse_bytes,
    parse_duration,
    parse_float,
    parse_int,
)
from agent.ops.option_parsers import (
    one_of,
    parse_bool,
    parse_floor,
    parse_ray_address,
    parse_workers,
    positive,
)
from agent.ops.usage import WrapAtSpaces

__all__ = ["OPTIONS", "Option", "parse_bytes", "parse_duration"]


@dataclass(frozen=True)
class Option:
    name: str  # the flag without dashes; RTENV_<NAME upper, - as _>; TOML key with _
    field: str  # dotted path into Settings
    parse: Callable[[str], Any]
    help: str
    at_limit: str = ""  # what happens when the limit is reached (for the settings table)
    flag: bool = False  # a switch: --name sets it
    repeat: bool = False  # a list: the flag repeats, the env var is ':'-separated
    metavar: str | None = None
    unit: str = ""  # "bytes" or "seconds": shown as 10.0 GiB or 10m
    toml: tuple[type, ...] = (str,)  # the TOML types its key takes (a repeat: each item's)

    @property
    def env_var(self) -> str:
        return "RTENV_" + self.name.upper().replace("-", "_")

    @property
    def toml_key(self) -> str:
        return self.name.replace("-", "_")


# The TOML types a key takes: what its option parses, and nothing that parse would read
# otherwise (allow_remote = "yes" or 1 is no boolean; allow_file_root = 5 no folder).
_BOOL: tuple[type, ...] = (bool,)
_COUNT: tuple[type, ...] = (int,)
_SIZE: tuple[type, ...] = (str, int)  # "500M", or bytes
_AUTO_OR_COUNT: tuple[type, ...] = (str, int)  # "auto", or a count
_TIME: tuple[type, ...] = (str, int, float)  # "90s", or seconds
_NUMBER: tuple[type, ...] = (int, float)
OPTIONS: tuple[Option, ...] = (
    Option(
        "address",
        "address",
        str,
        "unix:PATH, HOST:PORT or [IPv6]:PORT",
        "a malformed address, a path over 107 bytes, a port in use or another door's, or a "
        "non-loopback host without allow-remote: refused at start, before the root is touched",
    ),
    Option(
        "allow-remote",
        "allow_remote",
        parse_bool,
        "allow a non-loopback TCP address",
        flag=True,
        toml=_BOOL,
    ),
    Option(
        "token-file",
        "token_file",
        str,
        "a file holding a token every RPC must carry (metadata 'authorization: Bearer T')",
        "a call without the token, or with another: UNAUTHENTICATED saying which "
        "(health checks are exempt)",
    ),
    Option(
        "allow-file-root",
        "allow_file_roots",
        str,
        "a folder file:// packages and pip's local paths may come from (repeat it); none: any",
        "a file:// URI or a local path for pip outside them: PERMISSION_DENIED; a folder "
        "that does not exist: kept (it may be mounted later), with a warning",
        repeat=True,
        metavar="DIR",
    ),
    Option(
        "cache-budget",
        "cache_budget_bytes",
        parse_bytes,
        "size of the unused packages kept cached",
        "least recently used evicted until it fits",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "min-free-disk",
        "min_free_disk",
        parse_floor,
        "free space an install must leave: a size, a percentage, or auto (min of 1GiB, 5%)",
        "unused packages evicted, then RESOURCE_EXHAUSTED naming needed and free bytes",
        toml=_SIZE,
    ),
    Option(
        "max-concurrent-installs",
        "max_concurrent_installs",
        positive(parse_int),
        "installs (download and unpack) at once",
        "further installs wait in a queue",
        toml=_COUNT,
    ),
    Option(
        "extract-workers",
        "extract_workers",
        parse_workers,
        "processes zips are unpacked in (a large zip is split between them), auto (one per "
        "core, at most 4), or 0: a thread of the agent's process",
        "more unpacks wait for a free process",
        toml=_AUTO_OR_COUNT,
    ),
    Option(
        "overlap-downloads",
        "overlap_downloads",
        parse_bool,
        "extract a large http(s) zip while it downloads, planned from its tail read first "
        "with a ranged GET (false: download, then extract)",
        "a server that refuses ranges, or answers another object: the whole file is "
        "extracted after its download",
        toml=_BOOL,
    ),
    Option(
        "default-setup-timeout",
        "default_setup_timeout_s",
        positive(parse_duration),
        "time an env's setup may take when the request names none",
        "DEADLINE_EXCEEDED; the builds it started go on to their end (a create of the env joins "
        "them; `info` lists them)",
        unit="seconds",
        toml=_TIME,
    ),
    Option(
        "max-setup-timeout",
        "max_setup_timeout_s",
        positive(parse_duration),
        "the most a request may ask for (setup_timeout_seconds -1 means this)",
        "larger requests are capped to it",
        unit="seconds",
        toml=_TIME,
    ),
    Option(
        "max-message-bytes",
        "max_message_bytes",
        positive(parse_bytes),
        "largest gRPC request",
        "RESOURCE_EXHAUSTED from gRPC",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "max-env-json-bytes",
        "env.max_json_bytes",
        positive(parse_bytes),
        "largest serialized runtime env",
        "INVALID_ARGUMENT naming size and limit",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "max-uris",
        "env.max_uris",
        positive(parse_int),
        "distinct URIs per env",
        "INVALID_ARGUMENT naming count and limit",
        toml=_COUNT,
    ),
    Option(
        "max-env-var-bytes",
        "env.max_env_var_bytes",
        positive(parse_bytes),
        "size of a worker's env vars, PYTHONPATH included (kept well under ARG_MAX)",
        "INVALID_ARGUMENT naming size and limit; one variable over 128KiB likewise",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "max-download-bytes",
        "fetch.max_download_bytes",
        positive(parse_bytes),
        "largest package download",
        "FAILED_PRECONDITION naming size and limit",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "download-attempts",
        "fetch.attempts",
        positive(parse_int),
        "tries of a download that fails transiently (5xx, reset, timeout)",
        "UNAVAILABLE after the last try",
        toml=_COUNT,
    ),
    Option(
        "max-archive-entries",
        "archive.max_entries",
        positive(parse_int),
        "entries per zip",
        "FAILED_PRECONDITION naming count and limit",
        toml=_COUNT,
    ),
    Option(
        "max-uncompressed-bytes",
        "archive.max_uncompressed_bytes",
        positive(parse_bytes),
        "size one zip may unpack to",
        "FAILED_PRECONDITION naming size and limit",
        unit="bytes",
        toml=_SIZE,
    ),
    Option(
        "max-compression-ratio",
        "archive.max_ratio",
        positive(parse_float),
        "unpacked bytes per zip byte, past 16MiB unpacked",
        "FAILED_PRECONDITION (zip bomb)",
        toml=_NUMBER,
    ),
    Option(
        "request-log-capacity",
        "request_log_capacity",
        positive(parse_int),
        "request ids remembered for idempotent retries",
        "the oldest answered ids are forgotten (never one in flight)",
        toml=_COUNT,
    ),
    Option(
        "python",
        "py_executable",
        str,
        "the python workers are started with, and pip venvs are made from",
        "one that does not exist or does not run: refused at start",
    ),
    Option(
        "pip-installer",
        "pip_installer",
        one_of("auto", "pip", "uv"),
        "what installs a pip env: uv (hardlinked from the root's wheel cache), or pip (each "
        "venv a copy); auto: uv when there is one beside the agent's python or on PATH, "
        "else pip; `uv` envs always use uv",
        "an install that fails: FAILED_PRECONDITION with pip's own last lines, cut short",
    ),
    Option(
        "state-db",
        "persist",
        parse_bool,
        "keep the cache index in ROOT/state.db (false: a restart forgets the cache)",
        toml=_BOOL,
    ),
    Option(
        "reset-state",
        "reset_state",
        parse_bool,
        "move an unusable ROOT/state.db aside (kept, renamed) and start from an empty cache",
        flag=True,
        toml=_BOOL,
    ),
    Option(
        "metrics-address",
        "metrics_address",
        str,
        "HOST:PORT to serve Prometheus metrics on (off by default; loopback unless allow-remote)",
        "a malformed address, a port in use or another door's, or a non-loopback host "
        "without allow-remote: refused at start, before the root is touched",
    ),
    Option(
        "ray-address",
        "ray",
        parse_ray_address,
        "HOST:PORT to serve Ray's runtime env agent protocol on, for clients of it other than "
        "a raylet (off by default; loopback unless allow-remote; with --token-file, it "
        "requires that token too)",
        "a malformed address, a port in use or another door's, or a non-loopback host "
        "without allow-remote: refused at start, before the root is touched",
    ),
    Option("log-format", "log_format", one_of("text", "json"), "text or json"),
    Option(
        "log-level",
        "log_level",
        one_of("DEBUG", "INFO", "WARNING", "ERROR"),
        "DEBUG, INFO, WARNING or ERROR (any case)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option as a flag whose default is None, so that an absent flag is known."""
    parser.formatter_class = WrapAtSpaces  # a default such as a path stays whole
    parser.add_argument("--root", type=Path, required=True, help="the agent's directory")
    parser.add_argument("--parent-pid", type=int, help="shut down when this process exits")
    parser.add_argument("--config", type=Path, help="a TOML file of settings (or RTENV_CONFIG)")
    # --state-db and --no-state-db set one setting: given both, argparse refuses them in one
    # line (a later one silently won); every other option has one flag
    state_db = parser.add_mutually_exclusive_group()
    defaults = Settings(root=Path("ROOT"))
    for opt in OPTIONS:
        default = value_text(defaults, opt)
        text = f"{opt.help} (default {default}; env {opt.env_var})".replace("%", "%%")
        group = state_db if opt.name == "state-db" else parser
        if opt.flag:
            group.add_argument(f"--{opt.name}", action="store_const", const="true", help=text)
        elif opt.repeat:
            group.add_argument(f"--{opt.name}", action="append", metavar=opt.metavar, help=text)
        else:
            group.add_argument(f"--{opt.name}", metavar=opt.metavar, help=text)
    state_db.add_argument(
        "--no-state-db",
        action="store_const",
        const="false",
        dest="state_db",
        help="the same as --state-db false",
    )


def field_value(settings: Settings, path: str) -> Any:
    """The value at ``path`` (an ``Option.field``: dotted) in ``settings``."""
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def value_text(settings: Settings, opt: Option) -> str:
    """An option's value as people read it: sizes in binary units, times in s, m or h, the
    address an agent would really listen on."""
    value = field_value(settings, opt.field)
    if opt.field == "address":
        return settings.resolved_address()
    if opt.field == "extract_workers" and value is None:
        return "auto"
    if isinstance(value, RaySettings):
        host = f"[{value.host}]" if ":" in value.host else value.host
        return f"{host}:{value.port}"
    if opt.unit == "bytes":
        return exact_bytes(value)
    if opt.unit == "seconds":
        return human_duration(value)
    return _show(value)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ":".join(map(str, value)) or "(none)"
    if value is None or value == "":
        return "(none)"
    return str(value)


def markdown_table(options: Sequence[Option] = OPTIONS) -> str:
    """The settings table of docs/operations.md (a test keeps that copy equal to this)."""
    defaults = Settings(root=Path("ROOT"))
    lines = [
        "| setting (flag, `RTENV_…`, TOML key) | default | what it is | at the limit |",
        "| --- | --- | --- | --- |",
    ]
    for o in options:
        default = value_text(defaults, o).replace(sys.executable, "the agent's python")
        lines.append(
            f"| `--{o.name}`, `{o.env_var}`, `{o.toml_key}` | {default} | {o.help} | "
            f"{o.at_limit or '-'} |"
        )
    return "\n".join(lines)
