"""Plan a ``uv run`` project's environment: read the working dir's project, check it, lock it,
and name the venv by what decides its content.

A create whose ``py_executable`` is a ``uv run`` line the agent builds (``agent.core.uv_run``)
calls ``plan_project`` once its working dir is installed. The project's files are copied into a
scratch folder of the create's (the shared working dir is never written: ``uv lock`` writes
``uv.lock``, a package's build writes beside its sources); unless the line says ``--frozen``
(or ``--no-sync``, which implies it), the agent's uv locks the copy as ``uv run`` would (the
lock kept where it is current; ``--locked`` fails when it is not), offline or not as the
project's settings say. The venv's name hashes the lock's bytes, the line's choices (python,
extras, groups, ``--with``) and, when the project is a package (uv installs it too), the working
dir's URI: two experiments whose folders differ in anything else share one venv.

uv runs here as the installers run it (``agent.install.venvs.build.run_installer``: its own process
group, its output in a log), but with the project's configuration read (``[tool.uv]``,
``uv.toml``), the user's and the system's not (``project_environ``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import InstallerFailed
from agent.core.packages import Package
from agent.core.roots import FileRoots
from agent.core.uris import UriKey, UriKind
from agent.core.uv_project import (
    MAX_SETTINGS_BYTES,
    ProjectRecipe,
    ProjectSettings,
    read_settings,
)
from agent.core.uv_run import Passthrough, UvRun
from agent.install.venvs.build import installer_environ, run_installer

PROJECT = "project"  # the scratch's folder holding the project's files
_NO_CONFIG = "no-config"  # an empty folder: uv's user and system configuration are looked for there
_OWN_FILES = ("pyproject.toml", "uv.lock", "uv.toml", ".python-version")  # copied
_SKIPPED = (".venv", ".git")  # never linked nor copied into the scratch
_MAX_LOCK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Planning:
    """Where a plan runs: the agent's uv, the allowed roots, the logs' folder."""

    uv: str | None
    roots: FileRoots
    logs: Path


def project_environ(scratch: Path) -> dict[str, str]:
    """The installers' environment (no ``UV_*``, no pip configuration), reading the project's
    own uv settings but neither the user's nor the system's."""
    env = installer_environ()
    del env["UV_NO_CONFIG"]
    empty = str(scratch / _NO_CONFIG)
    env["XDG_CONFIG_HOME"] = empty
    env["XDG_CONFIG_DIRS"] = empty
    return env


async def plan_project(
    working_dir: Path, run: UvRun, *, wd_uri: str, planning: Planning, scratch: Path, label: str
) -> Package | Passthrough:
    """The project's venv package, or why the line is left to ``uv run``. ``scratch``: a new
    folder of the create's (made here; the caller removes it when the create is done)."""
    if planning.uv is None:
        return Passthrough("the agent has no uv (install its uv extra, or uv)")
    read = await asyncio.to_thread(_read_project, working_dir, planning.roots)
    if isinstance(read, Passthrough):
        return read
    settings, files = read
    project = scratch / PROJECT
    await asyncio.to_thread(materialize, working_dir, files, project, settings.is_package)
    log_path = planning.logs / f"uvproject-{scratch.name}.log"
    await asyncio.to_thread(planning.logs.mkdir, parents=True, exist_ok=True)
    if run.lock != "frozen":
        python = ["--python", run.python] if run.python else []
        locked = ["--locked"] if run.lock == "locked" else []
        await run_installer(
            [planning.uv, "lock", "--quiet", *locked, *python],
            log_path,
            label,
            scratch,
            cwd=project,
            environ=project_environ(scratch),
        )
        # a lock that succeeded says nothing worth keeping: its log goes (a failure's stays,
        # named in the error), so the logs folder does not grow by one file per create
        await asyncio.to_thread(log_path.unlink, missing_ok=True)
    lock = await asyncio.to_thread(_read_lock, project / "uv.lock", label)
    files = {**files, "uv.lock": lock}
    identity = {
        "v": 1,
        "lock": hashlib.sha256(lock).hexdigest(),
        "run": run.identity(),
        "project": wd_uri if settings.is_package else None,
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    recipe = ProjectRecipe(
        working_dir=str(working_dir),
        files=tuple(sorted(files.items())),
        python=run.python,
        sync_flags=run.sync_flags,
        with_packages=run.with_packages,
        settings=settings,
        digest=hashlib.sha256(text.encode()).hexdigest()[:40],
    )
    return Package(UriKey(UriKind.UV_PROJECT, recipe.uri), recipe)


def _read_project(
    working_dir: Path, roots: FileRoots
) -> tuple[ProjectSettings, dict[str, bytes]] | Passthrough:
    """The project's checked settings and its own files' bytes. Blocking."""
    pyproject = _read(working_dir / "pyproject.toml")
    if pyproject is None:
        return Passthrough("its working_dir has no pyproject.toml (a project uv run would use)")
    settings = read_settings(
        pyproject, _read(working_dir / "uv.toml"), os.path.realpath(working_dir), roots
    )
    if isinstance(settings, Passthrough):
        return settings
    files = {name: data for name in _OWN_FILES if (data := _read(working_dir / name)) is not None}
    return settings, files


def materialize(
    working_dir: Path, files: Mapping[str, bytes], dest: Path, is_package: bool
) -> None:
    """The project as uv is shown it, in ``dest`` (made here): its own files written from
    ``files``; for a package, which uv builds, the rest of the working dir copied; else the rest
    linked, so that a relative find-links or path source is found. The shared working dir is
    never written. Blocking."""
    (dest.parent / _NO_CONFIG).mkdir(parents=True, exist_ok=True)
    skipped = (*_SKIPPED, *_OWN_FILES)
    if is_package:
        shutil.copytree(working_dir, dest, symlinks=True, ignore=shutil.ignore_patterns(*skipped))
    else:
        dest.mkdir()
        for entry in os.scandir(working_dir):
            if entry.name not in skipped:
                os.symlink(entry.path, dest / entry.name)
    for name, data in files.items():
        (dest / name).write_bytes(data)


def _read(path: Path) -> bytes | None:
    """A project file's bytes, or None when there is none. A link is not followed (the
    working dir's files are its own); what is read is bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstallerFailed(f"the working dir's {path.name} cannot be read: {exc}") from exc
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_SETTINGS_BYTES + 1)


def _read_lock(path: Path, label: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        raise InstallerFailed(
            f"{label}: the project has no uv.lock, and uv run --frozen (or --no-sync) does not "
            "make one: run uv lock in the project before the driver starts"
        ) from None
    if len(data) > _MAX_LOCK_BYTES:
        raise InstallerFailed(f"{label}: its uv.lock is over {_MAX_LOCK_BYTES} bytes")
    return data
