"""Fetching ``file://`` packages: the file is opened once and checked on what was opened
(``file_source``: under today's allowed roots, a regular file), then copied chunk by chunk, each
chunk one short hop to a thread: cancelling the install (a setup timeout, a cancelled create)
stops the copy after at most one chunk. Bounded by the bytes read, never by the size the file
system declares (a file that grows while it is read, or /proc's size 0).
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.core.errors import PermissionDenied, echo
from agent.core.uris import ParsedUri
from agent.install.fetch.base import DownloadWatch, Fetched, FetchTools, Space, too_large
from agent.install.fetch.file_source import open_package
from agent.install.fetch.landing import Digest, copy_chunk, create_landing, hop, opening


class FileFetcher:
    """The ``file`` scheme's fetcher."""

    def __init__(self, tools: FetchTools) -> None:
        self._limits = tools.limits
        self.file_roots = tools.file_roots

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """A file:// package must be named under today's roots, installed or not."""
        if not self.file_roots.allow_name(uri.path):
            raise PermissionDenied(
                f"{label}: {echo(os.path.normpath(uri.path))} is outside the folders file:// "
                f"packages may come from ({self.file_roots}; the allow-file-root setting)"
            )

    async def fetch(
        self,
        uri: ParsedUri,
        dest: Path,
        label: str,
        space: Space,
        hashed: bool,
        watch: DownloadWatch | None,
    ) -> Fetched:
        limit = self._limits.max_download_bytes
        digest = Digest(hashed)
        src, declared = await opening(
            lambda: open_package(uri.path, self.file_roots, label), fd=lambda opened: opened[0]
        )
        try:
            if declared > limit:
                raise too_large(label, limit, declared)
            out = await opening(lambda: create_landing(dest), fd=int)
            try:
                await space.expect(declared)
                total = 0
                while True:
                    want = min(self._limits.chunk_bytes, limit + 1 - total)  # 1 over: too large
                    await space.take(total, want if total >= declared else 0)  # past its size
                    read = await hop(copy_chunk, src, out, want, label, digest)
                    if read == 0:
                        return total, digest.hex()
                    total += read
                    if total > limit:  # a file that grows while it is read, or /proc's size 0
                        raise too_large(label, limit)
            finally:
                os.close(out)
        finally:
            os.close(src)

    async def close(self) -> None:
        pass
