"""Fetchers: bring a package named by a URI into a local file, then check its digest.

Every read is bounded by the bytes actually read, never by a size a file system or a server
declares: ``max_download_bytes`` is counted as the bytes arrive, and a declared size only serves
to reserve disk space up front (``Space.expect``). Disk space is re-checked before every chunk is
written (``Space.take``), so a download stops at the free-space floor, not at a full disk.

``file://`` is opened once and checked on what was opened (``file_source``), then copied chunk by
chunk, each chunk one short hop to a thread: cancelling the install (a setup timeout, a
cancelled create) stops the copy after at most one chunk. ``http(s)://`` is streamed the same
way through a ``Transport`` (``transport.py``: aiohttp in the agent, a function in unit tests),
asking for the identity encoding and storing the body byte for byte.

A ``DownloadWatch`` given to ``fetch`` is told of each http(s) attempt's answer (its size and
headers); ``read_range`` reads one byte range of a
package with a single ranged GET, or gives None. Together they let an extraction start before
the download ends (``overlap.py``).

``gcs://`` is read from the Ray node's GCS in one call (``gcs_source``: ``GcsKvClient``, one
channel, made at the first such fetch and closed by ``close``), retried as a download is, then
written chunk by chunk in threads as a file is copied. Without a GCS (``gcs=None``: an agent with
no Ray node) a gcs:// package is refused by ``check_origin``, before anything is fetched.

``s3://``, ``gs://``, ``azure://`` and ``abfss://`` are streamed through obstore
(``object_source``: one client per bucket, obstore's own retries off), chunk by chunk as an
http(s) body is, bounded by the bytes read and retried with the same policy. Without obstore
installed (an optional extra) such a package is refused by ``check_origin``. Object stores have
no allowed roots: what a store lets the agent's credentials read is the bound, as for http(s).

Outcomes: 404 or 410 is ``PackageNotFound`` at once. ``PackageRejected``, at once: another
4xx (but 408 and 429), an answer other than 200, an answer that is not valid HTTP (more bytes
than its Content-Length, an overlong header), a TLS certificate that fails verification, a
redirect to a non-http URL or a bad host, too many redirects, a body over the size limit.
Transient, retried ``attempts`` times in all with
exponential backoff and jitter, then ``DownloadFailed`` (UNAVAILABLE): connection errors,
timeouts, truncated bodies, 408, 429 and 5xx. A digest mismatch is ``IntegrityError``,
never retried. The transport, the sleep between retries and the random source of the jitter
are injected, so the retry logic can be driven without waiting and without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import aiohttp

from agent.core.errors import (
    DiskExhausted,
    DownloadFailed,
    IntegrityError,
    PackageNotFound,
    PackageRejected,
    PermissionDenied,
    echo,
)
from agent.core.object_uris import OBJECT_SCHEMES
from agent.core.roots import FileRoots
from agent.core.uris import ParsedUri
from agent.install.file_source import open_package
from agent.install.gcs_source import GcsConfig, GcsKvClient, GcsUnavailable
from agent.install.landing import (
    MAX_PIECES,
    Digest,
    copy_chunk,
    create_landing,
    hop,
    opening,
    write_all,
    write_pieces,
)
from agent.install.object_source import ObjectStores, ObjectUnavailable, load_obstore
from agent.install.transport import (
    AiohttpTransport,
    Failure,
    Policy,
    Request,
    Transport,
    TransportError,
)

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Fetched = tuple[int, str | None]  # bytes written, and their sha256 when the URI pins one
Random = Callable[[], float]  # uniform in [0, 1)
_T = TypeVar("_T")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_RANGE_CHUNK = 64 * 1024  # a ranged GET's body is read in pieces of this size


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


class _Unlimited:
    async def expect(self, size: int) -> None:
        pass

    async def take(self, written: int, more: int) -> None:
        pass

    async def add(self, size: int) -> None:
        pass


class _Transient(Exception):
    """A failure worth another try."""


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
    ) -> None:
        """``objects``: the object stores' clients (default: obstore if it is installed)."""
        if isinstance(transport, aiohttp.ClientSession):
            transport = AiohttpTransport(transport)
        self._transport: Transport = transport
        self._limits = limits
        self._sleep = sleep
        self._rand = rand
        self.file_roots = FileRoots.of(file_roots)
        self.gcs = gcs
        self._objects = (
            objects
            if objects is not None
            else ObjectStores(
                load_obstore(),  # at the start: an import is no work for the event loop later
                connect_timeout_s=limits.connect_timeout_s,
                read_timeout_s=limits.read_timeout_s,
            )
        )
        self._gcs_client = (
            None
            if gcs is None
            else GcsKvClient(
                gcs,
                max_value_bytes=limits.max_download_bytes,
                # no deadline of its own: one reply is the whole package (GBs may take
                # minutes); the create's setup timeout bounds the install and cancels the call
                timeout_s=None,
                reconnect_s=(limits.backoff_initial_s, limits.backoff_max_s),  # as its retries
            )
        )

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """Pure: a file:// package must be named under today's roots, installed or not; a
        gcs:// package needs the Ray node's GCS; an object store's, obstore."""
        if uri.scheme in OBJECT_SCHEMES and (problem := self._objects.missing(label, uri.scheme)):
            raise problem
        if uri.scheme == "file" and not self.file_roots.allow_name(uri.path):
            raise PermissionDenied(
                f"{label}: {echo(os.path.normpath(uri.path))} is outside the folders file:// "
                f"packages may come from ({self.file_roots}; the allow-file-root setting)"
            )
        if uri.scheme == "gcs" and self.gcs is None:
            raise PackageRejected(
                f"{label}: a gcs:// package is read from a Ray node's GCS, and this agent has "
                "none: run it as the node's runtime env agent (`rtenv-agent ray-agent`, which "
                "Ray's raylet starts with the GCS address), or give it a Ray door with a GCS "
                "address"
            )

    async def close(self) -> None:
        """Close the GCS channel, if one was opened (the agent's stop)."""
        if self._gcs_client is not None:
            await self._gcs_client.close()

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
        room = space or _Unlimited()
        hashed = uri.sha256 is not None
        try:
            if uri.scheme == "file":
                size, digest = await self._copy_file(uri, dest, label, room, hashed)
            elif uri.scheme == "gcs":
                size, digest = await self._read_gcs(uri, dest, label, room, hashed)
            elif uri.scheme in OBJECT_SCHEMES:
                size, digest = await self._read_object(uri, dest, label, room, hashed)
            else:
                size, digest = await self._download(uri, dest, label, room, hashed, watch)
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

    # -- file:// ---------------------------------------------------------------------------
    async def _copy_file(
        self, uri: ParsedUri, dest: Path, label: str, space: Space, hashed: bool
    ) -> Fetched:
        limit = self._limits.max_download_bytes
        digest = Digest(hashed)
        src, declared = await opening(
            lambda: open_package(uri.path, self.file_roots, label), fd=lambda opened: opened[0]
        )
        try:
            if declared > limit:
                raise _too_large(label, limit, declared)
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
                        raise _too_large(label, limit)
            finally:
                os.close(out)
        finally:
            os.close(src)

    # -- gcs:// ----------------------------------------------------------------------------
    async def _read_gcs(
        self, uri: ParsedUri, dest: Path, label: str, space: Space, hashed: bool
    ) -> Fetched:
        client = self._gcs_client
        if client is None:  # check_origin refuses it first
            raise AssertionError(f"{label}: a gcs:// fetch with no GCS configured")

        async def once() -> bytes:
            try:
                return await client.get(uri.url, label)
            except GcsUnavailable as exc:
                raise _Transient(str(exc)) from exc

        value = await self._retrying(
            once,
            lambda attempts, exc: DownloadFailed(_gcs_failed(label, client, attempts, exc)),
            label,
        )
        out = await opening(lambda: create_landing(dest), fd=int)
        digest = Digest(hashed)
        try:
            await space.expect(len(value))
            view = memoryview(value)
            for start in range(0, len(view), self._limits.chunk_bytes):
                chunk = view[start : start + self._limits.chunk_bytes]
                await space.take(start, len(chunk))
                await hop(write_all, out, chunk, digest)
        finally:
            os.close(out)
        return len(value), digest.hex()

    # -- s3://, gs://, azure://, abfss:// ---------------------------------------------------
    async def _read_object(
        self, uri: ParsedUri, dest: Path, label: str, space: Space, hashed: bool
    ) -> Fetched:
        limit = self._limits.max_download_bytes

        async def once() -> Fetched:
            try:
                read = await self._objects.open(uri.url, label, self._limits.chunk_bytes)
                if read.size > limit:
                    raise _too_large(label, limit, read.size)
                out = await opening(lambda: create_landing(dest), fd=int)
                digest = Digest(hashed)  # of this attempt's bytes: a retry starts anew
                total = 0
                try:
                    await space.expect(read.size)
                    async with contextlib.aclosing(read.chunks) as chunks:
                        async for chunk in chunks:
                            if total + len(chunk) > limit:  # as read, whatever was declared
                                raise _too_large(label, limit)
                            await space.take(total, len(chunk))
                            await hop(write_all, out, chunk, digest)
                            total += len(chunk)
                finally:
                    os.close(out)
            except ObjectUnavailable as exc:
                raise _Transient(str(exc)) from exc
            if total != read.size:
                raise _Transient(f"body ended after {total} of {read.size} bytes")
            return total, digest.hex()

        return await self._retrying(
            once,
            lambda attempts, exc: DownloadFailed(
                f"{label}: download failed after {attempts} attempts: {exc}"
            ),
            label,
        )

    # -- http(s):// ------------------------------------------------------------------------
    async def _download(
        self,
        uri: ParsedUri,
        dest: Path,
        label: str,
        space: Space,
        hashed: bool,
        watch: DownloadWatch | None,
    ) -> Fetched:
        return await self._retrying(
            lambda: self._get_once(uri.url, dest, label, space, hashed, watch),
            lambda attempts, exc: DownloadFailed(
                f"{label}: download failed after {attempts} attempts: {exc}"
            ),
            label,
        )

    async def _retrying(
        self,
        once: Callable[[], Awaitable[_T]],
        failed: Callable[[int, _Transient], DownloadFailed],
        label: str,
    ) -> _T:
        """``once()`` until it returns, raises something final, or has failed transiently
        ``attempts`` times (then ``failed(attempts, last)``), with backoff and jitter between."""
        limits = self._limits
        delay = limits.backoff_initial_s
        for attempt in range(1, limits.attempts + 1):
            try:
                return await once()
            except _Transient as exc:
                if attempt == limits.attempts:
                    raise failed(attempt, exc) from exc
                log.warning(
                    "download %s attempt %d failed: %s; retrying", label, attempt, exc,
                    extra={"uri": label, "attempt": attempt},
                )  # fmt: skip
            await self._sleep(delay * (1 - limits.backoff_jitter * self._rand()))
            delay = min(delay * 2, limits.backoff_max_s)
        raise AssertionError("unreachable: the loop returns or raises")

    async def _get_once(
        self,
        url: str,
        dest: Path,
        label: str,
        space: Space,
        hashed: bool,
        watch: DownloadWatch | None = None,
    ) -> Fetched:
        limits = self._limits
        request = Request(url, {"Accept-Encoding": "identity"})
        policy = Policy(limits.connect_timeout_s, limits.read_timeout_s, limits.max_redirects)
        try:
            async with self._transport.open(request, policy) as resp:
                _check_status(resp.status, label)
                expected = resp.content_length
                if expected is not None and expected > limits.max_download_bytes:
                    raise _too_large(label, limits.max_download_bytes, expected)
                out = await opening(lambda: create_landing(dest), fd=int)
                digest = Digest(hashed)  # of this attempt's bytes: a retry starts anew
                try:
                    if watch is not None:
                        watch.opened(expected, resp.headers)
                    await space.expect(expected or 0)
                    total = 0
                    # what has arrived is written at once, in one hop (one writev), unjoined
                    async for batch in resp.batches(limits.chunk_bytes, MAX_PIECES):
                        size = sum(map(len, batch))
                        if total + size > limits.max_download_bytes:
                            raise _too_large(label, limits.max_download_bytes)
                        await space.take(total, size)
                        await hop(write_pieces, out, batch, digest)
                        total += size
                finally:
                    os.close(out)
                if expected is not None and total != expected:
                    raise _Transient(f"body ended after {total} of {expected} bytes")
                return total, digest.hex()
        except TransportError as exc:
            raise _outcome(exc, label, limits) from exc

    async def read_range(
        self, url: str, start: int, end: int, size: int, validator: Mapping[str, str]
    ) -> bytes | None:
        """Bytes ``[start, end)`` of the http(s) package at ``url``, whose whole is ``size``
        bytes, with one ranged GET: or None if the server does not answer exactly that range
        of exactly that object (``validator``: ``If-Range``, an ETag or Last-Modified the
        whole's answer gave), or anything fails. One attempt, no retries: it only lets an
        extraction start early, and the whole download stands without it. The answer is read
        to at most ``end - start`` bytes, whatever it declares."""
        limits = self._limits
        want = end - start
        headers = {"Accept-Encoding": "identity", "Range": f"bytes={start}-{end - 1}"}
        headers.update(validator)
        policy = Policy(limits.connect_timeout_s, limits.read_timeout_s, limits.max_redirects)
        try:
            async with self._transport.open(Request(url, headers), policy) as resp:
                if resp.status != 206 or _content_range(resp.headers) != (start, end - 1, size):
                    return None
                parts: list[bytes] = []
                got = 0
                async for chunk in resp.chunks(min(_RANGE_CHUNK, want)):  # small steps: no
                    # large buffer is joined on the event loop
                    got += len(chunk)
                    if got > want:
                        return None
                    parts.append(chunk)
                return b"".join(parts) if got == want else None
        except TransportError as exc:
            log.debug("ranged GET of %s failed: %s", echo(url), exc)
            return None


def _content_range(headers: Mapping[str, str]) -> tuple[int, int, int] | None:
    """``Content-Range: bytes FIRST-LAST/SIZE`` as numbers, or None."""
    value = headers.get("Content-Range", "")
    unit, _, span = value.partition(" ")
    first, _, rest = span.partition("-")
    last, _, size = rest.partition("/")
    if unit != "bytes" or not (first.isdigit() and last.isdigit() and size.isdigit()):
        return None
    return int(first), int(last), int(size)


def _outcome(exc: TransportError, label: str, limits: FetchLimits) -> Exception:
    """A transport's failure as the fetcher words it: final (``PackageRejected``) or worth
    another try (``_Transient``)."""
    detail = echo(exc.detail)
    match exc.failure:
        case Failure.TOO_MANY_REDIRECTS:
            return PackageRejected(
                f"{label}: more than {limits.max_redirects} redirects (max_redirects)"
            )
        case Failure.BAD_REDIRECT:
            return PackageRejected(
                f"{label}: the server redirected to a URL the agent will not fetch: "
                f"{detail} (only http and https with a valid host)"
            )
        case Failure.BAD_CERTIFICATE:
            return PackageRejected(
                f"{label}: the server's TLS certificate failed verification: {detail}"
            )
        case Failure.BAD_HTTP:
            return PackageRejected(f"{label}: the server's answer is not valid HTTP: {detail}")
        case Failure.BAD_HOST:
            return PackageRejected(f"{label}: a redirect named an invalid host name: {detail}")
        case Failure.CONNECTION:
            return _Transient(f"{exc.name}: {detail}")


def _check_status(status: int, label: str) -> None:
    """200 is a package; what is worth another try raises ``_Transient``; the rest is final."""
    if status == 200:
        return
    if status in (404, 410):
        raise PackageNotFound(f"{label}: the server answered {status}")
    if status in (408, 429) or status >= 500:
        raise _Transient(f"the server answered {status}")
    if 400 <= status < 500:
        raise PackageRejected(f"{label}: the server answered {status}")
    raise PackageRejected(f"{label}: the server answered {status}; a package is served with 200")


def _too_large(label: str, limit: int, declared: int | None = None) -> PackageRejected:
    size = f"is {declared} bytes" if declared is not None else f"is larger than {limit} bytes"
    return PackageRejected(f"{label} {size}; the limit is {limit} (max_download_bytes)")


def _gcs_failed(label: str, client: GcsKvClient, attempts: int, exc: _Transient) -> str:
    """The last of a gcs:// fetch's failures: a call's deadline says so, not that the GCS is
    down; anything else is a GCS that did not answer."""
    cause = exc.__cause__
    if isinstance(cause, GcsUnavailable) and cause.deadline_s is not None:
        return (
            f"{label}: the GCS at {client.config.address} did not send the package within the "
            f"call's deadline of {cause.deadline_s:g}s, {attempts} times"
        )
    return (
        f"{label}: the GCS at {client.config.address} is unavailable: no answer after "
        f"{attempts} attempts ({exc}); is the Ray node's GCS running?"
    )
