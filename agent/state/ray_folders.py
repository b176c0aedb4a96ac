"""Ray's folders, as this agent fills them under Ray: ``runtime_resources/working_dir_files``,
``py_modules_files``, ``pip``, ``conda`` (and one per other kind), where Ray's agent keeps its
packages and Ray's tools and tests look (its GC checks list them: non-empty while a package is
cached, empty once it is deleted).

This agent keeps its packages in its root (``<runtime-env-dir>/rtenv/uris/<kind>-<hash>``: one
layout for every door, shared with the index). Under Ray, with the root in Ray's
``runtime_resources`` (the default), each ready package of the agent's view also appears in its
kind's Ray folder as a symlink named as its folder (``FOLDERS``), pointing at it; after each pass
over the index (an install, a release, an eviction) the links are brought in step with the
view: a package evicted, by this agent or another of the root, loses its link. Only symlinks are
ever made or removed there; anything else in those folders is left alone. ``plan`` is pure;
``sync`` is blocking (run in a thread).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.core.uris import UriKind

# each kind's folder in Ray's runtime_resources (Ray's plugin's own folder name)
FOLDERS: dict[UriKind, str] = {
    UriKind.WORKING_DIR: "working_dir_files",
    UriKind.PY_MODULES: "py_modules_files",
    UriKind.RAY_PY_MODULES: "py_modules_files",
    UriKind.PY_MODULES_WHEEL: "py_modules_files",
    UriKind.PIP: "pip",
    UriKind.RAY_PIP: "pip",
    UriKind.UV: "uv",
    UriKind.RAY_UV: "uv",
    UriKind.JAVA_JARS: "java_jars_files",
    UriKind.UV_PROJECT: "uv",
}
# made even when empty: the folders Ray's GC checks list (``conda``: this agent makes none)
ALWAYS = ("working_dir_files", "py_modules_files", "pip", "conda")


def plan(ready: Iterable[tuple[UriKind, Path]]) -> dict[str, dict[str, Path]]:
    """Folder -> link name -> target, for the ready packages (kind, folder). Pure."""
    out: dict[str, dict[str, Path]] = {name: {} for name in ALWAYS}
    for kind, path in ready:
        out.setdefault(FOLDERS.get(kind, "other_files"), {})[path.name] = path
    return out


def sync(base: Path, want: Mapping[str, Mapping[str, Path]]) -> None:
    """Make ``base``'s folders hold exactly ``want``'s links (symlinks only are touched).
    Blocking."""
    for folder, links in want.items():
        where = base / folder
        where.mkdir(mode=0o755, parents=True, exist_ok=True)
        with os.scandir(where) as it:
            present = {e.name: os.readlink(e.path) for e in it if e.is_symlink()}
        for name, points in present.items():
            if name not in links or points != str(links[name]):
                _unlink(where / name)
        for name, target in links.items():
            if present.get(name) != str(target):
                _link(where / name, target)


def _link(link: Path, target: Path) -> None:
    with contextlib.suppress(FileExistsError):  # a file of someone else's by that name: kept
        link.symlink_to(target, target_is_directory=True)


def _unlink(link: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
