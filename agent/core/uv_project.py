"""A ``uv`` project's own settings, read and checked before the agent builds its environment.

The project is the working dir's ``pyproject.toml`` (and a ``uv.toml`` beside it, which uv reads
first). uv honours its ``[tool.uv]`` settings when it builds the project's environment, so the
agent does too, within its rules: every place a setting names to read packages from must be one
the agent may read. A relative path is the project's own when it stays inside the working dir;
any other local path (absolute, ``file:``, or a relative one leading out) must lie in the
allow-file-root folders, as ``pip``'s ``--find-links`` must (``places.check_place``); a remote
index or URL is allowed as it is for ``pip``. A setting that reaches outside is refused, naming
the setting, its value and the rule: PERMISSION_DENIED, as a ``file://`` package outside the
roots is.

Checked: ``find-links``, ``index-url``, ``extra-index-url``, ``index`` (each ``url``), and
``sources`` (``path``, ``url``, ``git``). Refused by name: ``cache-dir`` and
``python-install-dir`` (they would move uv's writes outside the agent's root). Some projects
are not built here (``Passthrough``): a workspace (its members may lie outside the working dir)
and ``managed = false``.

Pure but for ``realpath`` and ``isdir`` of the local paths it names (as ``pip_spec``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo, type_name
from agent.core.places import check_place
from agent.core.roots import FileRoots, within_roots
from agent.core.uv_run import Passthrough

MAX_SETTINGS_BYTES = 1024 * 1024  # a pyproject.toml or uv.toml larger than this is refused
_MAX_PLACES = 100  # find-links, indexes and sources named, together
_REFUSED = {
    "cache-dir": "the agent's wheel cache is the one its venvs are linked from",
    "python-install-dir": "uv would install pythons outside the agent's root",
}


@dataclass(frozen=True, slots=True)
class ProjectSettings:
    """What the agent needs of a checked project."""

    is_package: bool  # uv builds and installs the project itself (else: its dependencies only)
    find_links: tuple[str, ...]  # as written (uv resolves a relative one in the project)
    index_urls: tuple[str, ...]  # index-url, extra-index-url, index.url, as written
    no_index: bool


def read_settings(
    pyproject: bytes, uv_toml: bytes | None, project_dir: str, roots: FileRoots
) -> ProjectSettings | Passthrough:
    """Check a project's settings against the rules (see the module docstring); raise
    ``InvalidRuntimeEnv`` for a file that is not TOML or too large, ``PermissionDenied`` for a
    place outside the rules. ``project_dir``: the working dir's folder (real path)."""
    project = _load(pyproject, "pyproject.toml")
    tool = project.get("tool")
    uv = tool.get("uv") if isinstance(tool, dict) else None
    settings: dict[str, Any] = dict(uv) if isinstance(uv, dict) else {}
    if uv_toml is not None:  # uv reads uv.toml first: its settings win
        settings.update(_load(uv_toml, "uv.toml"))
    if "workspace" in settings:
        return Passthrough("its project is a uv workspace, whose members may lie elsewhere")
    if settings.get("managed") is False:
        return Passthrough("its project says tool.uv.managed = false")
    for name, why in _REFUSED.items():
        if name in settings:
            raise PermissionDenied(f"the project's uv setting {name} is refused: {why}")
    find_links = _strings(settings, "find-links")
    indexes = [*_strings(settings, "index-url"), *_strings(settings, "extra-index-url")]
    for i, index in enumerate(_tables(settings, "index")):
        url = index.get("url")
        if not isinstance(url, str):
            raise InvalidRuntimeEnv(f"the project's uv setting index[{i}] has no url string")
        indexes.append(url)
    places = [(f"find-links {echo(v)}", v, False) for v in find_links]
    places += [(f"index {echo(v)}", v, False) for v in indexes]
    places += list(_source_places(settings))
    if len(places) > _MAX_PLACES:
        raise InvalidRuntimeEnv(
            f"the project names {len(places)} package sources; the limit is {_MAX_PLACES}"
        )
    for where, value, vcs in places:
        _check(where, value, vcs, project_dir, roots)
    build = "build-system" in project
    package = settings.get("package")
    return ProjectSettings(
        is_package=package is True or (build and package is not False),
        find_links=tuple(find_links),
        index_urls=tuple(indexes),
        no_index=settings.get("no-index") is True,
    )


def _load(data: bytes, name: str) -> dict[str, Any]:
    if len(data) > MAX_SETTINGS_BYTES:
        raise InvalidRuntimeEnv(
            f"the working dir's {name} is {len(data)} bytes; the limit is {MAX_SETTINGS_BYTES}"
        )
    try:
        return tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRuntimeEnv(f"the working dir's {name} is not valid TOML: {exc}") from exc


def _strings(settings: Mapping[str, Any], name: str) -> list[str]:
    value = settings.get(name)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise InvalidRuntimeEnv(
            f"the project's uv setting {name} must be strings, got {type_name(value)}"
        )
    return items


def _tables(settings: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = settings.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidRuntimeEnv(f"the project's uv setting {name} must be a list of tables")
    return value


def _source_places(settings: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """Each place a ``sources`` entry reads from: (where, value, is a VCS URL)."""
    sources = settings.get("sources", {})
    if not isinstance(sources, dict):
        raise InvalidRuntimeEnv("the project's uv setting sources must be a table")
    out = []
    for name, entries in sources.items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict):
                raise InvalidRuntimeEnv(f"the project's source for {echo(name)} is not a table")
            for field, vcs in (("path", False), ("url", False), ("git", True)):
                value = entry.get(field)
                if isinstance(value, str):
                    out.append((f"sources.{echo(name, 60)}.{field} {echo(value)}", value, vcs))
    return out


def _check(where: str, value: str, vcs: bool, project_dir: str, roots: FileRoots) -> None:
    """One place: the project's own (a relative path staying inside the working dir), or one
    ``check_place`` allows."""
    if vcs and "+" not in value.partition(":")[0]:
        value = f"git+{value}"  # uv's git = "https://..." is pip's git+https://...
    elif "://" not in value and not value.startswith("file:") and not os.path.isabs(value):
        real = os.path.realpath(os.path.join(project_dir, value))
        if within_roots(real, [project_dir]):
            return
        value = real  # leads out of the working dir: an absolute path, checked as one
    try:
        check_place(value, f"the project's uv setting {where}", roots, vcs=vcs)
    except PermissionDenied as exc:
        raise PermissionDenied(
            f"{exc.message}: the agent builds a uv run project's environment only from "
            "places it may read"
        ) from None


@dataclass(frozen=True, slots=True)
class ProjectRecipe:
    """A ``uv run`` project's environment, as its installer builds it: the project's own files
    (its lock as the planning create locked it), where the rest of its working dir is, the
    ``UvRun``'s choices, the checked settings, and the digest that names it
    (``uvproject://<digest>``). Kept only while its create runs (a record keeps the key)."""

    working_dir: str  # the planning create's working dir (a package's sources are copied from it)
    files: tuple[tuple[str, bytes], ...]  # the project's own files (uv.lock as locked), by name
    python: str | None
    sync_flags: tuple[str, ...]
    with_packages: tuple[str, ...]
    settings: ProjectSettings
    digest: str

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.digest}"


SCHEME = "uvproject://"
