"""Fetchers: bring a package named by a URI into a local file, then check its digest.

``file://`` is copied in a thread; ``http(s)://`` is streamed to disk in chunks with aiohttp.
The HTTP session and the sleep used between retries are injected, so the retry logic can be
driven without waiting and the transport is whatever the caller built (the agent's one shared
session, or a test's).

Outcomes: a 404 or 410 is ``PackageNotFound`` at once; another 4xx, or a body over the size limit,
is ``PackageRejected`` at once; connection errors, timeouts, truncated bodies, 429 and 5xx are
transient and retried ``attempts`` times in all with exponential backoff, then
``DownloadFailed`` (UNAVAILABLE). A digest mismatch is ``IntegrityError``, never retried.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiofiles
import aiohttp

from agent.errors import (
    DiskExhausted,
    DownloadFailed,
    IntegrityError,
    PackageNotFound,
    PackageRejected,
    PermissionDenied,
)
from agent.runtime_env import ParsedUri

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class FetchLimits:
    max_download_bytes: int = 16 * 1024**3
    attempts: int = 4  # tries in all, the first included
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # between two chunks
    chunk_bytes: int = 1024 * 1024


class _Transient(Exception):
    """A failure worth another try."""


class Fetcher:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        limits: FetchLimits,
        *,
        sleep: Sleep = asyncio.sleep,
        file_roots: tuple[str, ...] = (),
    ) -> None:
        self._session = session
        self._limits = limits
        self._sleep = sleep
        self._file_roots = tuple(os.path.realpath(root) for root in file_roots)

    async def fetch(self, uri: ParsedUri, dest: Path, *, label: str) -> int:
        """Write the package to ``dest``; verify its digest if the URI names one; return bytes."""
        try:
            if uri.scheme == "file":
                size = await asyncio.to_thread(self._copy_file, uri, dest, label)
            else:
                size = await self._download(uri, dest, label)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskExhausted(f"{label}: no space left on the agent's disk") from exc
            raise
        if uri.sha256 is not None:
            digest = await asyncio.to_thread(_sha256_of, dest)
            if digest != uri.sha256:
                raise IntegrityError(
                    f"{label}: sha256 of the downloaded package is {digest}, the URI expects "
                    f"{uri.sha256}; the package changed or the URI's digest is wrong"
                )
        return size

    def _copy_file(self, uri: ParsedUri, dest: Path, label: str) -> int:
        source = Path(uri.path)
        if self._file_roots:
            real = os.path.realpath(source)  # links resolved: no way around the roots
            if not any(real == r or real.startswith(r + os.sep) for r in self._file_roots):
                raise PermissionDenied(
                    f"{label}: {real} is outside the folders file:// packages may come from "
                    f"({', '.join(self._file_roots)}; the allow-file-root setting)"
                )
        try:
            size = source.stat().st_size
            if source.is_dir():
                raise PackageRejected(f"{label} is a directory; a package must be a zip file")
            if size > self._limits.max_download_bytes:
                raise PackageRejected(
                    f"{label} is {size} bytes; the limit is {self._limits.max_download_bytes} "
                    "(max_download_bytes)"
                )
            shutil.copyfile(source, dest)
        except FileNotFoundError as exc:
            raise PackageNotFound(f"{label}: no such file on this node") from exc
        except PermissionError as exc:
            raise PackageRejected(f"{label}: the agent may not read it: {exc}") from exc
        return size

    async def _download(self, uri: ParsedUri, dest: Path, label: str) -> int:
        limits = self._limits
        delay = limits.backoff_initial_s
        for attempt in range(1, limits.attempts + 1):
            try:
                return await self._get_once(uri.url, dest, label)
            except _Transient as exc:
                if attempt == limits.attempts:
                    raise DownloadFailed(
                        f"{label}: download failed after {attempt} attempts: {exc}"
                    ) from exc
                log.warning(
                    "download %s attempt %d failed: %s; retrying", label, attempt, exc,
                    extra={"uri": label, "attempt": attempt},
                )  # fmt: skip
            await self._sleep(delay)
            delay = min(delay * 2, limits.backoff_max_s)
        raise AssertionError("unreachable: the loop returns or raises")

    async def _get_once(self, url: str, dest: Path, label: str) -> int:
        limits = self._limits
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.connect_timeout_s, sock_read=limits.read_timeout_s
        )
        try:
            async with self._session.get(url, timeout=timeout, allow_redirects=True) as resp:
                if resp.status in (404, 410):
                    raise PackageNotFound(f"{label}: the server answered {resp.status}")
                if resp.status == 429 or resp.status >= 500:
                    raise _Transient(f"the server answered {resp.status}")
                if resp.status >= 400:
                    raise PackageRejected(f"{label}: the server answered {resp.status}")
                expected = resp.content_length
                if expected is not None and expected > limits.max_download_bytes:
                    raise PackageRejected(
                        f"{label} is {expected} bytes; the limit is "
                        f"{limits.max_download_bytes} (max_download_bytes)"
                    )
                total = 0
                async with aiofiles.open(dest, "wb") as out:
                    async for chunk in resp.content.iter_chunked(limits.chunk_bytes):
                        total += len(chunk)
                        if total > limits.max_download_bytes:
                            raise PackageRejected(
                                f"{label} is larger than {limits.max_download_bytes} bytes "
                                "(max_download_bytes)"
                            )
                        await out.write(chunk)
                if expected is not None and total != expected:
                    raise _Transient(f"body ended after {total} of {expected} bytes")
                return total
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()
