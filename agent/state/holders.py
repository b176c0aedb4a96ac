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

A lock file this agent cannot open (one made by an agent of another user, say a crashed run
under sudo: lock files are 0600) cannot be tested: its holder is taken as alive, so nothing it
may use is reaped, and a warning says once which file it is and what to do.

Blocking helpers: call them in a thread (each is a few system calls).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from agent.state import sockets

log = logging.getLogger(__name__)

HOLDERS_DIR = "holders"
_ID = re.compile(r"[0-9a-f]{32}")
_PID_BYTES = 32  # of a lock file: a pid is at most 20 digits
_MAKING = re.compile(r"\.([0-9a-f]{32})\.making")
# A holder locks its .making file microseconds after creating it: one older than this and
# unlocked was left by a crash (see ``remove_stale_making``).
MAKING_GRACE_S = 60.0
_WARNED_MAX = 256  # paths warned about once each; past that, new ones are not remembered
_warned: set[Path] = set()


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
        sockets.forget(self.root, self.holder_id)  # before the lock: a note without a lock
        with contextlib.suppress(FileNotFoundError):  # is a dead holder's
            lock_path(self.root, self.holder_id).unlink()
        os.close(self.fd)
        self.fd = -1

    def lose(self) -> None:
        """Unlock as the kernel does when the holder's process dies (``kill -9``): the file
        stays, and the holder is dead to every peer that tests it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open_lock(path: Path) -> int | None:
    """A lock file opened for reading, or None if it is missing or is not a regular file (a
    FIFO or a link put there is no agent's lock: never waited on, never followed). A file this
    user may not open raises PermissionError (``liveness`` says: unknown)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno in (errno.ELOOP, errno.ENXIO):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _warn_once(path: Path, error: OSError, message: str, *args: object) -> None:
    """A warning about ``path`` logged once per process (every pass meets it again), with the
    path and the error as fields."""
    if path in _warned:
        return
    if len(_warned) < _WARNED_MAX:
        _warned.add(path)
    log.warning(message, *args, extra={"path": str(path), "error": str(error.strerror or error)})


def _warn_untestable(path: Path, exc: OSError) -> None:
    _warn_once(
        path,
        exc,
        "cannot test whether the holder of %s is alive (%s): an agent run as another user "
        "made it; that holder is taken as alive, so nothing it may use is reaped. If no agent "
        "of that user serves this root any more, remove the file as its owner (or root)",
        path,
        exc.strerror or exc,
    )


def _test_lock(root: Path, holder_id: str) -> bool:
    """Whether the holder's lock is held; PermissionError if its file is not ours to open."""
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


def liveness(root: Path, holder_id: str) -> bool | None:
    """Whether the holder's lock is held (by a live process): None if its lock file cannot be
    opened by this user (unknown). A missing file (or one that is not a regular file) is a
    dead holder. Logs nothing (``info`` shows the unknown)."""
    try:
        return _test_lock(root, holder_id)
    except PermissionError:
        return None


def is_alive(root: Path, holder_id: str) -> bool:
    """Whether a pass must take the holder as alive: its lock is held, or it cannot be tested
    (never reap what cannot be tested; warned of once)."""
    try:
        return _test_lock(root, holder_id)
    except PermissionError as exc:
        _warn_untestable(lock_path(root, holder_id), exc)
        return True


def holder_pid(root: Path, holder_id: str) -> int | None:
    """The pid a holder wrote in its lock file (for messages and ``info``), if readable: read
    as ``_open_lock`` opens (no link followed, no FIFO waited on), at most a few bytes."""
    if not is_holder_id(holder_id):  # a name read from the index: it names no file
        return None
    try:
        fd = _open_lock(lock_path(root, holder_id))
        if fd is None:
            return None
        try:
            text = os.read(fd, _PID_BYTES).decode("ascii", errors="replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    return int(text) if text.strip().isdigit() else None


@dataclass
class Reaping:
    """A dead holder's lock, taken exclusively for the time of its reaping; ``locked`` False:
    its lock file was missing or was not a regular file (``fd`` is then /dev/null's)."""

    path: Path
    fd: int
    locked: bool = True

    def done(self) -> None:
        """The holder's rows and folders are gone: remove its lock file, then let go (the
        descriptor is closed whatever happens; a file that cannot be removed is warned of)."""
        try:
            holder_id = self.path.name.removesuffix(".lock")
            if is_holder_id(holder_id):
                # the socket it served on (a SIGKILL leaves it), then its lock
                sockets.reap(self.path.parent.parent, holder_id)
                _remove_lock(self.path, locked=self.locked)
        finally:
            os.close(self.fd)

    def abandon(self) -> None:
        os.close(self.fd)


def _remove_lock(path: Path, *, locked: bool) -> None:
    """Remove a reaped holder's lock file. Not ``locked``: what is there was found missing or
    not a regular file, and is removed as what it is now (an empty folder, a link, a FIFO); a
    regular file that has appeared since is left to the next pass to test. What cannot be
    removed is warned of, once, and left: the pass goes on."""
    try:
        if locked:
            os.unlink(path)
            return
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            return
        if stat.S_ISDIR(mode):
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        _warn_once(
            path,
            exc,
            "cannot remove %s, the lock file of a dead holder (%s); remove it by hand",
            path,
            exc.strerror or exc,
        )


def begin_reaping(root: Path, holder_id: str) -> Reaping | None:
    """Take a dead holder's lock exclusively, or None if it is alive, cannot be tested (its
    file not ours to open: warned once) or another agent is reaping it right now. A missing
    lock file (reaped already, or a row left by an older agent), or one that is not a regular
    file, is taken as a dead holder with nothing to lock."""
    path = lock_path(root, holder_id)
    try:
        fd = _open_lock(path) if is_holder_id(holder_id) else None
    except PermissionError as exc:
        _warn_untestable(path, exc)
        return None
    if fd is None:
        return Reaping(path, os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), locked=False)
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


def remove_stale_making(root: Path) -> int:
    """Remove the ``holders/.<id>.making`` files a crash left in ``HolderLock.take`` (between
    the file's creation and its rename into place); return how many. A holder locks its file
    right after creating it and keeps the lock through the rename, so a making file whose lock
    can be taken is stale, except in the microseconds between its creation and its lock: one
    modified less than ``MAKING_GRACE_S`` ago is left for a later pass. It is removed while
    locked here, and only if its name still is the file locked. Anything else under such a
    name (a link, a FIFO, a file of another user) is no holder's and is left alone."""
    try:
        names = os.listdir(root / HOLDERS_DIR)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if _MAKING.fullmatch(name) is not None:
            removed += _remove_if_stale(root / HOLDERS_DIR / name)
    return removed


def _remove_if_stale(path: Path) -> int:
    try:
        fd = _open_lock(path)
    except OSError:  # another user's file: not ours to test
        return 0
    if fd is None:
        return 0
    try:
        made = os.fstat(fd)
        if time.time() - made.st_mtime < MAKING_GRACE_S:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its holder is alive, renaming it now
            return 0
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
            return 0
        os.unlink(path)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        _warn_once(
            path, exc, "cannot remove %s, left by a crashed start: %s", path, exc.strerror or exc
        )
        return 0
    finally:
        os.close(fd)  # and with it the lock
    return 1
