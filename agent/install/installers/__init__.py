"""The installers, one per way of making a package (``Build``), each kind's chosen by its row
of ``agent.core.kinds.KINDS``.

A kind whose ``Build`` is new adds one module here (an ``Installer``) and one row in
``INSTALLERS``.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.core.kinds import KINDS, Build
from agent.core.uris import UriKind
from agent.install.installers.base import Installed, Installer, InstallJob, InstallTools
from agent.install.installers.java_jars import JavaJarsInstaller
from agent.install.installers.pip_venv import PipVenvInstaller
from agent.install.installers.project_venv import UvProjectInstaller
from agent.install.installers.py_wheel import PyWheelInstaller
from agent.install.installers.uv_tool import UvToolInstaller
from agent.install.installers.zip_archive import ZipArchiveInstaller

__all__ = [
    "INSTALLERS",
    "InstallJob",
    "InstallTools",
    "Installed",
    "Installer",
    "build_installers",
]

# Each way of making a package and how its installer is made from the agent's tools. Complete:
# every ``Build`` (``tests/test_kinds.py``).
INSTALLERS: dict[Build, Callable[[InstallTools], Installer]] = {
    Build.ZIP: ZipArchiveInstaller.py_modules,
    # Ray's agent unpacks a working dir, and a remote py_modules zip, its single top folder dropped
    Build.ZIP_AS_WORKING_DIR: ZipArchiveInstaller.working_dir,
    Build.JARS: JavaJarsInstaller.of,
    Build.WHEEL: PyWheelInstaller.of,
    Build.PIP_VENV: PipVenvInstaller.of,  # a spec that sees the node's site: the build adds it
    Build.UV_VENV: PipVenvInstaller.of_uv,
    Build.PROJECT_VENV: UvProjectInstaller.of,
    Build.UV_TOOL: UvToolInstaller.of,  # the uv of a uv_version: a uv set's venv, checked
}


def build_installers(tools: InstallTools) -> dict[UriKind, Installer]:
    """One installer per kind, as its row's ``Build`` makes it, made once (the store does, at
    start)."""
    return {kind: INSTALLERS[row.build](tools) for kind, row in KINDS.items()}
