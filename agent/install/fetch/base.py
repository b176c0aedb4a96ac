"""What every scheme's fetcher shares (``fetcher.py`` holds the table of them): the limits of a
download, the disk ``Space`` it takes as bytes come, the ``DownloadWatch`` told of an http(s)
answer, what a fetcher is built from (``FetchTools``) and what it must do (``SchemeFetcher``),
and the retry policy: ``Transient`` failures retried ``attempts`` times in all with exponential
backoff and jitter, then ``DownloadFailed``. The sleep between retries and the random source of
the jitter are injected, so the retry logic can be driven without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from agent.core.errors import DownloadFailed, PackageRejected
from agent.core.roots import FileRoots
from agent.core.uris import ParsedUri
from agent.install.fetch.gcs_source import GcsConfig
from agent.install.fetch.object_source import ObjectStores
from agent.install.fetch.transport import Transport

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Fetched = tuple[int, str | None]  # bytes written, and their sha256 when the URI pins one
Random = Callable[[], float]  # uniform in [0, 1)
_T = TypeVar("_T")


@dataclass(frozen=True)
class FetchLimits:
    max_download_bytes: int = 16 * 1024**3
    attempts: int = 4  # tries in all, the first included
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    backoff_jitter: float = 0.5  # each delay is shortened by up to this fraction, at random
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # between two chunks
    chunk_bytes: int = 1024 * 1024
    max_redirects: int = 10


class Space(Protocol):
    """Disk space for one download (the store's floor); the fetcher calls it as bytes come."""

    async def expect(self, size: int) -> None:
        """The source declares ``size`` bytes: make room for them before the first is written."""

    async def take(self, written: int, more: int) -> None:
        """``written`` bytes are on disk and up to ``more`` are about to follow."""

    async def add(self, size: int) -> None:
        """``size`` more bytes will be written besides what was declared (an extraction that
        runs while the download does): make room for them too, before the first is written."""


class DownloadWatch(Protocol):
    """Told of an http(s) download's answers (an extraction that overlaps it; it follows the
    bytes by the file's size, not through the fetcher)."""

    def opened(self, size: int | None, headers: Mapping[str, str]) -> None:
        """An attempt's answer is a package (200): its declared size and headers. Called once
        per attempt: a second call is a retry, whose body is written anew from its start."""


class Unlimited:
    """The ``Space`` of a fetch given none: every byte fits."""

    async def expect(self, size: int) -> None:
        pass

    async def take(self, written: int, more: int) -> None:
        pass

    async def add(self, size: int) -> None:
        pass


class Transient(Exception):
    """A failure worth another try."""


@dataclass(frozen=True)
class Retrying:
    """The retry policy of every fetcher: ``limits.attempts`` tries, backoff and jitter between."""

    limits: FetchLimits
    sleep: Sleep
    rand: Random

    async def __call__(
        self,
        once: Callable[[], Awaitable[_T]],
        failed: Callable[[int, Transient], DownloadFailed],
        label: str,
    ) -> _T:
        """``once()`` until it returns, raises something final, or has failed transiently
        ``attempts`` times (then ``failed(attempts, last)``), with backoff and jitter between."""
        limits = self.limits
        delay = limits.backoff_initial_s
        for attempt in range(1, limits.attempts + 1):
            try:
                return await once()
            except Transient as exc:
                if attempt == limits.attempts:
                    raise failed(attempt, exc) from exc
                log.warning(
                    "download %s attempt %d failed: %s; retrying",
                    label,
                    attempt,
                    exc,
                    extra={"uri": label, "attempt": attempt},
                )
            await self.sleep(delay * (1 - limits.backoff_jitter * self.rand()))
            delay = min(delay * 2, limits.backoff_max_s)
        raise AssertionError("unreachable: the loop returns or raises")


def download_failed(label: str) -> Callable[[int, Transient], DownloadFailed]:
    """The error of a download that failed transiently every time (http(s), object stores)."""
    return lambda attempts, exc: DownloadFailed(
        f"{label}: download failed after {attempts} attempts: {exc}"
    )


def too_large(label: str, limit: int, declared: int | None = None) -> PackageRejected:
    size = f"is {declared} bytes" if declared is not None else f"is larger than {limit} bytes"
    return PackageRejected(f"{label} {size}; the limit is {limit} (max_download_bytes)")


@dataclass(frozen=True)
class FetchTools:
    """What a scheme's fetcher is built from: the agent's settings and the clients they share."""

    limits: FetchLimits
    retrying: Retrying
    transport: Transport
    file_roots: FileRoots
    gcs: GcsConfig | None  # the Ray node's GCS, if the agent has one
    objects: ObjectStores
    # sent with every http(s) GET (under Ray: Ray's User-Agent and bearer token,
    # ``agent.ops.ray_knobs``); a redirect to another origin drops ``Authorization``
    http_headers: Mapping[str, str] = field(default_factory=dict)


class SchemeFetcher(Protocol):
    """How the packages of one or more URI schemes are fetched (a ``fetcher.FETCHERS`` entry)."""

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """Pure: refuse a package this agent may not or cannot fetch, before anything is."""

    async def fetch(
        self,
        uri: ParsedUri,
        dest: Path,
        label: str,
        space: Space,
        hashed: bool,
        watch: DownloadWatch | None,
    ) -> Fetched:
        """Write the package to ``dest``: its size, and its sha256 if ``hashed``."""

    async def close(self) -> None:
        """Close what the fetcher opened (the agent's stop)."""
