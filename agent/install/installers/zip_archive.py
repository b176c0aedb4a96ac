"""The zip kinds (working_dir, py_modules): a package is a zip archive named by a URI.

Fetch it into the staging folder (the fetcher: ``file://`` or ``http(s)://``, the disk floor
checked as bytes come, the digest the URI pins verified), reserve the disk its extraction will
write (what its central directory declares), and extract it safely (``archive.py``'s checks; a
working dir's single top-level folder dropped): in the agent's unpack pool (``unpack_pool.py``:
worker processes, a large zip split between them; the reservation is made once their plan
passed, before they write), or in a thread of the agent's process with no pool.

A ``gcs://`` zip is unpacked as it is, its top folder kept, working dir or not: Ray zips an
uploaded working dir's contents (no top folder of its own) and unpacks GCS packages with
``remove_top_level_directory=False``, so a working dir holding one folder keeps it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from agent.core.packages import Package
from agent.core.uris import ParsedUri
from agent.crash import crash_point
from agent.install.archive import ArchiveLimits, declared_size, extract_zip
from agent.install.disk import unpack_reservation
from agent.install.fetch import Fetcher
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.staging import through
from agent.install.unpack_pool import UnpackPool

_ARCHIVE = "package.zip"  # in the staging folder, next to what it unpacks to
_KEEP_TOP_LEVEL = frozenset({"gcs"})  # schemes whose zips are unpacked as they are (as Ray does)


class ZipArchiveInstaller:
    """One zip kind; ``strip_top_level`` for a working dir (as Ray does, but for gcs://)."""

    def __init__(
        self,
        fetcher: Fetcher,
        limits: ArchiveLimits,
        *,
        strip_top_level: bool,
        pool: UnpackPool | None = None,
    ) -> None:
        """``pool``: the worker processes zips are unpacked in; None: a thread of this
        process (``--extract-workers 0``)."""
        self._fetcher = fetcher
        self._limits = limits
        self._strip_top_level = strip_top_level
        self._pool = pool

    @classmethod
    def working_dir(cls, tools: InstallTools) -> ZipArchiveInstaller:
        return cls(tools.fetcher, tools.archive_limits, strip_top_level=True, pool=tools.unpack)

    @classmethod
    def py_modules(cls, tools: InstallTools) -> ZipArchiveInstaller:
        return cls(tools.fetcher, tools.archive_limits, strip_top_level=False, pool=tools.unpack)

    def check(self, package: Package, label: str) -> None:
        """Today's allowed roots, even for a package cached before they were set."""
        self._fetcher.check_origin(_uri_of(package), label)

    def prepare(self, staging: Path) -> None:
        """The download is 0600 in the 0700 staging folder from before its first byte, whatever
        the umask; the fetcher truncates and writes into it."""
        os.close(os.open(staging / _ARCHIVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    async def install(self, package: Package, job: InstallJob) -> Installed:
        uri = _uri_of(package)
        archive = job.staging / _ARCHIVE
        fetched = await self._fetcher.fetch(uri, archive, label=job.label, space=job.space)
        job.downloaded(fetched)
        crash_point("after_download")
        strip = self._strip_top_level and uri.scheme not in _KEEP_TOP_LEVEL
        unpacked = job.staging / "unpacked"
        limits = self._limits

        async def reserve(declared: int) -> None:  # the disk the extraction will write
            await job.space.expect(unpack_reservation(declared, fetched, limits))

        if self._pool is None:
            await reserve(await asyncio.to_thread(declared_size, archive))
            size = await self._in_thread(archive, unpacked, strip, job.label)
        else:  # reserved once the workers' plan passed; cancelled: they are stopped and
            # waited for, as the thread above is
            size = await self._pool.extract(
                archive, unpacked, archive_bytes=fetched, strip_top_level=strip,
                limits=limits, label=job.label, reserve=reserve,
            )  # fmt: skip
        job.unpacked()
        return Installed(unpacked, size)

    async def _in_thread(self, archive: Path, unpacked: Path, strip: bool, label: str) -> int:
        stop = threading.Event()
        extraction = asyncio.to_thread(
            extract_zip, archive, unpacked, strip_top_level=strip, limits=self._limits,
            label=label, stop=stop,
        )  # fmt: skip
        # cancelled (the last create gone, a setup timeout): the thread is stopped and waited
        # for, so no file is written in the staging folder once its removal begins
        return await through(asyncio.ensure_future(extraction), on_cancel=stop.set)


def _uri_of(package: Package) -> ParsedUri:
    if not isinstance(package.recipe, ParsedUri):
        raise recipe_error(package, "URI")
    return package.recipe
