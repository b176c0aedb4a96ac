"""How many bytes a project venv's build will add to the root, estimated from its lock before uv
runs, so the disk floor can make room for them (evicting unused packages) or refuse at once.

uv installs a venv from the root's wheel cache by hardlinks (``agent.install.venvs.wheel_cache``):
a wheel already unpacked there adds only links, and one that is not adds about its unpacked size,
once. So the estimate is the sum, over the lock's packages, of one wheel each (the one this
machine and the venv's python take: its tags) not found in the cache:

- a wheel that is a local file (a find-links folder, a path): its exact unpacked size, read from
  its zip's central directory (no byte of it decompressed);
- a wheel the lock gives a ``size`` for (an index's: PyPI gives them): that size times
  ``EXPANSION``, as only its compressed size is known;
- a package the lock gives no size for (an sdist, a git or URL source, no compatible wheel) is
  counted as unknown, and left to the guard that watches the disk while uv runs
  (``agent.install.venvs.disk_guard``).

A wheel counts as in the cache when uv's index of unpacked wheels holds an entry for its name
and version that points at an unpacked wheel still there
(``<cache>/wheels-v*/<source>/.../<name>/<version>-<tags>``, a link into ``archive-v0``): read once
per build, bounded. Should uv change that layout, nothing is found there and the estimate only grows
(every wheel counted): a refusal would then say more than needed, never less.

The lock lists every package of every platform, group and extra; all that this machine's tags
take are counted (``uv sync`` installs the default groups, which are most of them): an upper
bound of what the build adds, but for the few bytes of the venv's own files (its scripts,
``pyvenv.cfg``). ``lock_estimate`` is pure; ``measure_lock`` reads the files it needs.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from agent.core.units import plural

EXPANSION = 3  # installed bytes per byte of a wheel known only by its compressed size: Ray
# 2.60's manylinux wheel (about 70 MB) installs about 200 MB, numpy's and pandas' 2.5x to 4x
_CACHE_SCAN_MAX = 200_000  # names read in the cache's index of wheels, at most
_VERSION = re.compile(r"^(\d[^-]*)-")  # "1.0-py3-none-any", "2.1.3-cp311-cp311-manylinux..."
_NOT_WHEELS = (".lock", ".rev", ".http", ".msgpack")  # uv's notes beside an unpacked wheel

Pin = tuple[str, str]  # a distribution's canonical name and its version


@dataclass(frozen=True, slots=True)
class Estimate:
    """The bytes a build adds to the root, and what they were counted from."""

    bytes_: int
    counted: int  # wheels counted (not in the cache)
    cached: int  # wheels found in the wheel cache: links only
    unknown: int  # packages the lock says no size of

    def describe(self) -> str:
        """How the figure was made, for a message: '2 wheels not in the root's wheel cache...'."""
        parts = [f"{plural(self.counted, 'wheel')} of its lock not in the root's wheel cache"]
        if self.cached:
            parts.append(f"{self.cached} there already")
        if self.unknown:
            parts.append(f"{plural(self.unknown, 'package')} of unknown size not counted")
        return ", ".join(parts)


def lock_estimate(
    lock: bytes,
    *,
    cached: frozenset[Pin],
    unpacked: Callable[[str], int | None],
    python: str | None,
) -> Estimate:
    """Pure: the estimate of a ``uv.lock`` (its bytes). ``cached``: the (name, version) pairs in
    the wheel cache; ``unpacked(path)``: a local wheel's unpacked bytes (None: unreadable);
    ``python``: the venv's python version ("3.11", "3.11.7"; None: the agent's)."""
    doc = tomllib.loads(lock.decode("utf-8", "replace"))
    supported = _supported(python)
    total = counted = in_cache = unknown = 0
    for package in doc.get("package", []):
        source = package.get("source", {})
        if not isinstance(source, dict) or {"virtual", "editable", "directory"} & set(source):
            continue  # the project itself, or a folder of it: built from its own few files
        pin = (canonicalize_name(str(package.get("name", ""))), str(package.get("version", "")))
        wheel = _pick(package.get("wheels", []), supported)
        if wheel is None:
            unknown += 1
        elif pin in cached:
            in_cache += 1
        else:
            size = _size(wheel, unpacked)
            if size is None:
                unknown += 1
            else:
                total += size
                counted += 1
    return Estimate(total, counted, in_cache, unknown)


def _supported(python: str | None) -> frozenset[Tag]:
    """The tags a venv of ``python`` takes on this machine."""
    version = sys.version_info[:2]
    if python:
        try:
            release = Version(python).release
        except InvalidVersion:
            release = ()
        if len(release) >= 2:
            version = (release[0], release[1])
    return frozenset([*cpython_tags(version), *compatible_tags(version)])


def _pick(wheels: object, supported: frozenset[Tag]) -> dict[str, object] | None:
    """The lock's wheel of a package that this machine's tags take, or None."""
    if not isinstance(wheels, list):
        return None
    for wheel in wheels:
        if not isinstance(wheel, dict):
            continue
        where = str(wheel.get("path") or wheel.get("url") or wheel.get("filename") or "")
        try:
            tags = parse_wheel_filename(where.rsplit("/", 1)[-1])[3]
        except InvalidWheelFilename:
            continue
        if tags & supported:
            return wheel
    return None


def _size(wheel: dict[str, object], unpacked: Callable[[str], int | None]) -> int | None:
    path = wheel.get("path")
    if isinstance(path, str):
        found = unpacked(path)
        if found is not None:
            return found
    size = wheel.get("size")
    if isinstance(size, int) and size >= 0:
        return size * EXPANSION
    return None


def measure_lock(lock: bytes, *, project: Path, cache: Path | None, python: str | None) -> Estimate:
    """``lock_estimate`` with what it reads: the cache's index of wheels, and each local wheel's
    central directory (a path relative to ``project`` as uv reads it). Blocking: a thread."""
    return lock_estimate(
        lock,
        cached=frozenset() if cache is None else cached_pins(cache),
        unpacked=lambda path: unpacked_bytes(project / path),
        python=python,
    )


def unpacked_bytes(wheel: Path) -> int | None:
    """The bytes a wheel's files take unpacked, from its central directory; None if it cannot
    be read as a zip. Blocking."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return sum(info.file_size for info in zf.infolist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return None


def cached_pins(cache: Path, limit: int = _CACHE_SCAN_MAX) -> frozenset[Pin]:
    """The (name, version) pairs uv's index of unpacked wheels holds under ``cache`` (its
    ``wheels-v*`` folders, at most ``limit`` names read; links not followed). Blocking."""
    found: set[Pin] = set()
    read = 0
    for top in _wheel_indexes(cache):
        for dirpath, dirnames, filenames in os.walk(top):
            depth = len(Path(dirpath).relative_to(top).parts)
            if depth >= 4:
                dirnames.clear()
            read += len(dirnames) + len(filenames)
            if read > limit:
                return frozenset(found)
            if depth >= 2:
                name = canonicalize_name(os.path.basename(dirpath))
                for entry in [*dirnames, *filenames]:
                    version = _unpacked_version(dirpath, entry)
                    if version is not None:
                        found.add((name, version))
    return frozenset(found)


def _wheel_indexes(cache: Path) -> list[Path]:
    try:
        return sorted(p for p in cache.iterdir() if p.name.startswith("wheels-v") and p.is_dir())
    except OSError:
        return []


def _unpacked_version(folder: str, entry: str) -> str | None:
    """The version an entry of uv's index names, if it points at an unpacked wheel that is
    there (``1.0-py3-none-any``, a link into ``archive-v0``; not its ``.lock`` nor ``.rev``)."""
    match = _VERSION.match(entry)
    if match is None or entry.endswith(_NOT_WHEELS) or not os.path.exists(f"{folder}/{entry}"):
        return None
    return match.group(1)
