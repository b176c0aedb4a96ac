"""Opening a ``file://`` package: check what was opened, not the name that was given.

A name can change between a check and a read (a symlink flipped inside an allowed root), and a
name can denote something that is no package (a FIFO that blocks, ``/dev/zero`` that never ends,
a socket). So the file is opened once, with ``O_PATH`` (which neither blocks on a FIFO nor
triggers a device's open), and everything is decided on that descriptor: its type (``fstat``:
only a regular file is a package) and where it really is (``/proc/self/fd/N``, checked against
the allowed roots). Only then is it reopened for reading through that same descriptor, so the
bytes read are those of the file that was checked. Blocking: call it in a thread.

``FileRoots`` (``agent.core.roots``) holds the allowed roots; its checks are pure string
comparisons.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from agent.core.errors import PackageNotFound, PackageRejected, PermissionDenied, echo
from agent.core.roots import FileRoots

__all__ = [
    "FileRoots",
    "open_checked",
    "open_package",
]  # FileRoots lived here: its callers may import it here

_KINDS = {
    stat.S_IFREG: "a file",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


@dataclass(frozen=True)
class Wanted:
    """What a name must denote to be opened (``open_checked``), and how it is then read."""

    kind: int  # ``stat.S_IFREG`` or ``stat.S_IFDIR``
    rule: str  # said when it is something else: "a package must be a zip file, ..."
    reading: int  # the flags it is reopened with for reading
    whose: str  # whose roots: "file:// packages"


PACKAGE = Wanted(
    stat.S_IFREG,
    "a package must be a zip file, a regular file",
    os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY,
    "file:// packages",
)


def open_package(path: str, roots: FileRoots, label: str) -> tuple[int, int]:
    """Open the package at ``path`` for reading; return ``(fd, size)``, the size as ``fstat``
    reports it (a hint for reserving space: reads are bounded by what they return, never by
    it). The caller closes ``fd``."""
    fd, info = open_checked(path, roots, label, PACKAGE)
    return fd, info.st_size


def open_checked(
    path: str, roots: FileRoots, label: str, wanted: Wanted
) -> tuple[int, os.stat_result]:
    """Open ``path`` as ``wanted`` says, checked on what was opened (its kind, where it really
    is); return the descriptor, open for reading, and its ``fstat``. The caller closes it."""
    if not roots.allow_name(path):  # refused before anything is opened
        raise _outside(label, os.path.normpath(path), roots, wanted)
    try:
        handle = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise _open_error(label, exc) from exc
    try:
        info = os.fstat(handle)
        if stat.S_IFMT(info.st_mode) != wanted.kind:
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise PackageRejected(f"{label} is {kind}; {wanted.rule}")
        if roots:
            opened = os.readlink(f"/proc/self/fd/{handle}")
            if not roots.allow_opened(opened):
                raise _outside(label, opened, roots, wanted)
        try:  # the same open file, now for reading: no name is looked up again
            fd = os.open(f"/proc/self/fd/{handle}", wanted.reading)
        except OSError as exc:
            raise _open_error(label, exc) from exc
    finally:
        os.close(handle)
    reopened = os.fstat(fd)
    if (reopened.st_dev, reopened.st_ino) != (info.st_dev, info.st_ino):  # cannot happen
        os.close(fd)
        raise PackageRejected(f"{label} changed while it was being opened; try again")
    return fd, info


def _outside(label: str, where: str, roots: FileRoots, wanted: Wanted) -> PermissionDenied:
    return PermissionDenied(
        f"{label}: {echo(where)} is outside the folders {wanted.whose} may come from "
        f"({roots}; the allow-file-root setting)"
    )


def _open_error(label: str, exc: OSError) -> Exception:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return PackageNotFound(f"{label}: no such file on this node")
    return PackageRejected(f"{label}: the agent cannot open it: {exc.strerror or echo(str(exc))}")
