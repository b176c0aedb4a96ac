"""Ray's folders, as this agent fills them under Ray: ``runtime_resources/working_dir_files``,
``py_modules_files``, ``pip``, ``conda`` (and one per other kind), where Ray's agent keeps its
packages and Ray's tools and tests look (its GC checks list them: non-empty while a package is
cached, empty once it is deleted; its cache tests add up the bytes of their files).

This agent keeps its packages in its root (``<runtime-env-dir>/rtenv/uris/<kind>-<hash>``: one
layout for every door, shared with the index). Under Ray, with the root in Ray's
``runtime_resources`` (the default), each ready package of the agent's view also appears in its
kind's Ray folder (its row's ``ray_folder`` in ``agent.core.kinds``) under its folder's name:
in the folders of files (``TREES``: working dirs, modules, jars) as a tree of hard links to
its files, so that what Ray's tools count there is what is on disk (they skip symlinks) and
no byte is stored twice; in the others (venvs) as a symlink to it. After each pass over the
index (an install, a release, an eviction) the folders are brought in step with the view: a
package evicted, by this agent or another of the root, loses its tree or link.

Invariants: only entries named as this agent names packages (``OURS``; Ray's own are
``_ray_pkg_*``) or its trees' temporary names are ever made or removed there; anything else is
left alone. A tree appears whole or not at all (built under a temporary name, then renamed), is
made by this process from the package it names (``Mirror`` remembers each tree's package
folder by device and inode; a tree it did not make, or made from a folder since replaced, is
made anew), and shares its files' inodes with the package, never their bytes. ``plan`` is
pure; ``Mirror.sync`` is blocking (run in a thread).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.core.kinds import row_of
from agent.core.uris import UriKind

log = logging.getLogger(__name__)

# made even when empty: the folders Ray's GC checks list (``conda``: this agent makes none)
ALWAYS = ("working_dir_files", "py_modules_files", "pip", "conda")
# the folders whose packages appear as trees of hard links (files Ray's tools count)
TREES = frozenset({"working_dir_files", "py_modules_files", "java_jars_files", "other_files"})
# the names this agent gives its packages' folders (``<kind>-<hex>``), and its trees' temporary
# names while they are built: the only entries of Ray's folders it ever makes or removes
OURS = re.compile(r"[a-z][a-z_]*-[0-9a-f]{8,}")
_BUILDING = re.compile(r"\.rtenv-building-([a-z][a-z_]*-[0-9a-f]{8,})-\d+")


def plan(ready: Iterable[tuple[UriKind, Path]]) -> dict[str, dict[str, Path]]:
    """Folder -> entry name -> package folder, for the ready packages (kind, folder). Pure."""
    out: dict[str, dict[str, Path]] = {name: {} for name in ALWAYS}
    for kind, path in ready:
        out.setdefault(row_of(kind).ray_folder, {})[path.name] = path
    return out


class Mirror:
    """Ray's folders under ``base`` in step with a plan (blocking; one thread at a time)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        # tree path -> (st_dev, st_ino) of the package folder it was made from, by this process
        self._made: dict[Path, tuple[int, int]] = {}
        self._linked: set[Path] = set()  # tree folders' entries made symlinks: no tree could be

    def sync(self, want: Mapping[str, Mapping[str, Path]]) -> None:
        """Make ``base``'s folders hold exactly ``want``'s entries (only ``OURS`` touched)."""
        for folder, entries in want.items():
            where = self.base / folder
            where.mkdir(mode=0o755, parents=True, exist_ok=True)
            trees = folder in TREES
            with os.scandir(where) as it:
                present = list(it)
            for entry in present:
                # a build this process or one before left, or an entry of ours not as wanted
                building = _BUILDING.fullmatch(entry.name) is not None
                stale = OURS.fullmatch(entry.name) and not self._current(entry, entries, trees)
                if building or stale:
                    _remove(Path(entry.path))
            for name, package in entries.items():
                if not os.path.lexists(where / name):
                    self._make(where / name, package, trees)

    def _current(self, entry: os.DirEntry[str], entries: Mapping[str, Path], trees: bool) -> bool:
        """Whether ``entry`` stands for the package ``entries`` names it after, as wanted."""
        package = entries.get(entry.name)
        if package is None:
            return False
        if entry.is_symlink():  # in a folder of trees, only where no tree could be made
            fallback = Path(entry.path) in self._linked
            return os.readlink(entry.path) == str(package) and (not trees or fallback)
        if not trees or not entry.is_dir(follow_symlinks=False):
            return False
        try:
            st = package.stat()
        except OSError:
            return False
        return self._made.get(Path(entry.path)) == (st.st_dev, st.st_ino)

    def _make(self, at: Path, package: Path, tree: bool) -> None:
        self._made.pop(at, None)
        self._linked.discard(at)
        if tree:
            try:
                st = package.stat()
                _build_tree(package, at)
            except OSError as exc:  # no hard links here (another file system?): a symlink
                log.warning(
                    "Ray's folder %s: a link instead of a tree (%s)",
                    at,
                    exc,
                    extra={"path": str(at), "error": str(exc)},
                )
                self._linked.add(at)
            else:
                self._made[at] = (st.st_dev, st.st_ino)
                return
        with contextlib.suppress(FileExistsError):
            at.symlink_to(package, target_is_directory=True)


def _build_tree(package: Path, at: Path) -> None:
    """``at``: ``package``'s folders made anew and its files hard-linked (symlinks copied as
    symlinks), under a temporary name, then renamed into place. Blocking."""
    building = at.with_name(f".rtenv-building-{at.name}-{os.getpid()}")
    _remove(building)
    try:
        building.mkdir(mode=0o755)
        for top, dirs, files in os.walk(package):
            rel = os.path.relpath(top, package)
            dest = building if rel == "." else building / rel
            for name in dirs:
                src = os.path.join(top, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dest / name)
                else:
                    (dest / name).mkdir(mode=0o755)
            for name in files:
                src = os.path.join(top, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dest / name)
                else:
                    os.link(src, dest / name, follow_symlinks=False)
        os.rename(building, at)
    except BaseException:
        _remove(building)
        raise


def _remove(path: Path) -> None:
    """A tree (its folders are this agent's own, writable), a symlink or a file."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning(
            "Ray's folder: could not remove %s: %s",
            path,
            exc,
            extra={"path": str(path), "error": str(exc)},
        )
