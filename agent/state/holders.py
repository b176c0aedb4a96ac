"""Holders: the agents serving one root, each alive exactly while it holds its lock file.

Several agents may serve one root at once (several nodes on one machine). Each is a *holder*
with an id of 32 random hex digits, fresh at every start, and a lock file
``<root>/holders/<id>.lock`` (0600, holding its pid) that it creates and locks exclusively
(``flock``) before it writes anything to the shared index, and keeps locked for its life. The
kernel drops the lock when the process dies, however it dies: so a holder is alive iff its lock
is held, with no timeout and no heartbeat to tune, as package managers keep temporary GC roots.
A holder's descriptors are not inherited by its children (Python opens them non-inheritable),
so an installer that outlives its agent does not keep it alive.

Another process tests a holder with a non-blocking shared lock on a descriptor of its own (a
``flock`` is per open file, so this works within the holder's own process too: it finds itself
alive). Whoever *reaps* a dead holder takes the lock exclusively first, so two reapers never
clean the same holder at once, and removes the file last, while still holding it.

Blocking helpers: call them in a thread (each is a few system calls).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

HOLDERS_DIR = "holders"
_ID = re.compile(r"[0-9a-f]{32}")


def new_holder_id() -> str:
    return secrets.token_hex(16)


def is_holder_id(name: str) -> bool:
    """A holder's id as this module makes them: what a folder under tmp/ or trash/ is named."""
    return _ID.fullmatch(name) is not None


def lock_path(root: Path, holder_id: str) -> Path:
    return root / HOLDERS_DIR / f"{holder_id}.lock"


@dataclass
class HolderLock:
    """This agent's own lock: held from ``take`` to ``release``."""

    root: Path
    holder_id: str
    fd: int

    @classmethod
    def take(cls, root: Path, holder_id: str | None = None) -> HolderLock:
        """Create and lock ``<root>/holders/<id>.lock`` (a fresh id unless one is given). The
        file is made and locked under a name passes ignore, then renamed into place: a pass
        never finds it unlocked (and reaps it) between its creation and its lock."""
        folder = root / HOLDERS_DIR
        folder.mkdir(mode=0o755, exist_ok=True)
        holder_id = holder_id or new_holder_id()
        making = folder / f".{holder_id}.making"
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, str(os.getpid()).encode())
            os.rename(making, lock_path(root, holder_id))
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                making.unlink()
            raise
        return cls(root, holder_id, fd)

    def release(self) -> None:
        """At a clean stop, after the holder's rows are gone: remove the file, then unlock."""
        if self.fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            lock_path(self.root, self.holder_id).unlink()
        os.close(self.fd)
        self.fd = -1


def _open_lock(path: Path) -> int | None:
    """A lock file opened for reading, or None if it is missing or is not a regular file (a
    FIFO or a link put there is no agent's lock: never waited on, never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno in (errno.ELOOP, errno.ENXIO):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def is_alive(root: Path, holder_id: str) -> bool:
    """Whether the holder's lock is held (by a live process); a missing file (or one that is
    not a regular file) is a dead holder."""
    if not is_holder_id(holder_id):  # a name read from the index that is no id: nobody's lock
        return False
    fd = _open_lock(lock_path(root, holder_id))
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the shared lock, if taken
    return False


def holder_pid(root: Path, holder_id: str) -> int | None:
    """The pid a holder wrote in its lock file (for messages and ``info``), if readable. The id
    may be read from the index: one that is no id names no lock file (``../x`` would name one
    outside holders/), and a FIFO or a link there is no lock (an open of a FIFO would block)."""
    if not is_holder_id(holder_id):
        return None
    try:
        fd = _open_lock(lock_path(root, holder_id))
    except OSError:
        return None
    if fd is None:
        return None
    try:
        text = os.read(fd, 32).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return int(text) if text.strip().isdigit() else None
    except ValueError:  # a digit of another script ("²")
        return None


@dataclass
class Reaping:
    """A dead holder's lock, taken exclusively for the time of its reaping."""

    path: Path
    fd: int

    def done(self) -> None:
        """The holder's rows and folders are gone: remove its lock file, then let go."""
        if is_holder_id(self.path.name.removesuffix(".lock")):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self.fd)

    def abandon(self) -> None:
        os.close(self.fd)


def begin_reaping(root: Path, holder_id: str) -> Reaping | None:
    """Take a dead holder's lock exclusively, or None if it is alive or another agent is reaping
    it right now. A missing lock file (reaped already, or a row left by an older agent) is taken
    as a dead holder with nothing to lock."""
    path = lock_path(root, holder_id)
    fd = _open_lock(path) if is_holder_id(holder_id) else None
    if fd is None:
        return Reaping(path, os.open(os.devnull, os.O_RDONLY))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return Reaping(path, fd)


def lock_files(root: Path) -> list[str]:
    """The ids of the holders whose lock files are under the root (alive or not)."""
    folder = root / HOLDERS_DIR
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return [n.removesuffix(".lock") for n in names if n.endswith(".lock") and is_holder_id(n[:-5])]
