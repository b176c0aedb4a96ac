"""The py_modules_wheel kind: a ``.whl`` named in ``py_modules``, installed as Ray installs it.

Ray's agent downloads the wheel and runs ``pip install <wheel> --target=<module dir>``
(``install_wheel_package``), then puts the folder on the worker's path. So does this installer:
the wheel is fetched (the digest the URI pins checked, the disk floor as bytes come) under its
own file name (pip takes a wheel only by a PEP 427 name: checked when the URI was parsed) into a
0700 folder of the staging folder; the node's python's pip installs it, with its dependencies
as Ray's does, into the package's folder (``--isolated``: no pip.conf nor ``PIP_*`` of the
agent's; its output in the installers' log, its last lines in the error when it fails; killed
with the install when the setup times out); the wheel file is then removed. The folder is
hardened and measured in a thread, and it is counted, cached and evicted as every package.

A node's python with no pip (a venv made by uv, or with ``--without-pip``) is common where Ray
runs from a uv project; Ray's agent runs whatever ``pip`` is first on its PATH, which may belong
to another python. Here, when uv is at hand and the node's python cannot ``import pip`` (asked
once), uv installs the wheel for that python instead (``uv pip install --python <it>
--no-config --link-mode copy --target``: no uv.toml of the agent's, no file shared with uv's
cache, whose modes hardening would change).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

from agent.core.errors import InstallerFailed
from agent.core.packages import Package
from agent.core.uris import ParsedUri, wheel_name
from agent.install.disk.modes import harden_tree, make_dir
from agent.install.disk.root import du
from agent.install.disk.staging import through
from agent.install.fetch.fetcher import Fetcher
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.venvs.build import run_installer

_DOWNLOADS = "wheel"  # in the staging folder: the downloaded wheel, under its own name
_TARGET = "modules"  # in the staging folder: the package's folder, pip's --target


class PyWheelInstaller:
    def __init__(self, fetcher: Fetcher, python: str, logs: Path, uv: str | None = None) -> None:
        self._fetcher = fetcher
        self._python = python  # the node's python: its pip installs the wheel
        self._logs = logs
        self._uv = uv  # installs the wheel instead where the node's python has no pip
        self._has_pip: bool | None = None  # whether the node's python has pip (asked once)

    @classmethod
    def of(cls, tools: InstallTools) -> PyWheelInstaller:
        return cls(tools.fetcher, tools.python, tools.logs, tools.uv)

    def check(self, package: Package, label: str) -> None:
        """Today's allowed roots, even for a package cached before they were set."""
        self._fetcher.check_origin(_uri_of(package), label)

    def prepare(self, staging: Path) -> None:
        """The logs folder, and the wheel's private folder in the staging folder."""
        make_dir(self._logs)
        (staging / _DOWNLOADS).mkdir(mode=0o700)

    async def install(self, package: Package, job: InstallJob) -> Installed:
        uri = _uri_of(package)
        wheel = job.staging / _DOWNLOADS / wheel_name(uri.path, job.label)
        await asyncio.to_thread(_create_private, wheel)
        fetched = await self._fetcher.fetch(uri, wheel, label=job.label, space=job.space)
        job.downloaded(fetched)
        target = job.staging / _TARGET
        log_path = self._logs / f"{job.final.name}-{uuid.uuid4().hex[:8]}.log"
        if self._uv is not None and not await self._pip_here(log_path, job):
            install = [
                self._uv,
                "pip",
                "install",
                "--python",
                self._python,
                "--no-config",
                "--link-mode",
                "copy",
                f"--target={target}",
                str(wheel),
            ]
        else:
            install = [
                self._python,
                "-m",
                "pip",
                "--isolated",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                f"--target={target}",
                str(wheel),
            ]
        await run_installer(install, log_path, job.label, job.staging)
        job.unpacked()
        finish = asyncio.to_thread(_finish, wheel, target, job.label)
        size = await through(asyncio.ensure_future(finish))
        return Installed(target, size)

    async def _pip_here(self, log_path: Path, job: InstallJob) -> bool:
        """Whether the node's python can ``import pip`` (asked once, its answer in the log)."""
        if self._has_pip is None:
            try:
                await run_installer(
                    [self._python, "-c", "import pip"], log_path, job.label, job.staging
                )
            except InstallerFailed:
                self._has_pip = False
            else:
                self._has_pip = True
        return self._has_pip


def _create_private(path: Path) -> None:
    """The download file, 0600 from before its first byte, whatever the umask. Blocking."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _finish(wheel: Path, target: Path, label: str) -> int:
    """Remove the wheel (as Ray does), harden the folder's modes, return its size. Blocking."""
    wheel.unlink()
    target.mkdir(mode=0o755, exist_ok=True)  # a wheel of no files still makes its folder
    harden_tree(target, label)
    return du(target)


def _uri_of(package: Package) -> ParsedUri:
    if not isinstance(package.recipe, ParsedUri):
        raise recipe_error(package, "URI")
    return package.recipe
