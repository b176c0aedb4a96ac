"""The command line of ``rtenv-agent ray-agent``: the flags a Ray raylet passes its runtime env
agent (Ray 2.60's ``ray/_private/services.py`` builds them for ``runtime_env/agent/main.py``), as
``--flag=value`` or ``--flag value``, parsed into ``RayFlags``. A flag it does not know (a later
Ray may add some) is kept aside to be logged once; a missing or malformed one is ``Refused``
(one line, exit 2), checked before anything binds. Pure: no I/O.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.core.errors import ConfigError, echo
from agent.install.gcs_source import GcsConfig

PROG = "rtenv-agent ray-agent"
# Ray's persist_port(session_dir, node_id, RUNTIME_ENV_AGENT_PORT_NAME, port) writes the file
# <session_dir>/runtime_env_agent_port_<node_id> holding the port in decimal, no newline; the
# raylet reads it (and gives up after about 15 s).
PORT_FILE_PREFIX = "runtime_env_agent_port_"
DEFAULT_LOG_FILENAME = "runtime_env_agent.log"  # Ray's RUNTIME_ENV_AGENT_LOG_FILENAME
_RAY_LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING",
               "ERROR": "ERROR", "CRITICAL": "ERROR", "FATAL": "ERROR"}  # fmt: skip


DESCRIPTION = (
    "The agent as a Ray raylet starts it, in place of Ray's runtime env agent: Ray's agent flags "
    "(unknown ones are logged and ignored); every other setting from RTENV_* variables and the "
    "config file, as for serve; the root is $RTENV_ROOT, else --root, else RUNTIME_ENV_DIR/rtenv."
)


class Refused(Exception):
    """A command-line mistake: one line, exit 2."""


@dataclass(frozen=True)
class RayFlags:
    """The flags a raylet passes to its runtime env agent (Ray 2.60's services.py)."""

    node_id: str
    node_ip_address: str
    runtime_env_agent_port: int
    session_dir: Path
    gcs_address: str
    cluster_id_hex: str
    runtime_env_dir: Path
    logging_rotate_bytes: int
    logging_rotate_backup_count: int
    log_dir: Path
    temp_dir: Path
    stdout_filepath: str = ""
    stderr_filepath: str = ""
    logging_filename: str = DEFAULT_LOG_FILENAME  # "" = stderr
    logging_format: str = ""  # Ray's Python logging format; "" = ours
    logging_level: str = ""  # "" = the log-level setting
    config: Path | None = None  # a TOML file of settings, as serve's --config
    root: Path | None = None  # ours, not Ray's: the root unless $RTENV_ROOT (the Ray switch's)
    unknown: tuple[str, ...] = ()  # flags this agent does not know, logged once

    @property
    def port_file(self) -> Path:
        return self.session_dir / f"{PORT_FILE_PREFIX}{self.node_id}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refused(message)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{echo(text)} must be 0 or more")
    return value


def _port(text: str) -> int:
    value = _non_negative(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a port (0 to 65535)")
    return value


def _level(text: str) -> str:
    level = _RAY_LEVELS.get(text.strip().upper())
    if level is None:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not one of {', '.join(_RAY_LEVELS)}")
    return level


def _root(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty")
    return Path(text)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    required = p.add_argument_group("Ray's flags (the raylet passes them)")
    for name, kind in (
        ("node-id", str), ("node-ip-address", str), ("runtime-env-agent-port", _port),
        ("session-dir", Path), ("gcs-address", str), ("cluster-id-hex", str),
        ("runtime-env-dir", Path), ("logging-rotate-bytes", _non_negative),
        ("logging-rotate-backup-count", _non_negative), ("log-dir", Path), ("temp-dir", Path),
    ):  # fmt: skip
        required.add_argument(f"--{name}", type=kind, required=True)
    p.add_argument("--stdout-filepath", default="")
    p.add_argument("--stderr-filepath", default="")
    p.add_argument("--logging-filename", default=DEFAULT_LOG_FILENAME)
    p.add_argument("--logging-format", default="")
    p.add_argument("--logging-level", type=_level)  # not passed by the raylet
    p.add_argument("--config", type=Path, help="a TOML file of settings (or RTENV_CONFIG)")
    p.add_argument(
        "--root", type=_root, help="the agent's root, unless RTENV_ROOT names one (the Ray "
        "switch, rtenv-agent ray enable, passes it); default RUNTIME_ENV_DIR/rtenv",
    )  # fmt: skip
    return p


def parse_flags(argv: Sequence[str]) -> RayFlags:
    """Ray's flags; unknown ones kept aside (to be logged). Raises Refused for a missing or
    malformed one."""
    args, unknown = parser().parse_known_args(list(argv))
    if not args.node_ip_address.strip():
        raise Refused("--node-ip-address is empty")
    if not args.node_id or "/" in args.node_id or args.node_id in (".", ".."):
        raise Refused(f"--node-id {echo(args.node_id)} cannot name a file in the session dir")
    name = args.logging_filename
    if "/" in name or "\0" in name or name in (".", ".."):
        raise Refused(
            f"--logging-filename {echo(name)} must be a file name in --log-dir, with no path"
        )
    if not args.gcs_address:
        raise Refused("--gcs-address is empty; Ray passes its GCS's HOST:PORT")
    try:  # what would fail at the first gcs:// package fails now, before anything binds
        GcsConfig(args.gcs_address, args.cluster_id_hex)
    except ConfigError as exc:
        raise Refused(f"--gcs-address/--cluster-id-hex: {exc.message}") from None
    args.logging_level = args.logging_level or ""
    return RayFlags(**vars(args), unknown=tuple(unknown))
