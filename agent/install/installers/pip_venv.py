"""The pip and uv kinds: a package is a virtualenv built from a dependency set (``PipSpec``,
``UvSpec``), by pip or uv.

Build it in the staging folder with the installer as a subprocess (``agent.install.venvs.build``),
its output in a log under the root's ``logs/``, from a copy of the files and folders the set names
(``agent.install.venvs.local_read``: their bytes checked against the key's); then rewrite the
staging path to the final one in its scripts, give its files the agent's modes (the installer ran
under the agent's umask) and measure it, in one thread hop.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

from agent.core.packages import Package
from agent.core.pip_spec import PipSpec
from agent.core.roots import NO_ROOTS, FileRoots
from agent.core.uv_spec import UvSpec
from agent.install.disk.modes import harden_tree, make_dir
from agent.install.disk.root import du
from agent.install.disk.staging import through
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.venvs.build import build_venv, relocate
from agent.install.venvs.disk_guard import DiskGuard
from agent.install.venvs.local_read import copy_into
from agent.install.venvs.wheel_cache import pip_installer_for


class PipVenvInstaller:
    def __init__(
        self,
        *,
        python: str,
        installer: str,
        logs: Path,
        uv: str | None = None,
        wheel_cache: Path | None = None,
        roots: FileRoots = NO_ROOTS,
    ) -> None:
        self._python = python
        self._installer = installer  # of pip envs: "pip", or "uv" when there is one
        self._logs = logs
        self._uv = uv
        self._wheel_cache = wheel_cache
        self._roots = roots  # where the sets' local sources may be read

    @classmethod
    def of(cls, tools: InstallTools) -> PipVenvInstaller:
        """The pip kind's: by pip, or by uv from the wheel cache (pip-installer uv, or auto with
        a uv found)."""
        installer = pip_installer_for(tools.pip_installer, tools.uv)
        by_uv = tools.uv is not None and installer == "uv"
        return cls(
            python=tools.python,
            installer=installer,
            logs=tools.logs,
            uv=tools.uv,
            wheel_cache=tools.wheel_cache if by_uv else None,
            roots=tools.file_roots,
        )

    @classmethod
    def of_uv(cls, tools: InstallTools) -> PipVenvInstaller:
        """The uv kind's: always by uv, from the wheel cache."""
        return cls(
            python=tools.python,
            installer="uv",
            logs=tools.logs,
            uv=tools.uv,
            wheel_cache=tools.wheel_cache,
            roots=tools.file_roots,
        )

    def check(self, package: Package, label: str) -> None:
        """Nothing to check again: the places pip reads from were checked when it was parsed."""

    def prepare(self, staging: Path) -> None:
        """The logs folder, made the first time a venv is built; the wheel cache, made private
        (0700 whatever the umask: nobody else may put a file there that uv would link into a
        venv; the venvs' own files get their modes from ``harden_tree``)."""
        make_dir(self._logs)
        if self._wheel_cache is not None:
            self._wheel_cache.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self._wheel_cache, 0o700)

    async def install(self, package: Package, job: InstallJob) -> Installed:
        if not isinstance(package.recipe, PipSpec | UvSpec):
            raise recipe_error(package, "pip or uv")
        spec = package.recipe
        log_path = self._logs / f"{job.final.name}-{uuid.uuid4().hex[:8]}.log"
        sources = await copy_into(
            spec.sources, spec.contents, self._roots, job.staging / "sources", job.label
        )
        venv = await build_venv(
            spec,
            job.staging,
            python=self._python,
            installer=self._installer,
            log_path=log_path,
            label=job.label,
            uv=self._uv,
            cache=self._wheel_cache,
            sources=sources,
            guard=DiskGuard(job.room),  # no estimate ahead: what a set resolves to is unknown
        )
        job.unpacked()
        # through: a cancelled install lets the venv's rewrite end before its staging goes
        finish = asyncio.to_thread(finish_venv, venv, job.final, job.label)
        size = await through(asyncio.ensure_future(finish))
        return Installed(venv, size)


def finish_venv(venv: Path, final: Path, label: str) -> int:
    """Point the venv's scripts at ``final``, harden its modes, return its size. Blocking."""
    relocate(venv, final)
    harden_tree(venv, label)
    return du(venv)
