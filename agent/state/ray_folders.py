"""Ray's folders, as this agent fills them under Ray: ``runtime_resources/working_dir_files``,
``py_modules_files``, ``pip``, ``conda`` (and one per other kind), where Ray's agent keeps its
packages and Ray's tools and tests look (its GC checks list them: non-empty while a package is
cached, empty once it is deleted; its cache tests add up the bytes of their files).

This agent keeps its packages in its root (``ROOT/uris/<kind>-<hash>``: one layout for every
door, shared with the index), wherever the root is: in Ray's session (the default), or shared by
many nodes and clusters (``RTENV_ROOT``, the switch's ``--root``). Under Ray, a package also
appears in its kind's Ray folder (its row's ``ray_folder`` in ``agent.core.kinds``) under its
folder's name: in the folders of files (``TREES``: working dirs, modules, jars) as a tree of hard
links to its files, so that what Ray's tools count there is what is on disk (they skip symlinks)
and no byte is stored twice; in the others (venvs) as a symlink to it. A root on another file
system than Ray's session (no hard link can cross) gets a symlink in the folders of files too.

Which packages: Ray's agent shows in a node's folders what that node fetched, for as long as its
own cache keeps it. So here an entry is *shown* for each ready package an env of this agent used
(``UriEntry.used_here``) while the root keeps it and, where Ray's cache size of its plugin is
set (``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``, the store's kind budgets), while this node's own
share fits it (``shown_here``: at 0, only while in use here, whatever other agents of a shared
root still use). A ready package of the root that this agent never used (another node's,
another cluster's) is not shown: none is made for it, but one found current is kept (a peer
sharing this folder made it, or this folder's agent before a restart) until the root evicts
it. So on a shared root one cluster's folders never show another's packages (Ray's GC checks
wait for them to be empty), and a node's start costs nothing for the root's other packages
(trees for all of them: 2.4 s at every start for 300 packages of 200 files, measured). After
each pass over the index (an install, a release, an eviction) the folders are brought in step;
an eviction by another agent of the root, at this agent's next pass. At the agent's stop
(``clear``) its shown entries go: a tree left in a session's folder would keep the bytes of a
package the root evicts later (a crash leaves them, until an agent mirroring into that folder
sees the package evicted).

Invariants: only entries named as this agent names packages (``OURS``; Ray's own are
``_ray_pkg_*``) or its trees' temporary names are ever made or removed there; anything else is
left alone. A tree appears whole or not at all (built under a temporary name with the builder's
pid, then renamed; a temporary one whose builder is dead is removed), stands for the package it
names (``Mirror`` notes each tree's package folder by device and inode; a tree it did not make,
or made from a folder since replaced, is checked file by file once, and made anew unless its
files are the package's), and shares its files' inodes with the package, never their bytes.
``plan`` and ``shown_here`` are pure; ``Mirror`` is blocking (run in a thread); ``RayFolders`` is
the store's shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from agent.core.kinds import row_of
from agent.core.uris import UriKey, UriKind
from agent.crash import crash_point
from agent.plant import planted
from agent.state.entries import UriEntry, UriState
from agent.state.index import KindBudget

log = logging.getLogger(__name__)

# made even when empty: the folders Ray's GC checks list (``conda``: this agent makes none)
ALWAYS = ("working_dir_files", "py_modules_files", "pip", "conda")
# the folders whose packages appear as trees of hard links (files Ray's tools count)
TREES = frozenset({"working_dir_files", "py_modules_files", "java_jars_files", "other_files"})
# the names this agent gives its packages' folders (``<kind>-<hex>``), and its trees' temporary
# names while they are built (the builder's pid last): the only entries of Ray's folders it ever
# makes or removes
OURS = re.compile(r"[a-z][a-z_]*-[0-9a-f]{8,}")
_BUILDING = re.compile(r"\.rtenv-building-([a-z][a-z_]*-[0-9a-f]{8,})-(\d+)")


class Wanted(NamedTuple):
    """A package of the root, as one Ray folder's entry of its name stands for it."""

    package: Path  # its folder in the root
    shown: bool  # an env of this agent used it: made when missing (else only kept if current)


def plan(view: Iterable[tuple[UriKind, Path, bool]]) -> dict[str, dict[str, Wanted]]:
    """Folder -> entry name -> what it stands for, for the packages (kind, folder, shown) of
    the root this agent's view has. Pure."""
    out: dict[str, dict[str, Wanted]] = {name: {} for name in ALWAYS}
    for kind, path, shown in view:
        out.setdefault(row_of(kind).ray_folder, {})[path.name] = Wanted(path, shown)
    return out


class Mirror:
    """Ray's folders under ``base`` in step with a plan (blocking; thread-safe: a sync whose
    caller was cancelled runs on in its thread, and ``clear`` waits for it)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._lock = threading.Lock()
        self._closed = False  # cleared: no sync any more
        # tree path -> (st_dev, st_ino) of the package folder it was made from or checked
        # against, and the tree's own inode
        self._known: dict[Path, tuple[int, int, int]] = {}
        self._linked: set[Path] = set()  # tree folders' entries made symlinks: no tree could be
        self._shown: set[Path] = set()  # as of the last sync: what ``clear`` removes

    def sync(self, want: Mapping[str, Mapping[str, Wanted]]) -> None:
        """Make ``base``'s folders hold every shown entry of ``want``, and no entry of ours that
        stands for no package of ``want`` (only ``OURS`` touched)."""
        with self._lock:
            if self._closed:
                return
            shown: set[Path] = set()
            for folder, entries in want.items():
                where = self.base / folder
                where.mkdir(mode=0o755, parents=True, exist_ok=True)
                trees = folder in TREES
                with os.scandir(where) as it:
                    present = list(it)
                for entry in present:
                    path, left = Path(entry.path), _left_by_the_dead(entry.name)
                    if not left and OURS.fullmatch(entry.name) is None:
                        continue  # not ours: never touched
                    # a build cut short, an entry this agent showed and no longer does, or one
                    # that stands for no package of the root (or not for the one it names)
                    wanted = entries.get(entry.name)
                    unshown = path in self._shown and not (wanted is not None and wanted.shown)
                    if left or unshown or not self._current(entry, wanted, trees):
                        self._drop(path)
                for name, wanted in entries.items():
                    if wanted.shown:
                        at = where / name
                        if not os.path.lexists(at):
                            self._make(at, wanted.package, trees)
                        shown.add(at)
            self._shown = shown

    def clear(self) -> None:
        """Remove the entries the last sync showed; no sync runs after (the agent stops)."""
        with self._lock:
            self._closed = True
            for path in sorted(self._shown):
                self._drop(path)
            self._shown = set()

    def _current(self, entry: os.DirEntry[str], wanted: Wanted | None, trees: bool) -> bool:
        """Whether ``entry`` stands for the package ``wanted`` names, as it should."""
        if wanted is None:
            return False
        package, path = wanted.package, Path(entry.path)
        try:
            if entry.is_symlink():  # in a folder of trees, only where no tree can be made
                if os.readlink(path) != str(package):
                    return False
                return not trees or path in self._linked or not _linkable(package, path.parent)
            if not trees or not entry.is_dir(follow_symlinks=False):
                return False
            st = package.stat()
            known = (st.st_dev, st.st_ino, entry.stat(follow_symlinks=False).st_ino)
            if self._known.get(path) != known:  # not made by this process, or since: checked
                if _files_of(package) != _files_of(path):
                    return False
                self._known[path] = known
            return True
        except OSError:  # the package gone, or the entry
            return False

    def _make(self, at: Path, package: Path, tree: bool) -> None:
        self._known.pop(at, None)
        self._linked.discard(at)
        if tree:
            try:
                st = package.stat()
                _build_tree(package, at)
                self._known[at] = (st.st_dev, st.st_ino, os.lstat(at).st_ino)
                return
            except OSError as exc:  # no hard links here (another file system?): a symlink
                if os.path.lexists(at):  # a peer sharing this folder made it meanwhile
                    return
                log.warning(
                    "Ray's folder %s: a link instead of a tree (%s)",
                    at,
                    exc,
                    extra={"path": str(at), "error": str(exc)},
                )
                self._linked.add(at)
        with contextlib.suppress(FileExistsError):
            at.symlink_to(package, target_is_directory=True)

    def _drop(self, path: Path) -> None:
        _remove(path)
        self._known.pop(path, None)
        self._linked.discard(path)


def shown_here(
    used: Iterable[tuple[UriKey, int, int, bool]], caps: Sequence[KindBudget]
) -> set[UriKey]:
    """Of the ready packages this agent used (key, bytes, last use, in use here), those its Ray
    folders show: all, but that for each cap (Ray's per-plugin cache size) the unused ones of
    its kinds are left out, least recently used first, until the bytes of its kinds shown fit
    it: the node's own cache as Ray's agent counts it (what is in use counts, and stays), here
    at once, whatever the other agents of a shared root still use. Pure."""
    items = list(used)
    shown = {key for key, _, _, _ in items}
    for cap in caps:
        group = [item for item in items if item[0].kind.value in cap.kinds]
        total = sum(size for _, size, _, _ in group)
        for key, size, _, _ in sorted((i for i in group if not i[3]), key=lambda i: i[2]):
            if total <= cap.budget_bytes:
                break
            shown.discard(key)
            total -= size
    return shown


class RayFolders:
    """The store's shell of ``Mirror``: after each pass, Ray's folders under ``base`` in step
    with the store's view (``entries``: its own table, read on the event loop's thread) and
    Ray's cache sizes (``caps``: the store's kind budgets)."""

    def __init__(
        self, base: Path, entries: Mapping[UriKey, UriEntry], caps: Sequence[KindBudget]
    ) -> None:
        self._mirror = Mirror(base)
        self._entries = entries
        self._caps = caps

    async def sync(self) -> None:
        """The ready packages (and those being taken again: a tree of theirs is kept while they
        are), shown if ``shown_here`` says so."""
        ready = [(k, e) for k, e in self._entries.items() if e.state is UriState.READY]
        used = [(k, e.size, e.last_used_ms, e.held) for k, e in ready if e.used_here]
        shown = shown_here(used, self._caps)
        if planted("rm_ray_tree"):  # the chaos oracle's proof: trees gone while in use
            shown = set()
        view = [
            (key.kind, entry.path, key in shown)
            for key, entry in self._entries.items()
            if entry.state is UriState.READY or entry.was_ready
        ]
        await asyncio.to_thread(self._mirror.sync, plan(view))

    async def clear(self) -> None:
        """At the agent's stop: its shown entries removed (after a sync still running)."""
        await asyncio.to_thread(self._mirror.clear)


def _linkable(package: Path, folder: Path) -> bool:
    """Whether a hard link from ``package``'s files into ``folder`` can be made (one device)."""
    return package.stat().st_dev == folder.stat().st_dev


def _files_of(top: Path) -> dict[str, tuple[object, ...]]:
    """What a tree is, by relative path: each folder, each symlink's target, each file's device
    and inode (a tree of hard links to a package has the package's). Blocking."""
    out: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, top)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", st.st_dev, st.st_ino)
    return out


def _left_by_the_dead(name: str) -> bool:
    """Whether ``name`` is a tree's temporary name whose builder is gone (a crash midway): a
    live builder's is its own (a peer sharing this folder), and this process builds only
    inside a sync, removing its own on failure."""
    match = _BUILDING.fullmatch(name)
    if match is None:
        return False
    pid = int(match.group(2))
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


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
                    crash_point("mid_ray_link")  # a test's: a link made, the tree not in place
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
