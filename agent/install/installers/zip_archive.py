"""The zip kinds (working_dir, py_modules): a package is a zip archive named by a URI.

Fetch it into the staging folder (the fetcher, by its scheme: ``fetch/fetcher.py``; the disk floor
checked as bytes come, the digest the URI pins verified), reserve the disk its extraction will
write (what its central directory declares), and extract it safely (``archive.py``'s checks; a
working dir's single top-level folder dropped): in the agent's unpack pool (``unpack/pool.py``:
worker processes, a large zip split between them; the reservation is made once their plan
passed, before they write), or in a thread of the agent's process with no pool. A large zip of a
``ranged`` scheme (http(s): the scheme's traits are ``agent.core.uris.Scheme``) is extracted
while it downloads, from its tail read ahead (``overlap.py``), and kept only if the complete
file holds that same tail; else it is extracted from the complete file.

A zip of a ``keeps_top_level`` scheme (``gcs://``) is unpacked as it is, its top folder kept,
working dir or not: Ray zips an uploaded working dir's contents (no top folder of its own) and
unpacks GCS packages with ``remove_top_level_directory=False``, so a working dir holding one
folder keeps it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

from agent.core.packages import Package
from agent.core.uris import SCHEMES, ParsedUri
from agent.crash import crash_point
from agent.install.disk.root import unpack_reservation
from agent.install.disk.staging import through
from agent.install.fetch.fetcher import Fetcher
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.unpack.archive import extract_zip
from agent.install.unpack.overlap import EarlyExtraction
from agent.install.unpack.plan import ArchiveLimits, declared_size
from agent.install.unpack.pool import UnpackPool

log = logging.getLogger(__name__)

_ARCHIVE = "package.zip"  # in the staging folder, next to what it unpacks to
_OVERLAPPED = "while it downloaded"  # how a zip extracted during its download was unpacked


class ZipArchiveInstaller:
    """One zip kind; ``strip_top_level`` for a working dir (as Ray does, but for a scheme whose
    zips keep their top folder: gcs://)."""

    def __init__(
        self,
        fetcher: Fetcher,
        limits: ArchiveLimits,
        *,
        strip_top_level: bool,
        pool: UnpackPool | None = None,
        overlap: bool = True,
    ) -> None:
        """``pool``: the worker processes zips are unpacked in; None: a thread of this
        process (``--extract-workers 0``). ``overlap``: a large http(s) zip is extracted in
        the pool while it downloads (``--overlap-downloads``)."""
        self._fetcher = fetcher
        self._limits = limits
        self._strip_top_level = strip_top_level
        self._pool = pool
        self._overlap = overlap

    @classmethod
    def working_dir(cls, tools: InstallTools) -> ZipArchiveInstaller:
        return cls(
            tools.fetcher,
            tools.archive_limits,
            strip_top_level=True,
            pool=tools.unpack,
            overlap=tools.overlap,
        )

    @classmethod
    def py_modules(cls, tools: InstallTools) -> ZipArchiveInstaller:
        return cls(
            tools.fetcher,
            tools.archive_limits,
            strip_top_level=False,
            pool=tools.unpack,
            overlap=tools.overlap,
        )

    def check(self, package: Package, label: str) -> None:
        """Today's allowed roots, even for a package cached before they were set."""
        self._fetcher.check_origin(_uri_of(package), label)

    def prepare(self, staging: Path) -> None:
        """The download is 0600 in the 0700 staging folder from before its first byte, whatever
        the umask; the fetcher truncates and writes into it."""
        os.close(os.open(staging / _ARCHIVE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    async def install(self, package: Package, job: InstallJob) -> Installed:
        uri = _uri_of(package)
        scheme = SCHEMES[uri.scheme]  # its traits: whether its zips keep their top folder,
        # whether their extraction may overlap the download
        archive = job.staging / _ARCHIVE
        strip = self._strip_top_level and not scheme.keeps_top_level
        limits = self._limits
        early = None
        if self._pool is not None and self._overlap and scheme.ranged:
            early = EarlyExtraction(
                self._fetcher,
                self._pool,
                uri.url,
                archive,
                job.staging / "unpacked",
                strip_top_level=strip,
                limits=limits,
                label=job.label,
                space=job.space,
            )
        started = time.monotonic()
        try:
            fetched = await self._fetcher.fetch(
                uri, archive, label=job.label, space=job.space, watch=early
            )
        except BaseException:
            if early is not None:
                await early.abandon()  # its workers stopped before the staging folder goes
            raise
        job.downloaded(fetched)
        crash_point("after_download")
        downloaded = time.monotonic()
        if early is not None:
            size = await early.outcome()
            if size is not None:
                job.unpacked()
                _log_times(job.label, _OVERLAPPED, started, downloaded)
                return Installed(early.dest, size)
        # an early extraction thrown away may have left a tree: this one is made beside it
        unpacked = job.staging / ("unpacked-again" if early and early.started else "unpacked")

        async def reserve(declared: int) -> None:  # the disk the extraction will write
            await job.space.expect(unpack_reservation(declared, fetched, limits))

        if self._pool is None:
            await reserve(await asyncio.to_thread(declared_size, archive))
            size = await self._in_thread(archive, unpacked, strip, job.label)
        else:  # reserved once the workers' plan passed; cancelled: they are stopped and
            # waited for, as the thread above is
            size = await self._pool.extract(
                archive,
                unpacked,
                archive_bytes=fetched,
                strip_top_level=strip,
                limits=limits,
                label=job.label,
                reserve=reserve,
            )
        job.unpacked()
        _log_times(job.label, "after its download", started, downloaded)
        return Installed(unpacked, size)

    async def _in_thread(self, archive: Path, unpacked: Path, strip: bool, label: str) -> int:
        stop = threading.Event()
        extraction = asyncio.to_thread(
            extract_zip,
            archive,
            unpacked,
            strip_top_level=strip,
            limits=self._limits,
            label=label,
            stop=stop,
        )
        # cancelled (the last create gone, a setup timeout): the thread is stopped and waited
        # for, so no file is written in the staging folder once its removal begins
        return await through(asyncio.ensure_future(extraction), on_cancel=stop.set)


def _log_times(label: str, how: str, started: float, downloaded: float) -> None:
    now = time.monotonic()
    log.debug(
        "unpacked %s %s: downloaded in %.3fs, unpacked %.3fs after",
        label,
        how,
        downloaded - started,
        now - downloaded,
        extra={
            "uri": label,
            "download_seconds": round(downloaded - started, 3),
            "unpack_seconds": round(now - downloaded, 3),
            "overlapped": how == _OVERLAPPED,
        },
    )


def _uri_of(package: Package) -> ParsedUri:
    if not isinstance(package.recipe, ParsedUri):
        raise recipe_error(package, "URI")
    return package.recipe
