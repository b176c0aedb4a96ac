"""The uv_project kind: a ``uv run`` project's virtualenv, built by uv from the project's lock.

``uv sync --frozen`` in a copy of the project made in the staging folder from the recipe (its lock
as the planning create locked it: ``agent.install.venvs.project_plan``), into the staging folder's
``venv`` (``UV_PROJECT_ENVIRONMENT``), from the root's wheel cache by hardlinks, as a ``uv`` env is;
``--with``'s packages then by ``uv pip install`` into the same venv, from the
project's find-links and indexes. A package project is installed into it too, not editable (the
venv outlives the copy it was built from); a virtual one only gets its dependencies, as
``uv run`` gives them. Then the staging path is rewritten to the final one and the venv measured,
as ``pip_venv`` does.

Before uv runs, the bytes the venv will add to the root are estimated from the lock
(``agent.install.venvs.estimate``) and reserved on the disk floor (``BuildRoom.reserve``: unused
packages evicted, or a refusal naming the figures before a byte is written); while uv runs, the
floor is watched (``agent.install.venvs.disk_guard``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from agent.core.errors import InstallerFailed
from agent.core.packages import Package
from agent.core.uv_project import ProjectRecipe
from agent.install.disk.modes import make_dir
from agent.install.disk.staging import through
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.installers.pip_venv import finish_venv
from agent.install.venvs.build import run_installer
from agent.install.venvs.disk_guard import DiskGuard
from agent.install.venvs.estimate import measure_lock
from agent.install.venvs.project_plan import PROJECT, materialize, project_environ


class UvProjectInstaller:
    def __init__(self, *, uv: str | None, logs: Path, wheel_cache: Path | None) -> None:
        self._uv = uv
        self._logs = logs
        self._wheel_cache = wheel_cache

    @classmethod
    def of(cls, tools: InstallTools) -> UvProjectInstaller:
        return cls(uv=tools.uv, logs=tools.logs, wheel_cache=tools.wheel_cache)

    def check(self, package: Package, label: str) -> None:
        """Nothing to check again: the project's settings were checked when it was planned."""

    def prepare(self, staging: Path) -> None:
        """The logs folder and the private wheel cache, as ``PipVenvInstaller.prepare``."""
        make_dir(self._logs)
        if self._wheel_cache is not None:
            self._wheel_cache.mkdir(mode=0o700, exist_ok=True)
            self._wheel_cache.chmod(0o700)

    async def install(self, package: Package, job: InstallJob) -> Installed:
        recipe = package.recipe
        if not isinstance(recipe, ProjectRecipe):
            raise recipe_error(package, "uv project")
        if self._uv is None:
            raise InstallerFailed(f"{job.label}: a uv run project needs uv, and there is none")
        scratch = job.staging / "plan"  # the project as uv is shown it, removed with the staging
        await asyncio.to_thread(
            materialize,
            Path(recipe.working_dir),
            dict(recipe.files),
            scratch / PROJECT,
            recipe.settings.is_package,
        )
        estimate = await asyncio.to_thread(
            measure_lock,
            dict(recipe.files).get("uv.lock", b""),
            project=Path(recipe.working_dir),
            cache=self._wheel_cache,
            python=recipe.python,
        )
        await job.room.reserve(estimate.bytes_, f"building its venv ({estimate.describe()})")
        guard = DiskGuard(job.room)
        venv = job.staging / "venv"
        log_path = self._logs / f"{job.final.name}-{uuid.uuid4().hex[:8]}.log"
        cache = [] if self._wheel_cache is None else ["--cache-dir", str(self._wheel_cache)]
        link = ["--link-mode", "hardlink", *cache]
        python = ["--python", recipe.python] if recipe.python else []
        editable = ["--no-editable"] if recipe.settings.is_package else []
        environ = {**project_environ(scratch), "UV_PROJECT_ENVIRONMENT": str(venv)}
        await run_installer(
            [
                self._uv,
                "sync",
                "--frozen",
                "--quiet",
                *link,
                *python,
                *editable,
                *recipe.sync_flags,
            ],
            log_path,
            job.label,
            job.staging,
            cwd=scratch / PROJECT,
            environ=environ,
            guard=guard,
        )
        if recipe.with_packages:
            places = [f"--find-links={v}" for v in recipe.settings.find_links]
            places += [f"--extra-index-url={v}" for v in recipe.settings.index_urls]
            places += ["--no-index"] if recipe.settings.no_index else []
            await run_installer(
                [
                    self._uv,
                    "pip",
                    "install",
                    "--quiet",
                    "--python",
                    str(venv / "bin" / "python"),
                    *link,
                    *places,
                    *recipe.with_packages,
                ],
                log_path,
                job.label,
                job.staging,
                cwd=scratch / PROJECT,
                environ=environ,
                guard=guard,
            )
        job.unpacked()
        finish = asyncio.to_thread(finish_venv, venv, job.final, job.label)
        size = await through(asyncio.ensure_future(finish))
        return Installed(venv, size)
