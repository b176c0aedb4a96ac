"""The plan of a zip extraction: every check its central directory allows, made before a byte
is written, and what goes where.

``opened_zip`` opens an archive and words zipfile's errors as ``UnsafeArchive``; ``plan_zip``
refuses more entries than ``max_entries``, more declared bytes than ``max_uncompressed_bytes``,
a total over ``max_ratio`` times the archive's size, a name that is absolute, has a drive letter,
a NUL byte or a ``..`` component, and an entry of an unsupported kind (device, fifo); it drops a
working dir's single top-level folder (``strip``, as Ray does) and keeps, of a name given twice,
its last entry. ``declared_size`` reads what a zip says it unpacks to. Pure but for what
``zipfile`` reads: the same plan in every process that extracts one archive.
"""

from __future__ import annotations

import contextlib
import io
import re
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agent.core.errors import UnsafeArchive, echo
from agent.install.unpack import inflate

DRIVE = re.compile(r"^[A-Za-z]:")  # a Windows drive letter: an absolute name


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int = 100_000
    max_uncompressed_bytes: int = 16 * 1024**3
    max_ratio: float = 200.0  # uncompressed bytes per archive byte; zip bombs reach thousands
    ratio_floor_bytes: int = 16 * 1024**2  # below this output size the ratio is harmless


@dataclass(frozen=True)
class Entry:
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

    entries: tuple[Entry, ...]  # files and folders
    links: tuple[Entry, ...]
    dirs: tuple[tuple[str, ...], ...]  # every folder of the tree but its top, shallowest first
    declared: int  # bytes the central directory says it unpacks to


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
    entries: list[Entry] = []
    links: list[Entry] = []
    for info, parts in paths:
        if top is not None:
            parts = parts[1:]
        if not parts:
            continue  # the stripped top folder itself, or an entry of only "./"
        entry = Entry(info, parts, _kind(info, label))
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


def _safe_parts(name: str, label: str) -> tuple[str, ...]:
    if "\x00" in name:
        raise UnsafeArchive(f"{label}: entry name {echo(name)} contains a NUL byte")
    if name.startswith(("/", "\\")) or DRIVE.match(name):
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


def declared_size(archive: Path) -> int:
    """Bytes a zip says it unpacks to (its central directory); 0 if it is no zip (the extraction
    then says so). Blocking: call it in a thread."""
    try:
        with zipfile.ZipFile(archive) as zf:
            return sum(info.file_size for info in zf.infolist())
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, UnicodeDecodeError):
        return 0  # what zipfile raises on a damaged or unsupported central directory
