"""Start-up checks and preparations of the agent's process: its address, its socket's folder,
the lock that makes it the only agent of its root, and --reset-state. Each refusal is a
StartupError naming what is wrong and what to do."""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import time
from pathlib import Path

import grpc

from agent.errors import AgentError

log = logging.getLogger(__name__)

MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL


class StartupError(AgentError):
    """The agent cannot start as configured (address, root, lock)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


def check_address(address: str, allow_remote: bool) -> str:
    """Validate a listen address before binding; raise a clear error naming what is wrong."""
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise StartupError("the unix socket address names no path")
        size = len(os.fsencode(os.path.abspath(path)))
        if size > MAX_UNIX_PATH_BYTES:
            raise StartupError(
                f"unix socket path {path!r} is {size} bytes; the kernel allows "
                f"{MAX_UNIX_PATH_BYTES} (AF_UNIX sun_path); choose a shorter --root or --address"
            )
        return f"unix:{os.path.abspath(path)}"
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise StartupError(f"address {address!r} is neither unix:PATH nor HOST:PORT")
    bare = host.strip("[]")
    if not allow_remote and not _is_loopback(bare):
        raise StartupError(
            f"address {address!r} is not a loopback address; pass --allow-remote to listen "
            "beyond this node"
        )
    return address


def move_aside(db_path: Path) -> None:
    """--reset-state: keep the old database (and its WAL) beside the new one, never delete it
    nor overwrite one an earlier reset kept."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    suffixes = ("", "-wal", "-shm")
    for n in range(1000):
        name = f"{db_path.name}.reset-{stamp}" + (f"-{n}" if n else "")
        if not any(db_path.with_name(name + s).exists() for s in suffixes):
            break
    else:
        raise StartupError(f"{db_path.parent} holds 1000 kept databases of {stamp}; clear some")
    for suffix in suffixes:
        old = db_path.with_name(db_path.name + suffix)
        if old.exists():
            aside = db_path.with_name(name + suffix)
            os.rename(old, aside)
            log.warning("--reset-state: moved %s to %s", old, aside)


def prepare_socket_path(address: str) -> Path:
    """Make the socket's folder (refusing one others may write to: they could replace the
    socket); remove a stale socket, never a live one (another agent's)."""
    path = Path(address.removeprefix("unix:"))
    make_folders(path.parent, 0o700)
    if path.parent.stat().st_mode & 0o002:
        raise StartupError(
            f"the socket's folder {path.parent} is writable by others, who could replace the "
            "socket; choose a folder only the agent's user may write to"
        )
    if path.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # nobody listens: stale
        else:
            raise StartupError(
                f"unix socket {path} is in use by another process; choose another --address"
            )
        finally:
            probe.close()
    elif path.exists():
        raise StartupError(f"{path} exists and is not a socket; choose another --address")
    return path


def make_folders(path: Path, mode: int) -> None:
    """``mkdir -p`` where every folder made, not only the last, gets ``mode`` (or tighter under
    the umask): a parent left open to others lets them rename the child and put their own."""
    for folder in reversed([p for p in (path, *path.parents) if not p.exists()]):
        folder.mkdir(mode=mode, exist_ok=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def lock_root(root: Path) -> int:
    """Hold an exclusive lock on the root for the agent's lifetime: one agent per root."""
    fd = os.open(root / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StartupError(
            f"another agent (pid {holder}) is serving root {root}; one agent per root"
        ) from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
