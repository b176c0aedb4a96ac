"""Writing one share of a plan's files and folders: folders made private (0700), each file
created 0600 and refused if a link stands in its place, its bytes read and inflated a chunk at a
time (or in one call when small), never more than declared nor than the share's allowance, its
CRC-32 checked, then its final mode set (``modes.file_mode``). Several processes may write shares
of one plan at once into one tree. Synchronous: run in a worker process or a thread.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

from agent.core.errors import UnsafeArchive, echo
from agent.crash import crash_point
from agent.install.disk.modes import file_mode, refused_unless_disk_full
from agent.install.unpack import inflate
from agent.install.unpack.plan import Entry
from agent.install.unpack.stop import Halted, stop_if_halted

_CHUNK = 1024 * 1024


def write_share(
    zf: zipfile.ZipFile,
    entries: tuple[Entry, ...],
    root: Path,
    allowed: int,
    label: str,
    halted: Halted,
) -> int:
    """Write one share of a plan's files and folders under ``root`` (folders first, each made
    private), at most ``allowed`` bytes in all; return the bytes written. Shares of one plan
    may be written at once by several processes: a folder made by another is taken as is."""
    written = 0
    made: set[tuple[str, ...]] = set()
    for entry in entries:
        if entry.kind == "dir":
            stop_if_halted(halted)
            with unwritable(entry, label):
                _make_dirs(root, entry.parts, made)
    some = False  # a file was written
    for entry in entries:
        if entry.kind != "file":
            continue
        if some:
            crash_point("mid_extract")
        stop_if_halted(halted)
        with unwritable(entry, label):
            _make_dirs(root, entry.parts[:-1], made)
            target = os.path.join(root, *entry.parts)
            written += _copy(zf, entry, target, allowed - written, label, halted)
        some = True
    return written


def _make_dirs(root: Path, rel: tuple[str, ...], made: set[tuple[str, ...]]) -> None:
    """Make ``rel`` and its missing parents under ``root``, each 0700 (or tighter), shallowest
    first; a folder that exists (made by this share, or by another process's share) is taken
    if it is a folder, not a link or a file."""
    if not rel or rel in made:
        return
    _make_dirs(root, rel[:-1], made)
    path = os.path.join(root, *rel)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise
    made.add(rel)


def unwritable(entry: Entry, label: str) -> contextlib.AbstractContextManager[None]:
    """An entry the file system refuses (it collides with another, its name is too long) is the
    archive's fault: UnsafeArchive. A full disk is not: it passes through to the store."""
    return refused_unless_disk_full(
        lambda exc: UnsafeArchive(
            f"{label}: entry {echo(entry.info.filename)} cannot be written: {exc.strerror} (it "
            "collides with another entry, or its name is not allowed here)"
        )
    )


def _copy(
    zf: zipfile.ZipFile,
    entry: Entry,
    target: str,
    allowance: int,
    label: str,
    halted: Halted,
) -> int:
    info = entry.info
    if _plain(info):
        if info.file_size <= _SMALL and info.compress_size <= _SMALL:
            return _copy_small(zf, entry, target, allowance, label)
        return _copy_stream(zf, entry, target, allowance, label, halted)
    copied = 0  # another method (bzip2, lzma): zipfile's own reader
    with zf.open(entry.info) as src, open(target, "wb", opener=_private) as dst:
        while chunk := src.read(_CHUNK):
            stop_if_halted(halted)
            copied += len(chunk)
            if copied > allowance:
                raise _past_allowance(entry, label)
            dst.write(chunk)
        os.fchmod(dst.fileno(), file_mode(entry.info.external_attr >> 16))
    return copied


def _past_allowance(entry: Entry, label: str) -> UnsafeArchive:
    return UnsafeArchive(
        f"{label}: entry {echo(entry.info.filename)} unpacks to more bytes than declared, past "
        "max_uncompressed_bytes"
    )


_Pread = Callable[[int, int], bytes]  # n bytes at an offset of the archive
_SMALL = 256 * 1024  # an entry this small is read and inflated in one call
_LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)  # type: ignore[attr-defined]
_PLAIN = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_NOT_PLAIN = 0x1 | 0x20 | 0x40  # encrypted, compressed patch data, strong encryption


def _plain(info: zipfile.ZipInfo) -> bool:
    return info.compress_type in _PLAIN and not info.flag_bits & _NOT_PLAIN


def _copy_small(zf: zipfile.ZipFile, entry: Entry, target: str, allowance: int, label: str) -> int:
    """``_copy`` of a small stored or deflated entry without ``ZipExtFile``'s machinery (a
    third of the time thousands of small files took): its local header read and checked as
    ``zipfile`` checks it (its magic, its name the same as the central directory's), its bytes
    read and inflated in one call each, no more than declared, their CRC-32 checked."""
    info = entry.info
    pread = _pread_of(zf)
    name_len, extra_len, utf8 = _local_header(pread, info)
    want = name_len + extra_len + info.compress_size
    rest = pread(want, info.header_offset + _LOCAL_HEADER.size)
    if len(rest) != want:
        raise EOFError
    _same_name(rest[:name_len], utf8, info)
    raw = rest[name_len + extra_len :]
    with open(target, "wb", opener=_private) as dst:
        if info.compress_type == zipfile.ZIP_DEFLATED:
            data = inflate.decompressobj(-15).decompress(raw, info.file_size + 1)
        else:
            data = raw
        if len(data) > allowance:
            raise _past_allowance(entry, label)
        if len(data) != info.file_size or inflate.crc32(data, 0) != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
        dst.write(data)
        os.fchmod(dst.fileno(), file_mode(info.external_attr >> 16))
    return len(data)


def _copy_stream(
    zf: zipfile.ZipFile, entry: Entry, target: str, allowance: int, label: str, halted: Halted
) -> int:
    """``_copy`` of a large stored or deflated entry, as ``_copy_small`` checks one, read and
    inflated a chunk at a time (``inflate``: ISA-L's decoder when installed, 2.5 times zlib's
    speed): never more than ``_CHUNK`` bytes out of one call, never more than declared, the
    CRC-32 checked at the end. Its bytes are read as they arrive (a ``GrowingZip``)."""
    info = entry.info
    pread = _pread_of(zf)
    name_len, extra_len, utf8 = _local_header(pread, info)
    _same_name(pread(name_len, info.header_offset + _LOCAL_HEADER.size), utf8, info)
    pos = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    end = pos + info.compress_size
    decoder = inflate.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
    pending = b""
    copied = crc = 0
    with open(target, "wb", opener=_private) as dst:
        while True:
            stop_if_halted(halted)
            if not pending:
                if pos >= end or (decoder is not None and decoder.eof):
                    break
                pending = pread(min(_CHUNK, end - pos), pos)
                if not pending:
                    raise EOFError
                pos += len(pending)
            if decoder is None:
                data, pending = pending, b""
            else:
                data = decoder.decompress(pending, _CHUNK)
                pending = decoder.unconsumed_tail
            copied += len(data)
            if copied > allowance:
                raise _past_allowance(entry, label)
            if copied > info.file_size:
                break  # more than declared: refused by the size check below
            crc = inflate.crc32(data, crc)
            dst.write(data)
        if copied != info.file_size or crc != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
        os.fchmod(dst.fileno(), file_mode(info.external_attr >> 16))
    return copied


def _local_header(pread: _Pread, info: zipfile.ZipInfo) -> tuple[int, int, bool]:
    """The entry's local header, checked as ``zipfile`` checks it (its magic): the lengths of
    its name and extra field, and whether its name is UTF-8."""
    head = pread(_LOCAL_HEADER.size, info.header_offset)
    if len(head) != _LOCAL_HEADER.size:
        raise zipfile.BadZipFile("Truncated file header")
    fields = _LOCAL_HEADER.unpack(head)
    if fields[0] != zipfile.stringFileHeader:  # type: ignore[attr-defined]
        raise zipfile.BadZipFile("Bad magic number for file header")
    return fields[10], fields[11], bool(fields[3] & 0x800)


def _same_name(raw: bytes, utf8: bool, info: zipfile.ZipInfo) -> None:
    """The local header names the central directory's entry, as ``zipfile`` requires."""
    name = raw.decode("utf-8" if utf8 else "cp437")
    if name != info.orig_filename:
        raise zipfile.BadZipFile(
            f"File name in directory {info.orig_filename!r} and header {name!r} differ."
        )


def _pread_of(zf: zipfile.ZipFile) -> Callable[[int, int], bytes]:
    """How to read ``n`` bytes at an offset of the open archive: its file's own ``pread`` (a
    ``GrowingZip``, which waits for the bytes), else ``os.pread`` on its descriptor."""
    fp = zf.fp
    assert fp is not None  # open for reading
    pread: Callable[[int, int], bytes] | None = getattr(fp, "pread", None)
    if pread is not None:
        return pread
    fd = fp.fileno()
    return lambda n, offset: os.pread(fd, n, offset)


def _private(path: str, flags: int) -> int:
    """Opener for ``open()``: a new file is 0600 (or tighter) until its final mode is set, and a
    link in its place is refused rather than followed."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
