"""The command line of ``rtenv-agent ray-agent``: the flags a Ray raylet passes its runtime env
agent (``ray/_private/services.py`` builds them for ``runtime_env/agent/main.py``), as
``--flag=value`` or ``--flag value``, parsed into ``RayFlags``. A flag it does not know (a later
Ray may add some) is kept aside to be logged once; a missing or malformed one is ``Refused``
(one line, exit 2), checked before anything binds. Pure: no I/O.

The flag sets of the Rays supported (``agent.ops.ray_swap.SUPPORTED_RAY``), read in each release's
services.py:

- Ray 2.54 to 2.60: ``--node-id`` and ``--session-dir`` too; the port may be 0 (the agent picks
  one and tells the raylet through ``<session-dir>/runtime_env_agent_port_<node-id>``);
- Ray 2.51 to 2.53: neither; the raylet picks the port itself and passes it (never 0), so there
  is no port file; the node is then known by its agent port (``RayFlags.node_key``).

``--ray-version`` is ours, not Ray's: the swap (``agent.ops.ray_swap``) passes the Ray the raylet is
of, for the rules that differ by version (Ray's token auth came in 2.52).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.core.errors import ConfigError, echo
from agent.install.fetch.gcs_source import GcsConfig
from agent.ops.ray_swap import ray_release

PROG = "rtenv-agent ray-agent"
# Ray's persist_port(session_dir, node_id, RUNTIME_ENV_AGENT_PORT_NAME, port) writes the file
# <session_dir>/runtime_env_agent_port_<node_id> holding the port in decimal, no newline; the
# raylet reads it (and gives up after about 15 s).
PORT_FILE_PREFIX = "runtime_env_agent_port_"
DEFAULT_LOG_FILENAME = "runtime_env_agent.log"  # Ray's RUNTIME_ENV_AGENT_LOG_FILENAME
ERR_FILENAME = "runtime_env_agent.err"  # where Ray points the agent's stderr, in its log dir
TOKEN_AUTH_SINCE = (2, 52)  # Ray's token auth (RAY_AUTH_MODE=token) came in 2.52.0
_RAY_LEVELS = {
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "WARN": "WARNING",
    "ERROR": "ERROR",
    "CRITICAL": "ERROR",
    "FATAL": "ERROR",
}


DESCRIPTION = (
    "The agent as a Ray raylet starts it, in place of Ray's runtime env agent: Ray's agent flags "
    "(unknown ones are logged and ignored); every other setting from RTENV_* variables and the "
    "config file, as for serve; the root is $RTENV_ROOT, else --root, else RUNTIME_ENV_DIR/rtenv."
)


class Refused(Exception):
    """A command-line mistake: one line, exit 2."""


@dataclass(frozen=True)
class RayFlags:
    """The flags a raylet passes to its runtime env agent (Ray 2.51 to 2.60's services.py)."""

    node_ip_address: str
    runtime_env_agent_port: int
    gcs_address: str
    cluster_id_hex: str
    runtime_env_dir: Path
    logging_rotate_bytes: int
    logging_rotate_backup_count: int
    log_dir: Path
    temp_dir: Path
    node_id: str = ""  # Ray 2.54 and later; "" before (with no session dir)
    session_dir: Path | None = None  # Ray 2.54 and later
    ray_version: str = ""  # ours (the swap's): the raylet's Ray, "" = not said
    stdout_filepath: str = ""
    stderr_filepath: str = ""
    logging_filename: str = DEFAULT_LOG_FILENAME  # "" = stderr
    logging_format: str = ""  # Ray's Python logging format; "" = ours
    logging_level: str = ""  # "" = the log-level setting
    config: Path | None = None  # a TOML file of settings, as serve's --config
    root: Path | None = None  # ours, not Ray's: the root unless $RTENV_ROOT (the Ray switch's)
    unknown: tuple[str, ...] = ()  # flags this agent does not know, logged once

    @property
    def port_file(self) -> Path | None:
        """Where the raylet reads the port (Ray 2.54 and later); None where it picked it."""
        if self.session_dir is None:
            return None
        return self.session_dir / f"{PORT_FILE_PREFIX}{self.node_id}"

    @property
    def node_key(self) -> str:
        """The node in file names (its socket): the node id, else ``port<agent port>`` (a
        raylet that passes no node id picked the port: one node, one port on this machine)."""
        return self.node_id or f"port{self.runtime_env_agent_port}"


def has_token_auth(flags: RayFlags) -> bool:
    """Whether the raylet's Ray has token auth: yes unless the swap said a Ray before 2.52
    (Ray 2.51 reads no RAY_AUTH_MODE and sends no token)."""
    known = ray_release(flags.ray_version)
    return known is None or known >= TOKEN_AUTH_SINCE


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
        ("node-ip-address", str), ("runtime-env-agent-port", _port),
        ("gcs-address", str), ("cluster-id-hex", str),
        ("runtime-env-dir", Path), ("logging-rotate-bytes", _non_negative),
        ("logging-rotate-backup-count", _non_negative), ("log-dir", Path), ("temp-dir", Path),
    ):  # fmt: skip
        required.add_argument(f"--{name}", type=kind, required=True)
    p.add_argument("--node-id", default="", help="Ray 2.54 and later, with --session-dir")
    p.add_argument("--session-dir", type=Path, help="Ray 2.54 and later, with --node-id")
    p.add_argument("--ray-version", default="", help="ours: the Ray of the raylet (the swap's)")
    p.add_argument("--stdout-filepath", default="")
    p.add_argument("--stderr-filepath", default="")
    p.add_argument("--logging-filename", default=DEFAULT_LOG_FILENAME)
    p.add_argument("--logging-format", default="")
    p.add_argument("--logging-level", type=_level)  # not passed by the raylet
    p.add_argument("--config", type=Path, help="a TOML file of settings (or RTENV_CONFIG)")
    p.add_argument(
        "--root",
        type=_root,
        help="the agent's root, unless RTENV_ROOT names one (the Ray "
        "switch, rtenv-agent ray enable, passes it); default RUNTIME_ENV_DIR/rtenv",
    )
    return p


def parse_flags(argv: Sequence[str]) -> RayFlags:
    """Ray's flags; unknown ones kept aside (to be logged). Raises Refused for a missing or
    malformed one."""
    args, unknown = parser().parse_known_args(list(argv))
    if not args.node_ip_address.strip():
        raise Refused("--node-ip-address is empty")
    if (args.session_dir is None) != (not args.node_id):  # Ray passes both or neither
        given, missing = (
            ("--node-id", "--session-dir") if args.node_id else ("--session-dir", "--node-id")
        )
        raise Refused(
            f"{given} without {missing}: a raylet passes both (Ray 2.54 and later) or neither "
            "(Ray 2.51 to 2.53)"
        )
    if args.session_dir is not None and ("/" in args.node_id or args.node_id in (".", "..")):
        raise Refused(f"--node-id {echo(args.node_id)} cannot name a file in the session dir")
    if args.session_dir is None and args.runtime_env_agent_port == 0:
        raise Refused(
            "--runtime-env-agent-port is 0 with no --session-dir: a raylet that passes no "
            "session dir picks the port itself (Ray 2.51 to 2.53), and could not learn another"
        )
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


def _loose(argv: Sequence[str], flag: str) -> str:
    """The last value of ``--flag`` in ``argv`` (either spelling), read without parsing the
    rest: for a command line too broken to parse. "" when absent or empty."""
    found = ""
    for i, word in enumerate(argv):
        if word.startswith(f"{flag}="):
            found = word.partition("=")[2]
        elif word == flag and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def failure_files(argv: Sequence[str]) -> list[Path]:
    """Where a failure to start is written for a Ray user to find, read from flags that may
    not parse: Ray's stderr file for the agent (``--stderr-filepath``, Ray's
    ``<log-dir>/runtime_env_agent.err``), else ``runtime_env_agent.err`` in the log dir
    (``--log-dir``, else ``<session-dir>/logs``, else the ``logs`` beside ``--runtime-env-dir``,
    which is ``<session>/runtime_resources``); and the agent's log file in that log dir
    (``--logging-filename``, Ray's ``runtime_env_agent.log`` by default). Empty when the flags
    name none of these (the line is then on stderr only: a raylet writes its agent's
    inherited stderr into its own ``raylet.err``)."""
    log_dir = _loose(argv, "--log-dir")
    if not log_dir and (session := _loose(argv, "--session-dir")):
        log_dir = str(Path(session) / "logs")
    if not log_dir and (resources := _loose(argv, "--runtime-env-dir")):
        log_dir = str(Path(resources).parent / "logs")
    out = []
    if err := _loose(argv, "--stderr-filepath"):
        out.append(Path(err))
    elif log_dir:
        out.append(Path(log_dir) / ERR_FILENAME)
    name = _loose(argv, "--logging-filename") or DEFAULT_LOG_FILENAME
    if log_dir and "/" not in name and name not in (".", ".."):
        out.append(Path(log_dir) / name)
    return out
