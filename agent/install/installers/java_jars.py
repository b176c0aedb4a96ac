"""The java_jars kind: a ``.jar`` kept whole in a folder of its own, or a ``.zip`` unpacked.

A Ray Java worker puts each java_jars folder on its class path twice (``<folder>/*`` and
``<folder>``: ``RuntimeEnvContext.exec_worker``), so a folder holding the jar and a folder
holding a zip's contents (jars, or classes) both reach it. Ray unzips a remote ``.jar`` into its
folder; this agent keeps the jar whole (its manifest and signature intact), which the
``<folder>/*`` entry loads just the same. A ``.zip`` is unpacked as a working dir is (its single
top folder dropped, but for ``gcs://``: as Ray's ``download_and_unpack_package`` does), by the
zip installer.

The jar is fetched (the digest the URI pins checked, the disk floor as bytes come) into the
0600 file the zip installer's ``prepare`` made, checked to be a zip archive (a jar is one), and
moved into the package's folder, readable, in one thread hop.
"""

from __future__ import annotations

import asyncio
import os
import re
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from agent.core.errors import UnsafeArchive
from agent.core.packages import Package
from agent.core.uris import ParsedUri
from agent.install.fetch.fetcher import Fetcher
from agent.install.installers.base import Installed, InstallJob, InstallTools, recipe_error
from agent.install.installers.zip_archive import ZipArchiveInstaller

_ARCHIVE = "package.zip"  # the zip installer's download file, made by its ``prepare``
_FOLDER = "jar"  # in the staging folder: the package's folder, holding the one jar
_DEFAULT_NAME = "package.jar"
_JAR_NAME = re.compile(r"[A-Za-z0-9._+-]{1,200}\.jar", re.IGNORECASE)


class JavaJarsInstaller:
    """A ``.jar`` fetched into a folder as it is; a ``.zip`` unpacked by the zip installer."""

    def __init__(self, fetcher: Fetcher, unzip: ZipArchiveInstaller) -> None:
        self._fetcher = fetcher
        self._unzip = unzip

    @classmethod
    def of(cls, tools: InstallTools) -> JavaJarsInstaller:
        return cls(tools.fetcher, ZipArchiveInstaller.working_dir(tools))

    def check(self, package: Package, label: str) -> None:
        """Today's allowed roots, even for a package cached before they were set."""
        self._fetcher.check_origin(_uri_of(package), label)

    def prepare(self, staging: Path) -> None:
        """The download file, 0600 from before its first byte (the zip installer's), and the
        jar's folder beside it."""
        self._unzip.prepare(staging)
        (staging / _FOLDER).mkdir(mode=0o755)

    async def install(self, package: Package, job: InstallJob) -> Installed:
        uri = _uri_of(package)
        if not uri.path.lower().endswith(".jar"):
            return await self._unzip.install(package, job)
        download = job.staging / _ARCHIVE
        fetched = await self._fetcher.fetch(uri, download, label=job.label, space=job.space)
        job.downloaded(fetched)
        folder = job.staging / _FOLDER
        await asyncio.to_thread(_place_jar, download, folder / jar_name(uri), job.label)
        job.unpacked()
        return Installed(folder, fetched)


def jar_name(uri: ParsedUri) -> str:
    """The jar's file name in its folder: the URI's last path segment when it is a plain
    ``<name>.jar``, else ``package.jar``."""
    name = PurePosixPath(unquote(uri.path)).name
    return name if _JAR_NAME.fullmatch(name) else _DEFAULT_NAME


def _place_jar(download: Path, jar: Path, label: str) -> None:
    """Blocking: refuse a download that is no zip archive, then move it into the folder,
    readable by the worker (owner writes)."""
    try:
        is_zip = zipfile.is_zipfile(download)
    except OSError as exc:
        raise UnsafeArchive(f"{label}: the downloaded jar cannot be read: {exc}") from exc
    if not is_zip:
        raise UnsafeArchive(
            f"{label}: the download is not a jar: a jar is a zip archive, and this file has no "
            "zip end record"
        )
    os.chmod(download, 0o644)
    os.rename(download, jar)


def _uri_of(package: Package) -> ParsedUri:
    if not isinstance(package.recipe, ParsedUri):
        raise recipe_error(package, "URI")
    return package.recipe
