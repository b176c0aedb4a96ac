"""Start-up checks and preparations of the agent's process: its address (well formed, free),
its parent and its python (alive, running), its socket's folder, the root's lock (shared by the
agents that share the root through its index; exclusive for one that needs the root alone), the
root's folders (writable), and --reset-state. Each refusal is a
StartupError naming what is wrong and what to do; the checks that need no root come first, so a
refused start leaves the root untouched."""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from agent.core.errors import StartupError, echo
from agent.core.units import quoted

log = logging.getLogger(__name__)

MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL
ACCEPTED_ADDRESSES = (
    "unix:PATH, HOST:PORT or [IPv6]:PORT, such as unix:/run/rtenv/agent.sock, 127.0.0.1:50051 "
    "or [::1]:50051"
)
ROOT_DIRS = ("uris", "tmp", "trash")
_LOCK_TRIES, _LOCK_RETRY_S = 5, 0.02  # check_root_free holds a shared lock for microseconds
PYTHON_CHECK_S = 30.0  # a python that has not answered by then does not run
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def unix_path(address: str) -> str | None:
    """The absolute path of a ``unix:PATH`` (or ``unix://PATH``) address; None for another
    address. A StartupError when it names no path."""
    if not address.startswith("unix:"):
        return None
    path = address.removeprefix("unix:")
    if path.startswith("//"):
        path = path[2:]
    if not path:
        raise StartupError("the unix socket address names no path")
    return os.path.abspath(path)


def check_address(address: str, allow_remote: bool) -> str:
    """Validate a listen address before binding; raise a clear error naming what is wrong."""
    path = unix_path(address)
    if path is not None:
        size = len(os.fsencode(path))
        if size > MAX_UNIX_PATH_BYTES:
            raise StartupError(
                f"unix socket path {path!r} is {size} bytes; the kernel allows "
                f"{MAX_UNIX_PATH_BYTES} (AF_UNIX sun_path); choose a shorter --root or --address"
            )
        return f"unix:{path}"
    bare = split_host_port(address)[0]
    if not allow_remote and not _is_loopback(bare):
        raise StartupError(
            f"address {quoted(address)} is not a loopback address; pass --allow-remote to listen "
            "beyond this node"
        )
    return address


def split_host_port(address: str) -> tuple[str, int]:
    """(host without brackets, port) of a well-formed HOST:PORT; else a StartupError saying what
    is malformed and showing the accepted forms."""
    host, sep, port = address.rpartition(":")
    problem = ""
    if "://" in address:
        problem = f"{address.split('://')[0]}:// is not a scheme the agent takes"
    elif not sep or not host:
        problem = "it is neither unix:PATH nor HOST:PORT"
    elif not port.isdigit() or int(port) > 65535:
        problem = f"the port {quoted(port)} is not a number from 0 to 65535"
    elif host.startswith("["):
        if not host.endswith("]") or not _is_ipv6(host[1:-1]):
            problem = f"{quoted(host)} is not an IPv6 address in brackets"
    elif ":" in host:
        problem = "an IPv6 address must be written in brackets, as [::1]:50051"
    elif not _HOST_NAME.fullmatch(host):
        problem = f"{quoted(host)} is not a host name or IP address"
    if problem:
        raise StartupError(
            f"address {quoted(address)} is malformed: {problem}; use {ACCEPTED_ADDRESSES}"
        )
    return host.strip("[]"), int(port)


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def check_door_address(flag: str, address: str, allow_remote: bool) -> str:
    """The HOST:PORT of a door beside the gRPC one (``--metrics-address``, the Ray door), checked
    as ``check_address`` checks ``--address``; a refusal names ``flag``."""
    try:
        if address.startswith("unix:"):
            raise StartupError(
                f"address {quoted(address)} is a unix socket; this door takes "
                "HOST:PORT or [IPv6]:PORT"
            )
        return check_address(address, allow_remote)
    except StartupError as exc:
        raise StartupError(f"{flag}: {exc.message}") from None


def check_distinct_ports(doors: Sequence[tuple[str, str]]) -> None:
    """Two doors (flag, checked address) never share a TCP port (0 picks a free one each): the
    second would be refused only after recovery."""
    seen: dict[int, tuple[str, str]] = {}
    for flag, address in doors:
        if address.startswith("unix:"):
            continue
        port = split_host_port(address)[1]
        if port in seen:
            first_flag, first = seen[port]
            raise StartupError(
                f"{flag} {address} and {first_flag} {first} are one port for two doors; give "
                "each its own port (0 picks a free one)"
            )
        if port:
            seen[port] = (flag, address)


def probe_address(address: str, flag: str = "--address") -> None:
    """Before the root is touched: refuse an address another process listens on (a checked
    address: unix:ABSPATH or HOST:PORT, given by ``flag``). The bind itself may still lose a
    race; it is checked again then (``bind_failure`` says it)."""
    if address.startswith("unix:"):
        path = Path(address.removeprefix("unix:"))
        if path.is_socket() and _unix_listener(path):
            raise StartupError(
                f"unix socket {path} is in use by another process; choose another --address"
            )
        if path.exists() and not path.is_socket():
            raise StartupError(f"{path} exists and is not a socket; choose another --address")
        return
    host, port = split_host_port(address)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve {quoted(host)} of {flag}: {exc.strerror}") from exc
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC and aiohttp
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise bind_failure(address, flag, exc) from exc


def bind_failure(address: str, flag: str, exc: OSError) -> StartupError:
    """A bind of ``address`` (given by ``flag``) refused: the address and the reason in words.
    asyncio's own message would show the address as a tuple, ``('127.0.0.1', 18765)``."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = (
        "another process listens there; choose another port (0 picks a free one)"
        if exc.errno == errno.EADDRINUSE
        else f"choose another {flag}"
    )
    named = "" if flag == "--address" else f" ({flag})"
    return StartupError(f"cannot listen on {address}{named}: {reason}; {hint}")


def _unix_listener(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False  # nobody listens: stale
    except OSError:
        return True  # unknown (say, not ours to connect to): never taken over
    finally:
        probe.close()
    return True


def check_parent(pid: int) -> None:
    """--parent-pid must name a live process: an agent whose parent is already gone would serve
    nobody (and exit at once)."""
    if pid <= 0:
        raise StartupError(f"--parent-pid {pid} is not a process id")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise StartupError(
            f"--parent-pid {pid}: no such process (it has already exited); start the agent "
            "from a live parent, or without --parent-pid"
        ) from None
    except PermissionError:
        pass  # alive, another user's


PATH_SHOWN = 1024  # characters of a path named in a start-up error


def check_python(python: str) -> tuple[int, int]:
    """The python workers start with must exist and run Python 3: its (major, minor) version
    (blocking: call in a thread)."""
    setting = f"python {quoted(python, PATH_SHOWN)} (the --python setting)"  # a path: whole
    if shutil.which(python) is None:
        raise StartupError(
            f"{setting} does not exist or is not executable; name a Python 3 interpreter"
        )
    try:
        ran = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PYTHON_CHECK_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StartupError(f"{setting} did not answer within {PYTHON_CHECK_S:g}s") from None
    except OSError as exc:
        raise StartupError(f"{setting} does not run: {exc.strerror or exc}") from exc
    version = ran.stdout.split()
    if ran.returncode != 0 or len(version) != 2 or version[0] != b"3" or not version[1].isdigit():
        said = (ran.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise StartupError(
            f"{setting} does not run as Python 3 (exit {ran.returncode}: {quoted(said)})"
        )
    return 3, int(version[1])


def missing_folders(folders: Sequence[str]) -> list[str]:
    """Those of ``folders`` (the allow-file-root setting) that are not folders now (blocking:
    call in a thread)."""
    return [folder for folder in folders if folder and not os.path.isdir(folder)]


def file_root_warning(folder: str) -> str:
    """The one line said of an allow-file-root folder that does not exist: kept (a file system
    may be mounted there later), but nothing comes from it until then."""
    return (
        f"allow-file-root {quoted(folder, PATH_SHOWN)} is not a folder (yet): kept, as a file "
        "system may be mounted there later; no file:// package comes from it until then"
    )


def check_root_dirs(root: Path) -> None:
    """Make uris/, tmp/ and trash/ and prove the agent can use them as an install does: make a
    folder in tmp/, write in it, rename it into uris/, then into trash/, remove it. A failure
    names the folder and the operation (blocking: call in a thread)."""
    for sub in ROOT_DIRS:
        path = root / sub
        if path.is_symlink() and not path.exists():
            _refuse_root_dir(path, f"it is a symlink to {os.readlink(path)}, which does not exist")
        if path.exists() and not path.is_dir():
            _refuse_root_dir(path, "it exists and is not a folder")
        _root_step(path, "make the folder", path.mkdir, 0o755, False, True)
    name = f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staged, installed, trashed = (root / sub / name for sub in ("tmp", "uris", "trash"))
    try:
        _root_step(root / "tmp", "make a folder in it", staged.mkdir)
        _root_step(root / "tmp", "write a file in it", (staged / "probe").write_bytes, b"probe")
        _root_step(root / "uris", "rename a folder from tmp/ into it", staged.rename, installed)
        _root_step(root / "trash", "rename a folder from uris/ into it", installed.rename, trashed)
        _root_step(root / "trash", "remove a folder in it", shutil.rmtree, trashed)
    finally:
        for leftover in (staged, installed, trashed):
            shutil.rmtree(leftover, ignore_errors=True)


def _root_step(folder: Path, what: str, step: Callable[..., object], *args: object) -> None:
    try:
        step(*args)
    except OSError as exc:
        _refuse_root_dir(folder, f"cannot {what}: {exc.strerror or exc}", exc)


def _refuse_root_dir(folder: Path, why: str, cause: OSError | None = None) -> NoReturn:
    raise StartupError(
        f"{folder} is not usable by the agent: {why}; fix its ownership, permissions or mount, "
        "or choose another --root"
    ) from cause


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
            log.warning(
                "--reset-state: moved %s to %s",
                old,
                aside,
                extra={"path": str(old), "moved_to": str(aside)},
            )


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
        if _unix_listener(path):
            raise StartupError(
                f"unix socket {path} is in use by another process; choose another --address"
            )
        path.unlink(missing_ok=True)  # nobody listens: stale
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


def check_root_free(root: Path, *, alone: bool = False) -> None:
    """Before anything is made: refuse a root an agent serves alone (--no-state-db), or, when
    this agent needs the root ``alone``, any root another agent serves; without creating the
    lock file."""
    try:
        fd = _open_root_lock(root / "agent.lock", os.O_RDONLY)
    except OSError:
        return  # no lock file (or no root yet): lock_root decides
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise _held(fd, root, alone) from exc
    finally:
        os.close(fd)  # and with it the lock


def lock_root(root: Path, *, alone: bool = False) -> int:
    """Hold a lock on the root for the agent's lifetime: shared by the agents that share the
    root through its index, exclusive for one that needs it ``alone`` (--no-state-db, which
    keeps its index in memory; --reset-state, until ``share_root``)."""
    fd = _open_root_lock(root / "agent.lock", os.O_RDWR | os.O_CREAT)
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            break
        except BlockingIOError as exc:
            if attempt + 1 < _LOCK_TRIES:  # outlast another starter's check_root_free
                time.sleep(_LOCK_RETRY_S)
                continue
            error = _held(fd, root, alone)
            os.close(fd)
            raise error from exc
    if alone:  # the pid of the one agent: named when another is refused
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _open_root_lock(path: Path, flags: int) -> int:
    """The root's lock file, opened as hostile input: no link followed (lock_root and
    share_root truncate it: a link would truncate a file outside the root), no FIFO waited on
    (the start would hang); a regular file only, else a StartupError naming it."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _not_a_lock_file(path) from None
        raise
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise _not_a_lock_file(path)
    return fd


def _not_a_lock_file(path: Path) -> StartupError:
    return StartupError(
        f"{echo(str(path))} is not a regular file (a link, a FIFO or a folder put there?), so it "
        "cannot be the root's lock file: remove it, or choose another --root"
    )


def share_root(fd: int) -> None:
    """--reset-state is done: let other agents share the root (exclusive -> shared). Linux
    converts a flock by letting it go and taking the new one: an agent that needs the root
    alone may take it in between, which is refused here rather than waited for."""
    os.ftruncate(fd, 0)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise StartupError(
            "--reset-state is done, but another agent took the root alone meanwhile (one "
            "started with --no-state-db); stop it and start this agent again"
        ) from exc


def _held(fd: int, root: Path, alone: bool) -> StartupError:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
    if alone:
        return StartupError(
            f"other agents serve root {root}, and this start needs it alone (--no-state-db "
            "keeps the index in memory and cannot share a root; --reset-state moves the shared "
            "index aside): stop them first, or choose another --root"
        )
    return StartupError(
        f"an agent (pid {holder or '?'}) holds root {root} alone: one started with "
        "--no-state-db, one finishing --reset-state, or one older than shared roots; stop it "
        "(or wait for the reset), or choose another --root"
    )
