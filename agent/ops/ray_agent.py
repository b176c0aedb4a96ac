"""``rtenv-agent ray-agent``: the process a Ray raylet starts as its runtime env agent.

A raylet starts its agent with the flags Ray's ``ray/_private/services.py`` builds for
``ray/_private/runtime_env/agent/main.py`` (``--node-id``, ``--node-ip-address``,
``--runtime-env-agent-port``, ``--session-dir``, ``--gcs-address``, ``--cluster-id-hex``,
``--runtime-env-dir``, ``--logging-rotate-bytes``, ``--logging-rotate-backup-count``,
``--log-dir``, ``--temp-dir``, and maybe ``--stdout-filepath``, ``--stderr-filepath``,
``--logging-filename``, ``--logging-format``); this command takes the same flags, both as
``--flag=value`` and ``--flag value``, tolerates flags it does not know (a later Ray may add some:
they are logged once) and turns them into the agent's ``Settings``:

- every setting of ``serve`` from ``RTENV_*`` and the ``--config`` file (``RTENV_CONFIG``), as
  ``serve`` resolves them; Ray's flags on top;
- ``Settings.ray``: the Ray door on the node IP and the agent port (0: a free port), the port
  told to the raylet through ``<session-dir>/runtime_env_agent_port_<node-id>`` (the file Ray's
  ``persist_port`` writes: the port in decimal, no newline), Ray's token when its token auth is
  on, the node's GCS for ``gcs://`` packages;
- ``allow_remote``: the door binds the node IP, as Ray's own agent does;
- the root: ``$RTENV_ROOT``, else ``<runtime-env-dir>/rtenv`` (inside Ray's session: a new
  session starts an empty cache; set ``RTENV_ROOT`` to keep it);
- the gRPC door on ``unix:<root>/agent.sock``, or a short path under the temp dir when that one
  is too long for AF_UNIX (a Ray session path is long; the start never fails for it);
- the parent: ``$RAY_RAYLET_PID`` (the raylet sets it), else the parent process: the agent exits
  when the raylet dies;
- logs to ``<log-dir>/<logging-filename>`` (Ray's ``runtime_env_agent.log`` by default) rotated at
  Ray's size and count; to stderr when the file name is empty; stdout and stderr to
  ``--stdout-filepath`` and ``--stderr-filepath`` when given (``ray logs`` and the dashboard read
  them).

This module never imports ``ray``: the raylet starts it with any python that has this agent.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import logging.handlers
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from agent.app.config import RaySettings, Settings
from agent.core.errors import ConfigError, echo
from agent.ops import logs, options
from agent.ops.startup import MAX_UNIX_PATH_BYTES

log = logging.getLogger(__name__)

PROG = "rtenv-agent ray-agent"
# Ray's persist_port(session_dir, node_id, RUNTIME_ENV_AGENT_PORT_NAME, port) writes the file
# <session_dir>/runtime_env_agent_port_<node_id> holding the port in decimal, no newline; the
# raylet reads it (and gives up after about 15 s).
PORT_FILE_PREFIX = "runtime_env_agent_port_"
DEFAULT_LOG_FILENAME = "runtime_env_agent.log"  # Ray's RUNTIME_ENV_AGENT_LOG_FILENAME
DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"  # under the home folder, as Ray looks for it
MAX_TOKEN_FILE_BYTES = 64 * 1024  # a token file is one line; more is not a token file
_RAY_LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING",
               "ERROR": "ERROR", "CRITICAL": "ERROR", "FATAL": "ERROR"}  # fmt: skip


DESCRIPTION = (
    "The agent as a Ray raylet starts it, in place of Ray's runtime env agent: Ray's agent flags "
    "(unknown ones are logged and ignored); every other setting from RTENV_* variables and the "
    "config file, as for serve; the root is $RTENV_ROOT, else RUNTIME_ENV_DIR/rtenv."
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
    return p


def parse_flags(argv: Sequence[str]) -> RayFlags:
    """Ray's flags; unknown ones kept aside (to be logged). Raises Refused for a missing or
    malformed one."""
    args, unknown = parser().parse_known_args(list(argv))
    if not args.node_ip_address.strip():
        raise Refused("--node-ip-address is empty")
    if not args.node_id or "/" in args.node_id or args.node_id in (".", ".."):
        raise Refused(f"--node-id {echo(args.node_id)} cannot name a file in the session dir")
    args.logging_level = args.logging_level or ""
    return RayFlags(**vars(args), unknown=tuple(unknown))


def ray_token(environ: Mapping[str, str], home: Path, read: Callable[[Path], str]) -> str | None:
    """Ray's auth token when its token auth is on (RAY_AUTH_MODE=token): RAY_AUTH_TOKEN, else
    the file at RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token; stripped. None when auth is off."""
    if environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        return None
    token = environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    named = environ.get("RAY_AUTH_TOKEN_PATH", "")
    path = Path(named) if named else home / DEFAULT_TOKEN_FILE
    where = "RAY_AUTH_TOKEN_PATH" if named else "the default token file"
    try:
        token = read(path).strip()
    except FileNotFoundError:
        raise ConfigError(
            f"RAY_AUTH_MODE=token but no token: RAY_AUTH_TOKEN is not set and {path} ({where}) "
            "does not exist; set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"cannot read Ray's token file {path} ({where}): {reason}") from exc
    if not token:
        raise ConfigError(f"Ray's token file {path} ({where}) is empty")
    return token


def _read_token_file(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(f"{path} is over {MAX_TOKEN_FILE_BYTES} bytes: not a token file")
    return data.decode()


def grpc_address(root: Path, temp_dir: str) -> str:
    """``unix:<root>/agent.sock``, or, when that path is over AF_UNIX's limit, a socket in a
    folder of the agent's own under ``temp_dir`` (else /tmp) named by a hash of the root: one
    root, one socket."""
    path = os.path.abspath(root / "agent.sock")
    if len(os.fsencode(path)) <= MAX_UNIX_PATH_BYTES:
        return f"unix:{path}"
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    for base in (temp_dir, "/tmp"):
        short = os.path.join(os.path.abspath(base), f"rtenv-{digest}", "agent.sock")
        if len(os.fsencode(short)) <= MAX_UNIX_PATH_BYTES:
            return f"unix:{short}"
    return f"unix:/tmp/rtenv-{digest}/agent.sock"  # pragma: no cover - /tmp is short


def parent_pid(environ: Mapping[str, str], getppid: Callable[[], int]) -> int:
    """The raylet's pid: $RAY_RAYLET_PID (the raylet sets it), else our parent."""
    text = environ.get("RAY_RAYLET_PID", "").strip()
    if not text:
        return getppid()
    if not text.isdigit() or int(text) <= 1:
        raise ConfigError(f"RAY_RAYLET_PID {echo(text)} is not a process id")
    return int(text)


def settings_for(
    flags: RayFlags,
    environ: Mapping[str, str],
    read: Callable[[Path], str],
    *,
    home: Path,
    getppid: Callable[[], int] = os.getppid,
) -> Settings:
    """The agent's settings: the options table (RTENV_*, the config file), Ray's flags on top."""
    root = Path(environ["RTENV_ROOT"]) if environ.get("RTENV_ROOT") else flags.runtime_env_dir
    if not environ.get("RTENV_ROOT"):
        root = root / "rtenv"
    namespace = argparse.Namespace(root=root, parent_pid=None, config=flags.config)
    settings, _ = options.resolve(namespace, environ, read)
    ray = RaySettings(
        host=flags.node_ip_address,
        port=flags.runtime_env_agent_port,
        port_file=flags.port_file,
        token=ray_token(environ, home, _read_token_file),
        gcs_address=flags.gcs_address,
        cluster_id_hex=flags.cluster_id_hex,
        node_id=flags.node_id,
    )
    address = settings.address or grpc_address(settings.root, tempfile.gettempdir())
    settings = replace(
        settings,
        address=address,
        allow_remote=True,
        parent_pid=parent_pid(environ, getppid),
        ray=ray,
    )
    if flags.logging_level:
        settings = replace(settings, log_level=flags.logging_level)
    return settings


def redirect_std(flags: RayFlags) -> None:
    """stdout and stderr (the file descriptors: a crash's last words too) to Ray's files."""
    for name, fd in ((flags.stdout_filepath, 1), (flags.stderr_filepath, 2)):
        if not name:
            continue
        try:
            Path(name).parent.mkdir(parents=True, exist_ok=True)
            target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot open {name} for the agent's output: {exc.strerror}") from exc
        try:
            (sys.stdout if fd == 1 else sys.stderr).flush()
            os.dup2(target, fd)
        finally:
            os.close(target)


def log_handler(flags: RayFlags) -> logging.Handler:
    """Ray's log file with its rotation, or stderr when Ray names no file."""
    if not flags.logging_filename:
        return logging.StreamHandler(sys.stderr)
    path = flags.log_dir / flags.logging_filename
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return logging.handlers.RotatingFileHandler(
            path,
            maxBytes=flags.logging_rotate_bytes,
            backupCount=flags.logging_rotate_backup_count,
            encoding="utf-8",
        )
    except OSError as exc:
        raise ConfigError(f"cannot write the log file {path}: {exc.strerror}") from exc


def prepare(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Parse, redirect the output, resolve the settings and set up logging, in that order (a
    mistake after the redirect lands where Ray's user reads the agent's stderr). Raises Refused,
    AgentError or ValueError for a mistake."""
    flags = parse_flags(argv)
    redirect_std(flags)
    settings = settings_for(flags, environ, lambda p: p.read_text(), home=Path.home())
    text_format = flags.logging_format if settings.log_format == "text" else None
    logs.configure(
        settings.log_level, settings.log_format, handler=log_handler(flags), text_format=text_format
    )
    if flags.unknown:
        log.warning(
            "ignoring flags this agent does not know: %s", echo(" ".join(flags.unknown), 500)
        )
    log.info(
        "Ray node %s: Ray door on %s:%d, port file %s, root %s, raylet pid %s",
        flags.node_id, flags.node_ip_address, flags.runtime_env_agent_port, flags.port_file,
        settings.root, settings.parent_pid,
    )  # fmt: skip
    return settings
