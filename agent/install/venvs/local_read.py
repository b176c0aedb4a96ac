"""The files and folders a pip or uv set names (``agent.core.local_sources``), read: their bytes'
digests, which key the set's venv, and the copy of them the installer builds from.

Each source is opened once and checked on what was opened (``file_source.open_checked``: a
regular file for a wheel or an sdist, a folder for a project, where it really is under today's
allowed roots). A folder is walked from that descriptor: each entry opened relative to its
folder without following a link (``O_PATH | O_NOFOLLOW``), decided by ``fstat``: a file is
reopened through that descriptor and read, a folder walked, a link kept as a link (its text in
the digest), a FIFO, socket or device refused, never opened for reading. Bounded by what was
read: one env's sources together at most ``MAX_BYTES`` bytes and ``MAX_ENTRIES`` files,
folders and links, folders at most ``MAX_DEPTH`` deep; refused past any, naming the limit.

A file's digest is the SHA-256 of its bytes; a folder's, the SHA-256 of its entries in the
order of their names, each with its kind, its name below the folder, its executable bit and
its bytes' digest (a link: its text); an editable folder's, that of its build files alone
(``BUILD_FILES``, each present or not): its code is read live from the folder, which is what an
editable install means.

``copy_sources`` copies each source but an editable one into the install's staging folder,
hashing what it copies, and refuses one whose bytes are no longer those its key holds (rebuilt
since the create read it): the venv is built from the bytes its key names, from no name read
twice. Blocking: ``read_contents`` and ``copy_into`` run them in a thread, told to stop at the
next chunk when the install is cancelled.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agent.core.errors import DiskExhausted, PackageRejected, echo
from agent.core.local_sources import BUILD_FILES, Form, LocalSource
from agent.core.roots import FileRoots
from agent.install.disk.staging import through
from agent.install.fetch.file_source import Wanted, open_checked

MAX_BYTES = 4 * 1024**3  # read from one env's local sources, all together
MAX_ENTRIES = 10_000  # files, folders and links in one env's local folders, all together
MAX_DEPTH = 64  # folders in a local folder, one inside the other
_CHUNK = 1024 * 1024
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_WHOSE = "pip and uv packages"
_ARCHIVE = Wanted(
    stat.S_IFREG,
    "a wheel or an sdist must be a regular file",
    os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY,
    _WHOSE,
)
_FOLDER = Wanted(
    stat.S_IFDIR,
    "a path not ending in .whl, .tar.gz, .zip (or another archive suffix) names a project folder",
    os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
    _WHOSE,
)
_T = TypeVar("_T")


class _Stopped(Exception):
    """The install was cancelled: the thread stops at its next chunk."""


@dataclass
class _Reading:
    """One env's read of its sources: the label its messages start with, what was read so far
    (bounded), the stop signal, and where the bytes are copied to (None: hashed only)."""

    label: str
    stop: threading.Event
    read: int = 0
    entries: int = 0

    def take(self, size: int) -> None:
        if self.stop.is_set():
            raise _Stopped
        self.read += size
        if self.read > MAX_BYTES:
            raise PackageRejected(
                f"{self.label}: its local sources hold more than {MAX_BYTES} bytes, the most "
                "read for one env; name a wheel of a large project (pip wheel, uv build), or a "
                "folder without its build outputs and venvs"
            )

    def entry(self, where: str, depth: int) -> None:
        self.take(0)
        self.entries += 1
        if self.entries > MAX_ENTRIES or depth > MAX_DEPTH:
            raise PackageRejected(
                f"{self.label}: {echo(where)} takes its local folders past {MAX_ENTRIES} files, "
                f"folders and links, or {MAX_DEPTH} folders deep (the limits for one env); name "
                "a wheel of it (pip wheel, uv build), or a folder without its build outputs and "
                "venvs"
            )


def read_digests(
    sources: Sequence[LocalSource], roots: FileRoots, label: str, stop: threading.Event
) -> tuple[str, ...]:
    """Each source's digest, in order (see the module docstring). Blocking."""
    reading = _Reading(label, stop)
    return tuple(_read(source, roots, reading, None) for source in sources)


def copy_sources(
    sources: Sequence[LocalSource],
    contents: Sequence[str],
    roots: FileRoots,
    dest: Path,
    label: str,
    stop: threading.Event,
) -> list[str]:
    """Copy each source but an editable one into ``dest/<its index>/``, check that its bytes are
    still ``contents``' (an editable one's build files too), and return the installer's
    arguments for them all. Blocking."""
    reading = _Reading(label, stop)
    argv: list[str] = []
    dest.mkdir(mode=0o700)
    for index, (source, content) in enumerate(zip(sources, contents, strict=True)):
        into = dest / str(index)
        into.mkdir(mode=0o700)
        if _read(source, roots, reading, into) != content:
            raise PackageRejected(
                f"{label}: {echo(source.path)} changed since this create read it (rebuilt "
                "meanwhile?); create the env again, once it is written"
            )
        argv += source.argv(str(into / _copy_name(source)))
    return argv


async def read_contents(
    sources: Sequence[LocalSource], roots: FileRoots, label: str
) -> tuple[str, ...]:
    """``read_digests`` in a thread, stopped when the caller is cancelled."""
    return await _in_thread(lambda stop: read_digests(sources, roots, label, stop))


async def copy_into(
    sources: Sequence[LocalSource],
    contents: Sequence[str],
    roots: FileRoots,
    dest: Path,
    label: str,
) -> list[str]:
    """``copy_sources`` in a thread, stopped (and waited for) when the install is cancelled."""
    return await _in_thread(lambda stop: copy_sources(sources, contents, roots, dest, label, stop))


async def _in_thread(call: Callable[[threading.Event], _T]) -> _T:
    stop = threading.Event()
    return await through(asyncio.ensure_future(asyncio.to_thread(call, stop)), stop.set)


def _read(source: LocalSource, roots: FileRoots, reading: _Reading, into: Path | None) -> str:
    """``_source``, its system errors said as the source's (a full disk as such)."""
    try:
        return _source(source, roots, reading, into)
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise DiskExhausted(f"{reading.label}: no space left on the agent's disk") from exc
        raise PackageRejected(
            f"{reading.label}: {echo(source.path)} cannot be read: {exc.strerror or exc}"
        ) from exc


def _source(source: LocalSource, roots: FileRoots, reading: _Reading, into: Path | None) -> str:
    """One source's digest; its copy made in ``into`` (an editable one is never copied)."""
    label = f"{reading.label}: {echo(source.path)}"
    name = _copy_name(source)
    if source.form is Form.ARCHIVE:
        fd, _ = open_checked(source.path, roots, label, _ARCHIVE)
        try:
            out = None if into is None else _create(into / name, 0o644)
            try:
                return _hash_file(fd, reading, out)
            finally:
                if out is not None:
                    os.close(out)
        finally:
            os.close(fd)
    fd, _ = open_checked(source.path, roots, label, _FOLDER)
    digest = hashlib.sha256()
    try:
        if source.form is Form.EDITABLE:
            for build_file in BUILD_FILES:
                _entry(fd, build_file, "", digest, reading, None, 0, walk=False)
            return digest.hexdigest()
        out = None
        if into is not None:
            os.mkdir(into / name, 0o755)
            out = os.open(into / name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _walk(fd, "", digest, reading, out, 1)
        finally:
            if out is not None:
                os.close(out)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _walk(
    folder: int, below: str, digest: hashlib._Hash, reading: _Reading, out: int | None, depth: int
) -> None:
    for name in sorted(os.listdir(folder)):
        _entry(folder, name, below, digest, reading, out, depth, walk=True)


def _entry(
    folder: int,
    name: str,
    below: str,
    digest: hashlib._Hash,
    reading: _Reading,
    out: int | None,
    depth: int,
    *,
    walk: bool,
) -> None:
    """One entry of ``folder`` into the digest (and its copy into ``out``); ``walk``: a folder's
    entries too (else an absent entry is noted as absent: an editable folder's build files)."""
    where = f"{below}{name}"
    reading.entry(where, depth)
    try:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError as exc:
        if walk:  # listed a moment ago
            raise PackageRejected(
                f"{reading.label}: {echo(where)} went away while it was read"
            ) from exc
        _note(digest, b"-", where, b"")
        return
    try:
        info = os.fstat(handle)
        kind = stat.S_IFMT(info.st_mode)
        if kind == stat.S_IFLNK:
            target = os.readlink(name, dir_fd=folder)
            _note(digest, b"l", where, os.fsencode(target))
            if out is not None:
                os.symlink(target, name, dir_fd=out)
        elif kind == stat.S_IFREG:
            executable = bool(info.st_mode & 0o111)
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
            try:
                mode = 0o755 if executable else 0o644
                copy = None if out is None else _create(name, mode, out)
                try:
                    hashed = _hash_file(fd, reading, copy)
                finally:
                    if copy is not None:
                        os.close(copy)
            finally:
                os.close(fd)
            _note(digest, b"x" if executable else b"f", where, hashed.encode())
        elif kind == stat.S_IFDIR and walk:
            _note(digest, b"d", where, b"")
            sub = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            sub_out = None
            try:
                if out is not None:
                    os.mkdir(name, 0o755, dir_fd=out)
                    sub_out = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=out)
                _walk(sub, f"{where}/", digest, reading, sub_out, depth + 1)
            finally:
                os.close(sub)
                if sub_out is not None:
                    os.close(sub_out)
        else:
            what = {stat.S_IFDIR: "a folder"}.get(kind, "a FIFO, socket or device")
            rule = "a project folder holds files, folders and links only"
            raise PackageRejected(
                f"{reading.label}: {echo(where)} is {what}; "
                + (rule if walk else "an editable project's build file must be a file")
            )
    finally:
        os.close(handle)


def _note(digest: hashlib._Hash, kind: bytes, where: str, payload: bytes) -> None:
    """One entry into a folder's digest, each part prefixed by its length: unambiguous."""
    name = os.fsencode(where)
    digest.update(kind + len(name).to_bytes(4, "big") + name)
    digest.update(len(payload).to_bytes(4, "big") + payload)


def _create(name: str | Path, mode: int, folder: int | None = None) -> int:
    """A new file of the copy: ``name``, in the folder ``folder`` if given."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, mode, dir_fd=folder)


def _copy_name(source: LocalSource) -> str:
    """The name of a source's copy: its own (a wheel's names its tags)."""
    return os.path.basename(source.path) or "source"


def _hash_file(fd: int, reading: _Reading, out: int | None) -> str:
    """The SHA-256 of what ``fd`` reads (bounded by the env's reading), copied to ``out``."""
    digest = hashlib.sha256()
    while True:
        reading.take(0)
        data = os.read(fd, _CHUNK)
        if not data:
            return digest.hexdigest()
        reading.take(len(data))
        digest.update(data)
        if out is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
