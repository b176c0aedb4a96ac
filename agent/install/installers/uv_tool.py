"""The uv of a ``uv_version`` (``UriKind.UV_TOOL``): a venv holding ``uv<uv_version>``, whose
``bin/uv`` builds the env's venv (``agent.core.uv_tool``).

Built as a uv set's venv is (``PipVenvInstaller``, by the agent's uv, from the root's wheel cache,
the same isolation), from the env's indexes; then its ``bin/uv`` is asked its version, which
must satisfy the specifier: a wheel that installs no ``uv``, or another version than asked, fails
the install rather than build venvs with it. A version no index has fails FAILED_PRECONDITION in
the installer's own words, as any set does.
"""

from __future__ import annotations

from pathlib import Path

from packaging.specifiers import SpecifierSet

from agent.core.errors import InstallerFailed, echo
from agent.core.packages import Package
from agent.core.uv_tool import UV_BIN, UvTool
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.installers.pip_venv import PipVenvInstaller
from agent.install.venvs.wheel_cache import version_of


class UvToolInstaller:
    def __init__(self, venvs: PipVenvInstaller) -> None:
        self._venvs = venvs  # the uv kind's: by the agent's uv, from the wheel cache

    @classmethod
    def of(cls, tools: InstallTools) -> UvToolInstaller:
        return cls(PipVenvInstaller.of_uv(tools))

    def check(self, package: Package, label: str) -> None:
        """Nothing to check again: its places are the env's, checked when it was parsed."""

    def prepare(self, staging: Path) -> None:
        self._venvs.prepare(staging)

    async def install(self, package: Package, job: InstallJob) -> Installed:
        tool = package.recipe
        if not isinstance(tool, UvTool):
            raise recipe_error(package, "UvTool")
        try:
            installed = await self._venvs.install(Package(package.key, tool.spec), job)
        except InstallerFailed as exc:
            raise InstallerFailed(
                f"uv.uv_version {echo(tool.version)}: the uv it asks for was not installed "
                f"(from the env's indexes, else the default index): {exc.message}"
            ) from exc
        version = await version_of(str(installed.path / UV_BIN))
        if not version or not SpecifierSet(tool.version).contains(version, prereleases=True):
            raise InstallerFailed(
                f"{job.label}: uv.uv_version {echo(tool.version)}: what the index installed "
                f"tells {echo('no uv version' if not version else 'uv ' + version)} from its "
                f"{UV_BIN}; the env's venv is not built with it"
            )
        return installed
