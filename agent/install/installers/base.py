"""What an installer is: the ``Installer`` protocol, the job the store hands it, what it returns.

The store (``agent.state.store``) keeps single-flight, the staging folder, the disk floor, the
one rename into place, the commit, the counters and the crash points around an install; an
installer only makes the package's folder inside the staging folder, from the package's recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.core.packages import Package
from agent.core.roots import NO_ROOTS, FileRoots
from agent.install.fetch.base import Space
from agent.install.fetch.fetcher import Fetcher
from agent.install.unpack.plan import ArchiveLimits
from agent.install.unpack.pool import UnpackPool
from agent.install.venvs.disk_guard import BuildRoom


@dataclass(frozen=True)
class InstallTools:
    """What installers are built with: the agent's settings and parts they use."""

    fetcher: Fetcher
    archive_limits: ArchiveLimits
    python: str  # the interpreter venvs are made with
    pip_installer: str  # "pip" or "uv"
    logs: Path  # where installers' logs go (made when first needed)
    unpack: UnpackPool | None = None  # worker processes for zips; None: a thread here
    overlap: bool = True  # a large http(s) zip extracted while it downloads (with a pool)
    uv: str | None = None  # the uv binary (``find_uv``); None: uv envs refused, pip by pip
    wheel_cache: Path | None = None  # the root's wheel cache uv links venvs from
    file_roots: FileRoots = NO_ROOTS  # where a pip or uv set's local sources may be read
    uv_version: str = ""  # what ``uv`` tells as its version ("" unknown): the uv_versions it meets
    root: Path | None = None  # the root, where the uv of a uv_version is found (its package)


@dataclass(frozen=True)
class InstallJob:
    """One install, as the store hands it to an installer."""

    staging: Path  # private (0700), empty: everything the installer writes goes under it
    final: Path  # where the package will live after the store's rename (paths inside name it)
    label: str  # the package as messages and log lines name it, cut once (``UriKey.label``)
    space: Space  # the disk floor: ``expect`` a size before writing it (a reservation)
    downloaded: Callable[[int], None]  # a download of this many bytes completed
    unpacked: Callable[[], None]  # the package's folder was made (an extraction, a venv)
    room: BuildRoom  # the disk floor as a venv build sees it: its estimate, its guard


@dataclass(frozen=True)
class Installed:
    """The package's folder, complete, in the staging folder; the store renames it to ``final``."""

    path: Path
    size: int  # bytes on disk, measured once


class Installer(Protocol):
    """How one kind of package is made. Chosen by kind from ``INSTALLERS``."""

    def check(self, package: Package, label: str) -> None:
        """Pure: refuse a package today's settings forbid, installed or not (the store calls it
        on every ensure, hits included)."""

    def prepare(self, staging: Path) -> None:
        """Blocking, short (a metadata call or two): set up in the new staging folder, in the
        store's one thread hop that makes it."""

    async def install(self, package: Package, job: InstallJob) -> Installed:
        """Make the package's folder under ``job.staging``; nothing blocks the loop."""
        ...


def recipe_error(package: Package, want: str) -> AssertionError:
    """A package whose recipe is not the one its kind's installer takes: a bug of the parser."""
    return AssertionError(
        f"{package.key.label}: a {package.key.kind.value} package needs a {want} recipe, got "
        f"{type(package.recipe).__name__}"
    )
