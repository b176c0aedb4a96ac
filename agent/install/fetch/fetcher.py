"""The fetcher: brings a package named by a URI into a local file, then checks its digest.

Each URI scheme is one entry of ``FETCHERS``: the class that checks a package's origin and
fetches it (``file``: ``file://``; ``http``: ``http(s)://``; ``gcs``:
``gcs://``; ``object``: ``s3://``, ``gs://``, ``azure://``, ``abfss://``). Its parsing and
traits are the core's entry of the same scheme (``agent.core.uris.SCHEMES``); a scheme is in
both tables or in neither (tests/test_fetch.py checks it).

Every read is bounded by the bytes actually read, never by a size a file system or a server
declares: ``max_download_bytes`` is counted as the bytes arrive, and a declared size only serves
to reserve disk space up front (``Space.expect``). Disk space is re-checked before every chunk is
written (``Space.take``), so a download stops at the free-space floor, not at a full disk; a full
disk met anyway is ``DiskExhausted``. A digest mismatch is ``IntegrityError``, never retried.
The transport, the sleep between retries and the random source of the jitter are injected
(``base``), so the retry logic can be driven without waiting and without sockets.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import aiohttp

from agent.core.errors import DiskExhausted, IntegrityError
from agent.core.roots import FileRoots
from agent.core.uris import ParsedUri
from agent.install.fetch.base import (
    DownloadWatch,
    FetchLimits,
    FetchTools,
    Random,
    Retrying,
    SchemeFetcher,
    Sleep,
    Space,
    Unlimited,
)
from agent.install.fetch.file import FileFetcher
from agent.install.fetch.gcs import GcsFetcher
from agent.install.fetch.gcs_source import GcsConfig
from agent.install.fetch.http import HttpFetcher
from agent.install.fetch.object import ObjectFetcher
from agent.install.fetch.object_source import ObjectStores, load_obstore
from agent.install.fetch.transport import AiohttpTransport, Transport

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

# The fetcher of each scheme ``agent.core.uris.SCHEMES`` parses: one instance per class, shared
# by its schemes (http and https; the object stores, whose clients are cached per bucket).
FETCHERS: dict[str, Callable[[FetchTools], SchemeFetcher]] = {
    "file": FileFetcher, "http": HttpFetcher, "https": HttpFetcher, "gcs": GcsFetcher,
    "s3": ObjectFetcher, "gs": ObjectFetcher, "azure": ObjectFetcher, "abfss": ObjectFetcher,
}  # fmt: skip


class Fetcher:
    def __init__(
        self,
        transport: Transport | aiohttp.ClientSession,  # a session: over AiohttpTransport
        limits: FetchLimits,
        *,
        sleep: Sleep = asyncio.sleep,
        rand: Random = random.random,
        file_roots: tuple[str, ...] = (),
        gcs: GcsConfig | None = None,
        objects: ObjectStores | None = None,
        http_headers: Mapping[str, str] | None = None,
    ) -> None:
        """``objects``: the object stores' clients (default: obstore if it is installed);
        ``http_headers``: sent with every http(s) GET besides the fetcher's own."""
        if isinstance(transport, aiohttp.ClientSession):
            transport = AiohttpTransport(transport)
        tools = FetchTools(
            limits=limits,
            retrying=Retrying(limits, sleep, rand),
            transport=transport,
            file_roots=FileRoots.of(file_roots),
            gcs=gcs,
            objects=(
                objects
                if objects is not None
                else ObjectStores(
                    load_obstore(),  # at the start: an import is no work for the loop later
                    connect_timeout_s=limits.connect_timeout_s,
                    read_timeout_s=limits.read_timeout_s,
                )
            ),
            http_headers=dict(http_headers or {}),
        )
        made: dict[Callable[[FetchTools], SchemeFetcher], SchemeFetcher] = {}
        for make in FETCHERS.values():
            if make not in made:
                made[make] = make(tools)
        self._fetchers = {scheme: made[make] for scheme, make in FETCHERS.items()}
        self._parts = list(made.values())
        http = made[HttpFetcher]
        assert isinstance(http, HttpFetcher)
        self._http = http

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """Pure: a file:// package must be named under today's roots, installed or not; a
        gcs:// package needs the Ray node's GCS; an object store's, obstore."""
        self._fetchers[uri.scheme].check_origin(uri, label)

    async def close(self) -> None:
        """Close what the fetchers opened (the GCS channel, if one was): the agent's stop."""
        for part in self._parts:
            await part.close()

    async def fetch(
        self,
        uri: ParsedUri,
        dest: Path,
        *,
        label: str,
        space: Space | None = None,
        watch: DownloadWatch | None = None,
    ) -> int:
        """Write the package to ``dest``; verify its digest if the URI names one; return bytes.

        ``label`` names the package in messages and log lines: its URI, already cut once
        (``UriKey.label``). ``watch``: told of an http(s) download's answers and progress."""
        room = space or Unlimited()
        hashed = uri.sha256 is not None
        try:
            size, digest = await self._fetchers[uri.scheme].fetch(
                uri, dest, label, room, hashed, watch
            )
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise DiskExhausted(f"{label}: no space left on the agent's disk") from exc
            raise
        if uri.sha256 is not None and digest != uri.sha256:
            raise IntegrityError(
                f"{label}: sha256 of the downloaded package is {digest}, the URI expects "
                f"{uri.sha256}; the package changed or the URI's digest is wrong"
            )
        return size

    async def read_range(
        self, url: str, start: int, end: int, size: int, validator: Mapping[str, str]
    ) -> bytes | None:
        """Bytes ``[start, end)`` of the http(s) package at ``url`` (``HttpFetcher.read_range``):
        or None, and the whole download stands without it."""
        return await self._http.read_range(url, start, end, size, validator)
