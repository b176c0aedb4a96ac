"""The installers, one per package kind, chosen by kind from ``INSTALLERS``.

A new kind is one module here (an ``Installer``) and one row in the table, plus its parser and
its placement in ``agent.core`` (``UriKind``, ``parse_runtime_env``, ``PLACEMENTS``).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.core.uris import UriKind
from agent.install.installers.base import Installed, Installer, InstallJob, InstallTools
from agent.install.installers.java_jars import JavaJarsInstaller
from agent.install.installers.pip_venv import PipVenvInstaller
from agent.install.installers.project_venv import UvProjectInstaller
from agent.install.installers.py_wheel import PyWheelInstaller
from agent.install.installers.zip_archive import ZipArchiveInstaller

__all__ = [
    "INSTALLERS",
    "InstallJob",
    "InstallTools",
    "Installed",
    "Installer",
    "build_installers",
]

# Each kind and how its installer is made from the agent's tools. Complete: every UriKind.
INSTALLERS: dict[UriKind, Callable[[InstallTools], Installer]] = {
    UriKind.WORKING_DIR: ZipArchiveInstaller.working_dir,
    UriKind.PY_MODULES: ZipArchiveInstaller.py_modules,
    UriKind.PIP: PipVenvInstaller.of,
    UriKind.JAVA_JARS: JavaJarsInstaller.of,
    UriKind.UV: PipVenvInstaller.of_uv,
    UriKind.RAY_PIP: PipVenvInstaller.of,  # the spec says node_site: the venv's build does the rest
    UriKind.RAY_UV: PipVenvInstaller.of_uv,
    UriKind.UV_PROJECT: UvProjectInstaller.of,
    UriKind.PY_MODULES_WHEEL: PyWheelInstaller.of,
    # Ray's agent unpacks a remote py_modules zip as a working dir: its single top folder dropped
    UriKind.RAY_PY_MODULES: ZipArchiveInstaller.working_dir,
}


def build_installers(tools: InstallTools) -> dict[UriKind, Installer]:
    """One installer per kind of ``INSTALLERS``, made once (the store does, at start)."""
    return {kind: make(tools) for kind, make in INSTALLERS.items()}
