"""Fetching object-store packages (``s3://``, ``gs://``, ``azure://``, ``abfss://``): streamed
through obstore (``object_source``: one client per bucket, obstore's own retries off), chunk by
chunk as an http(s) body is, bounded by the bytes read and retried with the same policy. Without
obstore installed (an optional extra) such a package is refused by ``check_origin``. Object
stores have no allowed roots: what a store lets the agent's credentials read is the bound, as
for http(s).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from agent.core.uris import ParsedUri
from agent.install.fetch.base import (
    DownloadWatch,
    Fetched,
    FetchTools,
    Space,
    Transient,
    download_failed,
    too_large,
)
from agent.install.fetch.landing import Digest, create_landing, hop, opening, write_all
from agent.install.fetch.object_source import ObjectUnavailable


class ObjectFetcher:
    """The object stores' fetcher (one for all their schemes: their clients are shared)."""

    def __init__(self, tools: FetchTools) -> None:
        self._limits = tools.limits
        self._retrying = tools.retrying
        self._objects = tools.objects

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """An object store's package needs obstore."""
        if problem := self._objects.missing(label, uri.scheme):
            raise problem

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

        async def once() -> Fetched:
            try:
                read = await self._objects.open(uri.url, label, self._limits.chunk_bytes)
                if read.size > limit:
                    raise too_large(label, limit, read.size)
                out = await opening(lambda: create_landing(dest), fd=int)
                digest = Digest(hashed)  # of this attempt's bytes: a retry starts anew
                total = 0
                try:
                    await space.expect(read.size)
                    async with contextlib.aclosing(read.chunks) as chunks:
                        async for chunk in chunks:
                            if total + len(chunk) > limit:  # as read, whatever was declared
                                raise too_large(label, limit)
                            await space.take(total, len(chunk))
                            await hop(write_all, out, chunk, digest)
                            total += len(chunk)
                finally:
                    os.close(out)
            except ObjectUnavailable as exc:
                raise Transient(str(exc)) from exc
            if total != read.size:
                raise Transient(f"body ended after {total} of {read.size} bytes")
            return total, digest.hex()

        return await self._retrying(once, download_failed(label), label)

    async def close(self) -> None:
        pass
