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
- the root: ``$RTENV_ROOT``, else ``--root`` (this agent's flag, not Ray's: the Ray switch,
  ``rtenv-agent ray enable``, passes its machine-wide root), else ``<runtime-env-dir>/rtenv``
  (inside Ray's session: a new session starts an empty cache; set ``RTENV_ROOT`` to keep it);
- the gRPC door on ``unix:<root>/agent-<node>.sock``, ``<node>`` the first 16 characters of
  the node id: one socket per node, since several nodes on one machine may share a root
  (``RTENV_ROOT``); or, when that path is too long for AF_UNIX (a Ray session path is long; the
  start never fails for it), ``<temp-dir>/rtenv-<hash of that path>/agent-<node>.sock`` in a
  folder of the agent's own (Ray's ``--temp-dir``; refused when someone else made it or it is
  open to others; removed at exit by the agent that made it), with a link
  ``<root>/agent-<node>.sock`` to it (``grpc_address``). ``RTENV_ADDRESS`` (or ``address`` in
  the config file) replaces the rule;
- the parent: the process that started it, which is the raylet (as Ray's own agent, which counts
  the raylet gone when its parent is; ``$RAY_RAYLET_PID`` naming another process is logged); the
  agent exits when it dies, and refuses to start when it is already gone (parent pid 1);
- logs to ``<log-dir>/<logging-filename>`` (Ray's ``runtime_env_agent.log`` by default) rotated at
  Ray's size and count, written by a thread of their own (never on the event loop); to stderr
  when the file name is empty; stdout and stderr to ``--stdout-filepath`` and
  ``--stderr-filepath`` when given (``ray logs`` and the dashboard read them).

Not supported: Ray's TLS mode (``RAY_USE_TLS=1``): the agent reads gcs:// packages over a
plain channel, so it refuses to start, saying so.

Its flags are parsed in ``ray_flags``, Ray's token found in ``ray_token``; this module makes
them the agent's settings, its socket, its logs and output. It never imports ``ray``: the raylet
starts it with any python that has this agent.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import logging.handlers
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from agent.app.config import RaySettings, Settings
from agent.core.errors import ConfigError, echo
from agent.install.fetch.gcs_source import GcsConfig
from agent.ops import logs, option_sources
from agent.ops.ray_flags import RayFlags, has_token_auth, parse_flags
from agent.ops.ray_knobs import ray_cache_budgets, ray_http_headers, ray_setup_attempts
from agent.ops.ray_token import ray_token, read_token_file
from agent.ops.startup import MAX_UNIX_PATH_BYTES

log = logging.getLogger(__name__)

SOCKET_PREFIX = "agent-"  # <root>/agent-<node>.sock: one socket per node sharing the root
NODE_CHARS = 16  # of the node id in the socket's name (Ray's are 56 hex digits, random)
SHORT_BASE = "/tmp"  # when even Ray's temp dir is too long for a socket path


def _fits(path: str) -> bool:
    return len(os.fsencode(path)) <= MAX_UNIX_PATH_BYTES


def socket_name(node_id: str) -> str:
    """``agent-<first 16 characters of the node id>.sock``: the gRPC socket's name in the root.
    Per node, so that the agents of several nodes sharing one root do not take each other's
    socket (``parse_flags`` refused a node id that cannot be part of a file name)."""
    return f"{SOCKET_PREFIX}{node_id[:NODE_CHARS]}.sock"


def grpc_address(root: Path, temp_dir: Path, node_id: str) -> str:
    """``unix:<root>/agent-<node>.sock``, or, when that path is over AF_UNIX's limit, the same
    name in a folder of the agent's own under Ray's ``temp_dir`` (else /tmp) named by a hash of
    that path: one node, one socket, one folder (``prepare`` links the path in the root to it)."""
    name = socket_name(node_id)
    path = os.path.abspath(root / name)
    if _fits(path):
        return f"unix:{path}"
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    for base in (temp_dir, Path(SHORT_BASE)):
        short = os.path.join(os.path.abspath(base), f"rtenv-{digest}", name)
        if _fits(short):
            return f"unix:{short}"
    return f"unix:{SHORT_BASE}/rtenv-{digest}/{name}"  # pragma: no cover - /tmp is short


def parent_pid(getppid: Callable[[], int]) -> int:
    """The raylet's pid: our parent, as Ray's own agent watches it. A parent of 1 means the
    raylet that started us is already gone (we were handed to init)."""
    pid = getppid()
    if pid <= 1:
        raise ConfigError(
            "the raylet that started this agent is already gone (the agent's parent is pid "
            f"{pid}); a raylet starts its agent itself"
        )
    return pid


def raylet_pid_note(environ: Mapping[str, str], parent: int) -> str | None:
    """What to log when $RAY_RAYLET_PID names another process than our parent (Ray's own agent
    then counts the raylet gone; this one watches the parent)."""
    text = environ.get("RAY_RAYLET_PID", "").strip()
    if not text or text == str(parent):
        return None
    return (
        f"RAY_RAYLET_PID {echo(text)} is not this agent's parent {parent}; watching the parent, "
        "the process that started the agent"
    )


def agent_root(runtime_env_dir: Path, environ: Mapping[str, str], flag: Path | None = None) -> Path:
    """The root of the agent a raylet starts: ``$RTENV_ROOT``, else ``--root`` (the Ray switch's
    machine-wide root), else ``<runtime-env-dir>/rtenv`` (a config file's root does not apply:
    the node names the place)."""
    named = environ.get("RTENV_ROOT")
    if named:
        return Path(named)
    return flag if flag is not None else default_root(runtime_env_dir)


def default_root(runtime_env_dir: Path) -> Path:
    """The root in Ray's ``runtime_resources``, a session's own, as Ray's agent's cache is."""
    return runtime_env_dir / "rtenv"


def settings_for(
    flags: RayFlags,
    environ: Mapping[str, str],
    read: Callable[[Path], str],
    *,
    home: Callable[[], Path] = Path.home,
    getppid: Callable[[], int] = os.getppid,
) -> Settings:
    """The agent's settings: the options table (RTENV_*, the config file), Ray's flags on top."""
    if environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):  # as Ray reads it
        raise ConfigError(
            "RAY_USE_TLS is on: Ray's TLS mode is not supported by this agent (it reads gcs:// "
            "packages over a plain channel); run Ray's own agent (plain ray start)"
        )
    root = agent_root(flags.runtime_env_dir, environ, flags.root)
    namespace = argparse.Namespace(root=root, parent_pid=None, config=flags.config)
    settings, _ = option_sources.resolve(namespace, environ, read)
    ray = RaySettings(
        host=flags.node_ip_address,
        port=flags.runtime_env_agent_port,
        port_file=flags.port_file,
        token=ray_token(environ, home, read_token_file) if has_token_auth(flags) else None,
        gcs_address=flags.gcs_address,
        cluster_id_hex=flags.cluster_id_hex,
        node_id=flags.node_id,
        log_dir=flags.log_dir,
        named_by="--runtime-env-agent-port",
    )
    GcsConfig(ray.gcs_address, ray.cluster_id_hex, ray.token)  # a token gRPC cannot send
    address = settings.address or grpc_address(settings.root, flags.temp_dir, flags.node_key)
    settings = replace(
        settings,
        address=address,
        allow_remote=True,
        parent_pid=parent_pid(getppid),
        ray=ray,
        kind_budgets=ray_cache_budgets(environ),
        http_headers=ray_http_headers(environ),
        setup_attempts=ray_setup_attempts(environ),
        ray_folders=flags.runtime_env_dir,  # the node's own, whatever the root (a shared one too)
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
            raise ConfigError(
                f"cannot open {echo(name)} for the agent's output: {exc.strerror}"
            ) from exc
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
        if flags.log_dir.exists() and not flags.log_dir.is_dir():
            raise ConfigError(f"--log-dir {echo(str(flags.log_dir))} is a file, not a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        return logging.handlers.RotatingFileHandler(
            path,
            maxBytes=flags.logging_rotate_bytes,
            backupCount=flags.logging_rotate_backup_count,
            encoding="utf-8",
        )
    except OSError as exc:
        raise ConfigError(f"cannot write the log file {echo(str(path))}: {exc.strerror}") from exc


@dataclass
class Prepared:
    """The agent's settings, and what ``prepare`` made that the agent's exit removes."""

    settings: Settings
    made_folder: Path | None = None  # the socket's folder, when this agent made it
    link: Path | None = None  # <root>/agent-<node>.sock, pointing at the short socket

    def cleanup(self) -> None:
        """After the agent stopped: its link, its socket and the folder it made (if empty)."""
        address = self.settings.address.removeprefix("unix:")
        if self.link is not None:
            with contextlib.suppress(OSError):
                if os.readlink(self.link) == address:
                    self.link.unlink()
        if self.made_folder is not None:
            with contextlib.suppress(OSError):
                if Path(address).is_socket():
                    os.unlink(address)
                self.made_folder.rmdir()


def claim_socket_folder(folder: Path) -> bool:
    """Make ``folder`` (mode 0700) for the agent's socket; True when made here. One that exists
    is used only when it is a folder of this user's, mode 0700 (its name is predictable: someone
    else's could hold their own socket)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(
            f"cannot make the socket folder {echo(str(folder))}: {exc.strerror or exc}"
        ) from exc
    else:
        os.chmod(folder, 0o700)  # whatever the umask
        return True
    info = os.lstat(folder)
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.geteuid()
        or stat.S_IMODE(info.st_mode) != 0o700
    ):
        raise ConfigError(
            f"the socket folder {echo(str(folder))} is not a folder of this user's with mode "
            "0700 (someone else may have made it); remove it, or set RTENV_ADDRESS"
        )
    return False


def _link(link: Path, target: str) -> None:
    """``link`` -> ``target``, replacing what is there (a link of an earlier agent)."""
    temp = link.with_name(f".{link.name}.{os.getpid()}.link")
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        os.symlink(target, temp)
        os.replace(temp, link)
    except OSError as exc:
        raise ConfigError(
            f"cannot link {echo(str(link))} to the agent's socket: {exc.strerror or exc}"
        ) from exc


def prepare(
    argv: Sequence[str], environ: Mapping[str, str], *, getppid: Callable[[], int] = os.getppid
) -> Prepared:
    """Parse, redirect the output, resolve the settings, set up logging (a thread writes the
    log: ``logs.shutdown()`` at exit) and the short socket's folder, in that order (a mistake
    after the redirect lands where Ray's user reads the agent's stderr). Raises Refused,
    AgentError or ValueError for a mistake; ``Prepared.cleanup()`` after the agent stops."""
    flags = parse_flags(argv)
    redirect_std(flags)
    # the home folder looked up when needed, not before: Path.home() raises without one
    settings = settings_for(
        flags, environ, lambda p: p.read_text(), home=lambda: Path.home(), getppid=getppid
    )
    text_format = flags.logging_format if settings.log_format == "text" else None
    logs.configure(
        settings.log_level,
        settings.log_format,
        handler=log_handler(flags),
        text_format=text_format,
        threaded=True,
    )
    if flags.unknown:
        unknown = echo(" ".join(flags.unknown), 500)
        log.warning(
            "ignoring flags this agent does not know: %s", unknown, extra={"flags": unknown}
        )
    if (note := raylet_pid_note(environ, settings.parent_pid or 0)) is not None:
        log.warning("%s", note, extra={"parent_pid": settings.parent_pid})
    prepared = Prepared(settings)
    if not has_token_auth(flags) and environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
        log.warning(
            "RAY_AUTH_MODE=token is ignored: Ray %s has no token auth (2.52 and later have)",
            flags.ray_version,
            extra={"ray_version": flags.ray_version},
        )
    in_root = settings.root / socket_name(flags.node_key)
    short = grpc_address(settings.root, flags.temp_dir, flags.node_key)
    if settings.address == short != f"unix:{os.path.abspath(in_root)}":  # too long: ours
        socket_path = Path(settings.address.removeprefix("unix:"))
        if claim_socket_folder(socket_path.parent):
            prepared.made_folder = socket_path.parent
        link = in_root
        _link(link, str(socket_path))
        prepared.link = link
    log.info(
        "Ray node %s: Ray door on %s:%d, port file %s, root %s, raylet pid %s",
        flags.node_key,
        flags.node_ip_address,
        flags.runtime_env_agent_port,
        flags.port_file,
        settings.root,
        settings.parent_pid,
        extra={
            "node_id": flags.node_id,
            "ray_address": f"{flags.node_ip_address}:{flags.runtime_env_agent_port}",
            "port_file": str(flags.port_file or ""),
            "root": str(settings.root),
            "parent_pid": settings.parent_pid,
        },
    )
    return prepared
