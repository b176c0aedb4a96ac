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

from agent.core.errors import PackageNotFound, PackageRejected, PermissionDenied, echo
from agent.core.roots import FileRoots

__all__ = ["FileRoots", "open_package"]  # FileRoots lived here: its callers may import it here

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


def open_package(path: str, roots: FileRoots, label: str) -> tuple[int, int]:
    """Open the package at ``path`` for reading; return ``(fd, size)``, the size as ``fstat``
    reports it (a hint for reserving space: reads are bounded by what they return, never by
    it). The caller closes ``fd``."""
    if not roots.allow_name(path):  # refused before anything is opened
        raise _outside(label, os.path.normpath(path), roots)
    try:
        handle = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise _open_error(label, exc) from exc
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise PackageRejected(
                f"{label} is {kind}; a package must be a zip file, a regular file"
            )
        if roots:
            opened = os.readlink(f"/proc/self/fd/{handle}")
            if not roots.allow_opened(opened):
                raise _outside(label, opened, roots)
        try:  # the same open file, now for reading: no name is looked up again
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            raise _open_error(label, exc) from exc
    finally:
        os.close(handle)
    reopened = os.fstat(fd)
    if (reopened.st_dev, reopened.st_ino) != (info.st_dev, info.st_ino):  # cannot happen
        os.close(fd)
        raise PackageRejected(f"{label} changed while it was being opened; try again")
    return fd, info.st_size


def _outside(label: str, where: str, roots: FileRoots) -> PermissionDenied:
    return PermissionDenied(
        f"{label}: {echo(where)} is outside the folders file:// packages may come from "
        f"({roots}; the allow-file-root setting)"
    )


def _open_error(label: str, exc: OSError) -> Exception:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return PackageNotFound(f"{label}: no such file on this node")
    return PackageRejected(f"{label}: the agent cannot open it: {exc.strerror or echo(str(exc))}")
