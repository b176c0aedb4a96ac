"""Opening a ``file://`` package: check what was opened, not the name that was given.

A name can change between a check and a read (a symlink flipped inside an allowed root), and a
name can denote something that is no package (a FIFO that blocks, ``/dev/zero`` that never ends,
a socket). So the file is opened once, with ``O_PATH`` (which neither blocks on a FIFO nor
triggers a device's open), and everything is decided on that descriptor: its type (``fstat``:
only a regular file is a package) and where it really is (``/proc/self/fd/N``, checked against
the allowed roots). Only then is it reopened for reading through that same descriptor, so the
bytes read are those of the file that was checked. Blocking: call it in a thread.

``FileRoots`` holds the allowed roots; its checks are pure string comparisons.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.errors import PackageNotFound, PackageRejected, PermissionDenied, echo

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


@dataclass(frozen=True)
class FileRoots:
    """The allow-file-root folders, as given (normalized) and as the kernel names them (links
    resolved). Both the name a URI gives and the file opened must lie under one. None: any."""

    given: tuple[str, ...] = ()
    real: tuple[str, ...] = ()

    @classmethod
    def of(cls, roots: Sequence[str]) -> FileRoots:
        """Resolve the roots once, at start (a few system calls)."""
        named = [root for root in roots if root]
        return cls(
            tuple(os.path.normpath(os.path.abspath(root)) for root in named),
            tuple(os.path.realpath(root) for root in named),
        )

    def __bool__(self) -> bool:
        return bool(self.given)

    def allow_name(self, path: str) -> bool:
        """The pure check on a URI's path: no file is looked at (the store repeats it on every
        create naming a cached package). A root configured through a link holds its files."""
        return not self or within_roots(os.path.normpath(path), self.given + self.real)

    def allow_opened(self, real_path: str) -> bool:
        """The check on where an opened file really is."""
        return not self or within_roots(real_path, self.real)

    def __str__(self) -> str:
        return ", ".join(self.given)


def within_roots(path: str, roots: Sequence[str]) -> bool:
    """``path`` (absolute, normalized) is one of ``roots`` or lies under one. ``/`` holds all."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


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
