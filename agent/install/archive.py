"""Safe zip extraction, in three steps that several processes can share (``unpack_pool.py``):
``plan_zip`` (every check the central directory allows, pure but for what ``zipfile`` read),
``write_share`` (one share of the files and folders, ``shares`` splitting them by work), and
``finish`` (the links, then the final modes), once every share is written. ``extract_zip`` runs
the three in one call. Synchronous: run in a worker process or a thread.

What is refused (``UnsafeArchive``, FAILED_PRECONDITION), before a byte is written where it can be
known from the central directory, and while writing where it cannot:

- not a zip, a corrupt or encrypted one, an entry of an unsupported kind (device, fifo);
- more entries than ``max_entries``; more declared or written bytes than
  ``max_uncompressed_bytes``; a total uncompressed size over ``max_ratio`` times the archive's;
- a name that is absolute, has a drive letter, a NUL byte, or a ``..`` component;
- a symlink whose target is absolute or resolves outside the destination, checked lexically
  before it is made and with ``realpath`` after. Symlinks are made last, after every regular
  file and directory, so no entry is ever written through one.

``strip_top_level`` (working_dir): when every entry lies under one top-level folder, that folder
is dropped, as Ray does, so ``proj/main.py`` lands at ``<dest>/main.py``.

Modes are the agent's, not the archive's nor the umask's (``modes.py``: a file 0644, or 0755 if
the entry has any execute bit; a folder 0755). The tree is built private (0700 at its top, files
created 0600) and opened up deepest first once complete.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import struct
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agent.core.errors import UnsafeArchive, echo
from agent.install import inflate
from agent.install.modes import (
    DIR_MODE,
    file_mode,
    harden_tree,
    modes_settable,
    refused_unless_disk_full,
)

_CHUNK = 1024 * 1024
_MAX_SYMLINK_TARGET = 4096
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int = 100_000
    max_uncompressed_bytes: int = 16 * 1024**3
    max_ratio: float = 200.0  # uncompressed bytes per archive byte; zip bombs reach thousands
    ratio_floor_bytes: int = 16 * 1024**2  # below this output size the ratio is harmless


@dataclass(frozen=True)
class _Entry:
    info: zipfile.ZipInfo
    parts: tuple[str, ...]  # where it goes, relative to the destination (top folder stripped)
    kind: str  # "file", "dir" or "symlink"

    @property
    def rel(self) -> PurePosixPath:
        return PurePosixPath(*self.parts)


@dataclass(frozen=True)
class Plan:
    """What an archive unpacks to, every check that the central directory allows made: the
    entries in archive order (a name given twice: its last entry only, as writing them in
    order left it), the folders they need (shallowest first) and the links, made last."""

    entries: tuple[_Entry, ...]  # files and folders
    links: tuple[_Entry, ...]
    dirs: tuple[tuple[str, ...], ...]  # every folder of the tree but its top, shallowest first
    declared: int  # bytes the central directory says it unpacks to


Halted = Callable[[], bool]  # true once the extraction must stop (its install was cancelled)


class Stopped(Exception):
    """The extraction was told to stop (its install was cancelled): not an error of the
    archive; whoever stopped it has gone on with its own cancellation."""


def extract_zip(
    archive: Path,
    dest: Path,
    *,
    strip_top_level: bool,
    limits: ArchiveLimits,
    label: str,
    stop: threading.Event | None = None,
) -> int:
    """Extract ``archive`` into the new directory ``dest``; return the bytes written.

    ``label`` names the package in errors (its URI, already cut: ``UriKey.label``). On error
    ``dest`` may hold a partial tree: the caller extracts into a staging directory and removes
    it. ``stop``, once set, ends the extraction (``Stopped``) at its next entry or chunk, so a
    cancelled install's thread stops writing before its staging folder is removed.

    The same steps as the unpack pool's workers take (``unpack_worker``), in one call: plan,
    write every entry (one share), finish (links, then the final modes).
    """
    halted = (stop or threading.Event()).is_set
    with opened_zip(archive, label) as zf:
        plan = plan_zip(zf, archive.stat().st_size, strip_top_level, limits, label)
        dest.mkdir(mode=0o700, parents=True)  # 0700 or tighter, whatever the umask
        root = dest.resolve()
        written = write_share(zf, plan.entries, root, limits.max_uncompressed_bytes, label, halted)
        written += finish(zf, plan, root, label, halted)
    return written


_CORRUPT: tuple[type[Exception], ...] = (zipfile.BadZipFile, EOFError, *inflate.ERRORS)


@contextlib.contextmanager
def opened_zip(archive: Path | io.RawIOBase, label: str) -> Iterator[zipfile.ZipFile]:
    """The archive (a file's path, or a file such as ``growing.GrowingZip``) opened, and
    zipfile's errors met inside the block as ``UnsafeArchive``."""
    try:
        with zipfile.ZipFile(archive) as zf:
            yield zf
    except _CORRUPT as exc:  # a corrupt stream
        raise UnsafeArchive(f"{label} is not a readable zip archive: {echo(str(exc))}") from exc
    except UnicodeDecodeError as exc:  # a local header's name not UTF-8 under the UTF-8 flag
        raise UnsafeArchive(f"{label} is not a readable zip archive: a name is not UTF-8") from exc
    except zipfile.LargeZipFile as exc:
        raise UnsafeArchive(f"{label} needs ZIP64, which is not enabled: {echo(str(exc))}") from exc
    except NotImplementedError as exc:
        raise UnsafeArchive(f"{label} uses an unsupported zip feature: {echo(str(exc))}") from exc
    except RuntimeError as exc:  # zipfile's error for encrypted entries
        raise UnsafeArchive(f"{label} cannot be extracted: {echo(str(exc))}") from exc


def _check(halted: Halted) -> None:
    if halted():
        raise Stopped


def plan_zip(
    zf: zipfile.ZipFile, archive_bytes: int, strip: bool, limits: ArchiveLimits, label: str
) -> Plan:
    """Every check the central directory allows (entry count, declared bytes, ratio, names,
    kinds), and what goes where. No I/O but what ``zf`` read when it was opened."""
    infos = zf.infolist()
    if len(infos) > limits.max_entries:
        raise UnsafeArchive(
            f"{label} has {len(infos)} entries; the limit is {limits.max_entries} (max_entries)"
        )
    declared = sum(info.file_size for info in infos)
    if declared > limits.max_uncompressed_bytes:
        raise UnsafeArchive(
            f"{label} would unpack to {declared} bytes; the limit is "
            f"{limits.max_uncompressed_bytes} (max_uncompressed_bytes)"
        )
    ratio = declared / max(archive_bytes, 1)
    if ratio > limits.max_ratio and declared > limits.ratio_floor_bytes:
        raise UnsafeArchive(
            f"{label} would unpack to {ratio:.0f} times its own size ({declared} bytes from "
            f"{archive_bytes}); the limit is {limits.max_ratio:g} (max_ratio)"
        )
    paths = [(info, _safe_parts(info.filename, label)) for info in infos]
    top = _common_top(paths) if strip else None
    last: dict[tuple[str, ...], int] = {}  # a file named twice: its last entry wins
    entries: list[_Entry] = []
    links: list[_Entry] = []
    for info, parts in paths:
        if top is not None:
            parts = parts[1:]
        if not parts:
            continue  # the stripped top folder itself, or an entry of only "./"
        entry = _Entry(info, parts, _kind(info, label))
        if entry.kind == "symlink":
            links.append(entry)
            continue
        if entry.kind == "file":
            last[parts] = len(entries)
        entries.append(entry)
    kept = tuple(e for n, e in enumerate(entries) if e.kind != "file" or last[e.parts] == n)
    dirs: set[tuple[str, ...]] = set()
    for entry in kept:
        deepest = len(entry.parts) - (entry.kind == "file")
        for depth in range(deepest, 0, -1):
            folder = entry.parts[:depth]
            if folder in dirs:
                break  # and so are its parents
            dirs.add(folder)
    ordered = tuple(sorted(dirs, key=lambda d: (len(d), d)))
    return Plan(kept, tuple(links), ordered, declared)


_ENTRY_NS = 20_000  # what writing one entry costs beyond its bytes (open, close, mode): 4,000
# small files (16 MB) took one worker 0.12 s on this machine, inflating included


def _cost(info: zipfile.ZipInfo) -> float:
    """About how many nanoseconds writing an entry takes: a fixed part, and per byte written
    more the more its stream was compressed (inflating text costs 3-4 times what copying a
    stored or incompressible stream does)."""
    if info.compress_type == zipfile.ZIP_STORED or not info.file_size:
        return _ENTRY_NS + 0.8 * info.file_size
    packed = min(info.compress_size / info.file_size, 1.0)
    return _ENTRY_NS + info.file_size * (1.8 + 6.0 * (1.0 - packed))


def shares(plan: Plan, n: int) -> list[tuple[_Entry, ...]]:
    """The plan's files and folders in ``n`` shares of about equal work (their bytes, weighted
    by how much inflating them costs, and a fixed part per entry: ``_cost``), each in archive
    order (read sequentially). Pure and deterministic: every worker of one extraction computes
    the same shares from the same plan.

    Entries go to shares by folder: the entries of one folder (its files, and the folders made
    in it), in runs of at most ``1 / (2 n)`` of the whole work, each run to one share, so that
    two workers seldom create entries in the same folder at once (the file system serialises
    the creations in one folder: interleaved, 4,000 small files took two workers 0.6 s, split
    by folder 0.37 s). Costliest run first, each to the lightest share so far."""
    costs = [_cost(e.info) for e in plan.entries]
    cap = sum(costs) / (2 * n)
    folders: dict[tuple[str, ...], list[tuple[float, _Entry]]] = {}
    for cost, entry in zip(costs, plan.entries, strict=True):
        folders.setdefault(entry.parts[:-1], []).append((cost, entry))
    runs: list[tuple[float, int, list[_Entry]]] = []
    for items in folders.values():
        run: list[_Entry] = []
        load = 0.0
        for cost, entry in items:
            if run and load + cost > cap:
                runs.append((load, run[0].info.header_offset, run))
                run, load = [], 0.0
            run.append(entry)
            load += cost
        runs.append((load, run[0].info.header_offset, run))
    runs.sort(key=_key)
    loads = [0.0] * n
    picked: list[list[_Entry]] = [[] for _ in range(n)]
    for cost, _, entries in runs:
        k = loads.index(min(loads))
        picked[k].extend(entries)
        loads[k] += cost
    return [tuple(sorted(p, key=lambda e: e.info.header_offset)) for p in picked]


def _key(item: tuple[float, int, list[_Entry]]) -> tuple[float, int]:
    return (-item[0], item[1])


def allowance(plan: Plan, share: tuple[_Entry, ...], n: int, limits: ArchiveLimits) -> int:
    """The most a share may write: its declared bytes and an equal part of the room the limit
    leaves over the whole plan's, so all shares together stay within ``max_uncompressed_bytes``
    whatever their entries' streams hold."""
    own = sum(entry.info.file_size for entry in share)
    return own + (limits.max_uncompressed_bytes - plan.declared) // n


def _safe_parts(name: str, label: str) -> tuple[str, ...]:
    if "\x00" in name:
        raise UnsafeArchive(f"{label}: entry name {echo(name)} contains a NUL byte")
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        raise UnsafeArchive(f"{label}: entry {echo(name)} has an absolute path")
    parts = tuple(p for p in name.replace("\\", "/").split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchive(f"{label}: entry {echo(name)} climbs out of the destination with '..'")
    return parts


def _common_top(paths: list[tuple[zipfile.ZipInfo, tuple[str, ...]]]) -> str | None:
    """The one folder every entry lies under, or None."""
    tops = {parts[0] for _, parts in paths if parts}
    if len(tops) != 1:
        return None
    top = tops.pop()
    for info, parts in paths:
        if len(parts) == 1 and not info.is_dir():
            return None  # a file (or link) named like the folder: nothing to strip
    return top


def _kind(info: zipfile.ZipInfo, label: str) -> str:
    mode = info.external_attr >> 16
    fmt = stat.S_IFMT(mode)
    if info.is_dir() or fmt == stat.S_IFDIR:
        return "dir"
    if fmt == stat.S_IFLNK:
        return "symlink"
    if fmt in (0, stat.S_IFREG):
        return "file"
    raise UnsafeArchive(f"{label}: entry {echo(info.filename)} is a special file (mode {mode:o})")


def write_share(
    zf: zipfile.ZipFile,
    entries: tuple[_Entry, ...],
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
            _check(halted)
            with _unwritable(entry, label):
                _make_dirs(root, entry.parts, made)
    for entry in entries:
        if entry.kind != "file":
            continue
        _check(halted)
        with _unwritable(entry, label):
            _make_dirs(root, entry.parts[:-1], made)
            target = os.path.join(root, *entry.parts)
            written += _copy(zf, entry, target, allowed - written, label, halted)
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


def finish(zf: zipfile.ZipFile | None, plan: Plan, root: Path, label: str, halted: Halted) -> int:
    """After every share is written: the links (each checked before and after it is made, then
    all once more), then the final modes, deepest first: the planned folders (the files have
    theirs), or, when links were made, a walk of the whole tree (``harden_tree``). Returns the
    bytes the links hold. ``zf`` may be None when the plan has no links (the archive is not
    read again)."""
    written = 0
    for entry in plan.links:
        assert zf is not None, "a plan with links is finished from its archive"
        _check(halted)
        with _unwritable(entry, label):
            written += _link(zf, entry, root, label)
    for entry in plan.links:  # a later link can redirect an earlier one: check them all again
        if not _inside(root, Path(os.path.realpath(root.joinpath(*entry.rel.parts)))):
            _unlink_all(root, plan.links)
            raise UnsafeArchive(
                f"{label}: symlink {echo(entry.info.filename)} resolves outside the package "
                "through another link"
            )
    _check(halted)
    if plan.links:
        harden_tree(root, label)
        return written
    with modes_settable(label):
        for folder in reversed(plan.dirs):  # no link in the tree: each path is the folder
            os.chmod(os.path.join(root, *folder), DIR_MODE)
        os.chmod(root, DIR_MODE)
    return written


def _unwritable(entry: _Entry, label: str) -> contextlib.AbstractContextManager[None]:
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
    entry: _Entry,
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
            _check(halted)
            copied += len(chunk)
            if copied > allowance:
                raise _past_allowance(entry, label)
            dst.write(chunk)
        os.fchmod(dst.fileno(), file_mode(entry.info.external_attr >> 16))
    return copied


def _past_allowance(entry: _Entry, label: str) -> UnsafeArchive:
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


def _copy_small(zf: zipfile.ZipFile, entry: _Entry, target: str, allowance: int, label: str) -> int:
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
    zf: zipfile.ZipFile, entry: _Entry, target: str, allowance: int, label: str, halted: Halted
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
            _check(halted)
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


def _link(zf: zipfile.ZipFile, entry: _Entry, root: Path, label: str) -> int:
    name = entry.info.filename
    if entry.info.file_size > _MAX_SYMLINK_TARGET:
        raise UnsafeArchive(f"{label}: symlink {echo(name)} has an oversized target")
    try:
        target = zf.read(entry.info).decode()
    except UnicodeDecodeError as exc:
        raise UnsafeArchive(f"{label}: symlink {echo(name)} has an undecodable target") from exc
    if not target or "\x00" in target or target.startswith("/") or _DRIVE.match(target):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} points to {echo(target)}, outside the package"
        )
    lexical = os.path.normpath(os.path.join(str(entry.rel.parent), target))
    if lexical == ".." or lexical.startswith("../"):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} points to {echo(target)}, outside the package"
        )
    link = root.joinpath(*entry.rel.parts)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not _inside(root, Path(os.path.realpath(link.parent))):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} lies under a link that leaves the package"
        )
    if link.is_symlink() or link.exists():
        raise UnsafeArchive(f"{label}: symlink {echo(name)} collides with another entry")
    os.symlink(target, link)
    if not _inside(root, Path(os.path.realpath(link))):
        link.unlink()
        raise UnsafeArchive(f"{label}: symlink {echo(name)} resolves outside the package")
    return len(target.encode())


def _unlink_all(root: Path, links: tuple[_Entry, ...]) -> None:
    """Leave no way out behind, even in a staging tree: remove the links, shallowest first, and
    only where the link's folder still resolves inside ``root`` (never unlink through a link)."""
    for entry in sorted(links, key=lambda e: len(e.rel.parts)):
        path = root.joinpath(*entry.rel.parts)
        if _inside(root, Path(os.path.realpath(path.parent))):
            path.unlink(missing_ok=True)


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def declared_size(archive: Path) -> int:
    """Bytes a zip says it unpacks to (its central directory); 0 if it is no zip (the extraction
    then says so). Blocking: call it in a thread."""
    try:
        with zipfile.ZipFile(archive) as zf:
            return sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, UnicodeDecodeError):
        return 0  # what zipfile raises on a damaged or unsupported central directory
