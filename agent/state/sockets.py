"""A holder's socket: the unix socket an agent serves on, noted beside its lock
(``<root>/holders/<id>.socket``, the socket's path), so that an agent that died without
stopping (SIGKILL: Ray's raylet ends its agent so) leaves no socket behind: whoever reaps the
holder (``holders.Reaping.done``: a pass of any agent of the root, or the next start's
recovery) removes the socket, the links to it in the root (``<root>/agent-<node>.sock`` when the
socket had to live under a shorter path) and the folder made for it (``rtenv-<hash>``), then
the note. A clean stop removes its own (gRPC its socket, the Ray agent its link and folder, the
holder its note before its lock).

What a note names is removed only if it still is what the dead agent made: a socket of this
user's that nobody listens on (a live agent that took the same path keeps it), a link in the
root pointing at that very path, an empty folder of this user's named ``rtenv-<16 hex>``.
The note is read as hostile input (no link followed, no FIFO waited on, a few KB at most).

Blocking helpers: call them in a thread, or inside a transaction on the index's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import stat
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".socket"
_NOTE_BYTES = 4096  # a socket's path is at most 107 bytes (AF_UNIX); a note is never longer
_FOLDER = re.compile(r"rtenv-[0-9a-f]{16}")  # ``ray_agent.grpc_address``'s short folders
_LINK = re.compile(r"agent-[^/]{1,200}\.sock")


def note_path(root: Path, holder_id: str) -> Path:
    return root / "holders" / f"{holder_id}{SUFFIX}"


def note(root: Path, holder_id: str, socket_path: str, *, bound: bool = False) -> None:
    """Note the socket this holder serves on: before it binds it (a crash after the bind
    leaves a note that names it), and again once ``bound``, with the socket file's device,
    inode and change time (an inode number is reused at once): then only that very file is
    removed, and an agent that took the same path since, caught between its bind and its
    listen, keeps its socket."""
    path = note_path(root, holder_id)
    text = os.path.abspath(socket_path)
    if bound:
        info = os.lstat(socket_path)
        text += f"\n{info.st_dev} {info.st_ino} {info.st_ctime_ns}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, os.fsencode(text))
    finally:
        os.close(fd)


def forget(root: Path, holder_id: str) -> None:
    """A clean stop: the note goes (its socket, link and folder are removed by their makers)."""
    with contextlib.suppress(FileNotFoundError):
        note_path(root, holder_id).unlink()


def noted(root: Path) -> list[str]:
    """The holder ids with a note under the root (alive or not)."""
    try:
        names = os.listdir(root / "holders")
    except FileNotFoundError:
        return []
    return [name.removesuffix(SUFFIX) for name in names if name.endswith(SUFFIX)]


def reap(root: Path, holder_id: str) -> int:
    """A dead holder's socket, the links to it in the root and its folder removed (as the
    module says), then its note; return how many of those were removed. A failure is logged
    and left to the next reaping (the note stays when the socket could not be removed)."""
    path = note_path(root, holder_id)
    noted = _read_note(path)
    removed = 0
    if noted is not None:
        named, ident = noted
        try:
            removed = _remove(root, named, ident)
        except OSError as exc:
            log.warning(
                "cannot remove %s, the socket of a dead agent: %s",
                named,
                exc.strerror or exc,
                extra={"path": named, "error": str(exc.strerror or exc)},
            )
            return 0
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return removed


Ident = tuple[int, int, int]  # a file's st_dev, st_ino, st_ctime_ns
Noted = tuple[str, Ident | None]  # the socket's path, and its file once bound


def _read_note(path: Path) -> Noted | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, _NOTE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    named, _, ident = os.fsdecode(text).partition("\n")
    if not os.path.isabs(named) or "\0" in named:
        return None
    numbers = ident.split()
    if len(numbers) == 3 and all(n.isdigit() for n in numbers):
        return named, (int(numbers[0]), int(numbers[1]), int(numbers[2]))
    return named, None


def _remove(root: Path, named: str, ident: Ident | None) -> int:
    """Remove the socket ``named`` (if it is the file noted, ``ident``, and nobody listens),
    the links to it in the root, and its folder (if it is one of ``rtenv-<16 hex>``, this
    user's and empty)."""
    removed = 0
    try:
        info = os.lstat(named)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid():
        if ident is not None and (info.st_dev, info.st_ino, info.st_ctime_ns) != ident:
            return 0  # another agent's socket at that path since
        if _listened(named):
            return 0  # a live agent took the path since: its socket
        os.unlink(named)
        removed += 1
    for entry in _entries(root):
        if _LINK.fullmatch(entry.name) and entry.is_symlink():
            with contextlib.suppress(OSError):
                if os.readlink(entry.path) == named:
                    os.unlink(entry.path)
                    removed += 1
    folder = os.path.dirname(named)
    if _FOLDER.fullmatch(os.path.basename(folder)) and os.path.realpath(folder) != str(root):
        with contextlib.suppress(OSError):
            meta = os.lstat(folder)
            if stat.S_ISDIR(meta.st_mode) and meta.st_uid == os.geteuid():
                os.rmdir(folder)  # only if empty
                removed += 1
    return removed


def _entries(root: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(root) as entries:
            return list(entries)
    except OSError:
        return []


def _listened(path: str) -> bool:
    """Whether someone listens on the socket: a refused connection says nobody does; any other
    answer (it accepts, or the check fails) keeps it."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True
