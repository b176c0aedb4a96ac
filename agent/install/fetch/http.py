"""Fetching ``http(s)://`` packages: streamed through a ``Transport`` (``transport.py``: aiohttp
in the agent, a function in unit tests), asking for the identity encoding and storing the body
byte for byte, what has arrived written at once in one hop (one writev). A ``DownloadWatch`` is
told of each attempt's answer (its size and headers); ``read_range`` reads one byte range of a
package with a single ranged GET, or gives None. Together they let an extraction start before
the download ends (``overlap.py``).

Outcomes: 404 or 410 is ``PackageNotFound`` at once. ``PackageRejected``, at once: another
4xx (but 408 and 429), an answer other than 200, an answer that is not valid HTTP (more bytes
than its Content-Length, an overlong header), a TLS certificate that fails verification, a
redirect to a non-http URL or a bad host, too many redirects, a body over the size limit.
Transient, retried (``base.Retrying``): connection errors, timeouts, truncated bodies, 408,
429 and 5xx.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from agent.core.errors import PackageNotFound, PackageRejected, echo
from agent.core.uris import ParsedUri
from agent.install.fetch.base import (
    DownloadWatch,
    Fetched,
    FetchLimits,
    FetchTools,
    Space,
    Transient,
    download_failed,
    too_large,
)
from agent.install.fetch.landing import (
    MAX_PIECES,
    Digest,
    create_landing,
    hop,
    opening,
    write_pieces,
)
from agent.install.fetch.transport import Failure, Policy, Request, TransportError

log = logging.getLogger(__name__)

_RANGE_CHUNK = 64 * 1024  # a ranged GET's body is read in pieces of this size


class HttpFetcher:
    """The ``http`` and ``https`` schemes' fetcher."""

    def __init__(self, tools: FetchTools) -> None:
        self._transport = tools.transport
        self._limits = tools.limits
        self._retrying = tools.retrying
        self._headers = dict(tools.http_headers)  # the fetcher's own go on top

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """Any host: what the network lets the agent reach is the bound."""

    async def fetch(
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
            download_failed(label),
            label,
        )

    async def close(self) -> None:
        pass

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
        request = Request(url, {**self._headers, "Accept-Encoding": "identity"})
        policy = Policy(limits.connect_timeout_s, limits.read_timeout_s, limits.max_redirects)
        try:
            async with self._transport.open(request, policy) as resp:
                _check_status(resp.status, label)
                expected = resp.content_length
                if expected is not None and expected > limits.max_download_bytes:
                    raise too_large(label, limits.max_download_bytes, expected)
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
                            raise too_large(label, limits.max_download_bytes)
                        await space.take(total, size)
                        await hop(write_pieces, out, batch, digest)
                        total += size
                finally:
                    os.close(out)
                if expected is not None and total != expected:
                    raise Transient(f"body ended after {total} of {expected} bytes")
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
        headers = {**self._headers, "Accept-Encoding": "identity"}
        headers["Range"] = f"bytes={start}-{end - 1}"
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
            log.debug(
                "ranged GET of %s failed: %s",
                echo(url),
                exc,
                extra={"url": echo(url), "failure": exc.failure.value},
            )
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
    another try (``Transient``)."""
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
            return Transient(f"{exc.name}: {detail}")


def _check_status(status: int, label: str) -> None:
    """200 is a package; what is worth another try raises ``Transient``; the rest is final."""
    if status == 200:
        return
    if status in (404, 410):
        raise PackageNotFound(f"{label}: the server answered {status}")
    if status in (408, 429) or status >= 500:
        raise Transient(f"the server answered {status}")
    if 400 <= status < 500:
        raise PackageRejected(f"{label}: the server answered {status}")
    raise PackageRejected(f"{label}: the server answered {status}; a package is served with 200")
