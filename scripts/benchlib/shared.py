"""What several workloads share: the package server (started on first use) and the large zip
(built on first use), both under the run's work folder."""

from __future__ import annotations

import asyncio
import zipfile
from dataclasses import dataclass
from pathlib import Path

from benchlib.config import Sizes
from benchlib.packages import build_big_zip
from benchlib.procs import PackageServer


@dataclass(frozen=True)
class BigPackage:
    path: Path
    url: str
    zip_bytes: int
    unpacked_bytes: int
    entries: int

    def label(self) -> str:
        return f"{self.zip_bytes / 2**20:.0f} MB zip, {self.entries} files"


class Shared:
    def __init__(self, work: Path, sizes: Sizes) -> None:
        self.packages = work / "packages"
        self.packages.mkdir(parents=True, exist_ok=True)
        self._work = work
        self._sizes = sizes
        self._server: PackageServer | None = None
        self._big: BigPackage | None = None

    async def server(self) -> PackageServer:
        if self._server is None:
            server = PackageServer(self.packages, self._work / "pkg-server.log")
            self._server = await server.__aenter__()
        return self._server

    async def big(self) -> BigPackage:
        if self._big is None:
            path = self.packages / "big.zip"
            unpacked = await asyncio.to_thread(build_big_zip, path, self._sizes.big)
            entries = await asyncio.to_thread(_entries, path)
            url = f"{(await self.server()).base_url}/{path.name}"
            self._big = BigPackage(path, url, path.stat().st_size, unpacked, entries)
        return self._big

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


def _entries(path: Path) -> int:
    with zipfile.ZipFile(path) as zf:
        return len(zf.infolist())
