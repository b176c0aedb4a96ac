"""The pip and uv kinds: a package is a virtualenv built from a dependency set (``PipSpec``,
``UvSpec``), by pip or uv.

Build it in the staging folder with the installer as a subprocess (``agent.install.venvs.build``),
its output in a log under the root's ``logs/``, from a copy of the files and folders the set names
(``agent.install.venvs.local_read``: their bytes checked against the key's); then rewrite the
staging path to the final one in its scripts, give its files the agent's modes (the installer ran
under the agent's umask) and measure it, in one thread hop.

A uv set whose ``uv_version`` the agent's uv does not satisfy is built by the uv that does: the
env's ``UriKind.UV_TOOL`` package (``agent.core.uv_tool``), installed before this venv
(``agent.app.ensures``), its ``bin/uv`` run as the agent's would be, with the same flags. An
older uv may not take them all (nor the env's own options): its refusal is said as such.
Whichever uv builds it, a set with a ``uv_version`` gets ``uv<uv_version>`` installed into its
venv first, by the agent's uv from the wheel cache (``agent.core.uv_tool.uv_set``), as Ray's.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

from agent.core.errors import InstallerFailed, echo
from agent.core.packages import Package
from agent.core.pip_spec import PipSpec
from agent.core.roots import NO_ROOTS, FileRoots
from agent.core.uris import UriKey, UriKind
from agent.core.uv_spec import UvSpec
from agent.core.uv_tool import UV_BIN, UvTool, uv_set, uv_tool
from agent.install.disk.modes import harden_tree, make_dir
from agent.install.disk.root import du, package_dir
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
        uv_version: str = "",
        root: Path | None = None,
    ) -> None:
        self._python = python
        self._installer = installer  # of pip envs: "pip", or "uv" when there is one
        self._logs = logs
        self._uv = uv
        self._wheel_cache = wheel_cache
        self._roots = roots  # where the sets' local sources may be read
        self._uv_version = uv_version  # what ``uv`` tells: which uv_version needs another uv
        self._root = root  # where that uv is installed, as a package

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
            uv_version=tools.uv_version,
            root=tools.root,
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
        tool = uv_tool(spec, self._uv_version) if isinstance(spec, UvSpec) else None
        uv = self._uv if tool is None else await self._tool_binary(tool, job.label)
        sources = await copy_into(
            spec.sources, spec.contents, self._roots, job.staging / "sources", job.label
        )
        try:
            venv = await build_venv(
                spec,
                job.staging,
                python=self._python,
                installer=self._installer,
                log_path=log_path,
                label=job.label,
                uv=uv,
                cache=self._wheel_cache,
                sources=sources,
                guard=DiskGuard(job.room),  # no estimate ahead: what a set resolves to is unknown
                uv_dist=uv_set(spec) if isinstance(spec, UvSpec) else None,
                agent_uv=self._uv,
            )
        except InstallerFailed as exc:
            if tool is None or not refused_an_option(exc.message):
                raise
            raise InstallerFailed(
                f"{exc.message}\n(this venv is built by the uv of uv.uv_version "
                f"{echo(tool.version)}, {echo(str(uv))}: that uv does not take an option the "
                "agent passes (venv, pip install --python, --link-mode hardlink, --cache-dir, "
                "pip check) or one of the env's uv_pip_install_options; ask for a newer uv, "
                "or leave out the option it lacks)"
            ) from exc
        job.unpacked()
        # through: a cancelled install lets the venv's rewrite end before its staging goes
        finish = asyncio.to_thread(finish_venv, venv, job.final, job.label)
        size = await through(asyncio.ensure_future(finish))
        return Installed(venv, size)

    async def _tool_binary(self, tool: UvTool, label: str) -> str:
        """The ``uv`` of the env's uv package (installed before: ``agent.app.ensures``)."""
        if self._root is None:  # the agent's installers are given the root
            raise AssertionError(f"{label}: no root to find the uv of a uv_version in")
        binary = package_dir(self._root, UriKey(UriKind.UV_TOOL, tool.uri)) / UV_BIN
        if not await asyncio.to_thread(os.access, binary, os.X_OK):
            raise InstallerFailed(
                f"{label}: the uv of uv.uv_version {echo(tool.version)} is not installed "
                f"({binary} is missing): the env's create installs it first; create it again"
            )
        return str(binary)


def refused_an_option(message: str) -> bool:
    """Whether an installer's words say it refused an argument (clap's, as uv words it)."""
    return any(words in message for words in _REFUSED_ARGUMENT)


_REFUSED_ARGUMENT = ("unexpected argument", "unrecognized subcommand", "invalid value")


def finish_venv(venv: Path, final: Path, label: str) -> int:
    """Point the venv's scripts at ``final``, harden its modes, return its size. Blocking."""
    relocate(venv, final)
    harden_tree(venv, label)
    return du(venv)
