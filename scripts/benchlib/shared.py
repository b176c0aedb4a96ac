"""What several workloads share: the package server (started on first use), the large zip
(built on first use), both under the run's work folder, and the peer run's Ray nodes (started
on first use, stopped at the end)."""

from __future__ import annotations

import asyncio
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from benchlib.config import Sizes
from benchlib.packages import build_big_zip
from benchlib.procs import PackageServer
from benchlib.raynode import RayNode


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
        self._nodes: dict[str, RayNode] = {}
        self._node_dirs: list[Path] = []  # removed by ``close``, with the rest, at the end

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

    async def alias(self, name: str) -> str:
        """The large zip under another name (a hard link): its URL. A new URL is a new package
        to an agent, so a long-lived agent (Ray's, in its node) installs it from cold."""
        big = await self.big()
        link = self.packages / f"{name}.zip"
        if not link.exists():
            await asyncio.to_thread(os.link, big.path, link)
        return f"{(await self.server()).base_url}/{link.name}"

    async def ray_node(
        self, name: str, *, ours: bool = False, num_cpus: int = 1, env: dict[str, str] | None = None
    ) -> RayNode:
        """A Ray head node by this name, started on first use and stopped by ``close``."""
        if name not in self._nodes:
            node = RayNode(self._work, name, ours=ours, num_cpus=num_cpus, env=env)
            self._node_dirs.append(node.temp_dir)
            self._nodes[name] = await node.__aenter__()
        return self._nodes[name]

    async def stop_node(self, name: str) -> None:
        node = self._nodes.pop(name, None)
        if node is not None:
            await node.stop()

    async def close(self) -> None:
        for name in list(self._nodes):
            await self.stop_node(name)
        if self._server is not None:
            await self._server.stop()
            self._server = None
        for folder in self._node_dirs:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        self._node_dirs = []


def _entries(path: Path) -> int:
    with zipfile.ZipFile(path) as zf:
        return len(zf.infolist())
