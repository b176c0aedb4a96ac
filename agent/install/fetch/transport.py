"""What the fetcher needs from HTTP, and two ways to give it: aiohttp, or a function.

The fetcher (``fetcher.py``) sends one GET (a ``Request``: method, URL, headers) bounded by a
``Policy`` (timeouts, redirects) and reads an ``Incoming`` answer: its status, its headers, its
Content-Length (a hint, never a limit) and its body as a stream of chunks of at most the size it
asks for, byte for byte as sent (no content decoding). The stream is closed when the context
``Transport.open`` returns is left, read to its end or not (an error, a cancelled install).

A transport follows redirects itself (at most ``Policy.max_redirects`` answers, only to http and
https URLs with a valid host; a redirect to another origin, scheme, host or port, drops the
request's ``Authorization`` header, as aiohttp does: a credential goes only where it was sent)
and reports every failure as a ``TransportError`` of one
``Failure`` kind; the fetcher decides what each kind means (final or worth another try) and
words the message. No foreign exception leaves a transport.

- ``AiohttpTransport(session)``: the real one, over the agent's ``aiohttp.ClientSession`` (made
  with ``trust_env=False``: no proxy or netrc from the environment).
- ``MockTransport(handler)``: no sockets, in the style of httpx's MockTransport. The handler maps
  a ``Request`` to a ``Response`` value (status, headers, body as bytes or an async iterable of
  chunks), or raises ``TransportError`` to stand for a failed connection. It lets the store and
  the service be tested without a server: what was asked (``requests``) is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, TypeVar
from urllib.parse import urljoin, urlsplit

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

_B = TypeVar("_B")  # what a body is read as: chunks or batches of them


@dataclass(frozen=True)
class Request:
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "GET"


@dataclass(frozen=True)
class Policy:
    """How one request is bounded (the fetcher's limits)."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # for the answer's head, then between two chunks of its body
    max_redirects: int = 10  # answers that are redirects, the last one refused


class Failure(Enum):
    """What went wrong, as the fetcher needs to tell it apart."""

    CONNECTION = "connection"  # refused, reset, timed out, a body cut short: worth another try
    TOO_MANY_REDIRECTS = "too_many_redirects"
    BAD_REDIRECT = "bad_redirect"  # to a URL that is not http(s) or not valid
    BAD_HOST = "bad_host"  # a redirect named a host that is no valid host name
    BAD_CERTIFICATE = "bad_certificate"  # the server's TLS certificate failed verification
    BAD_HTTP = "bad_http"  # the answer is not valid HTTP (a body longer than declared...)


class TransportError(Exception):
    """A failed exchange. ``detail`` is the transport's own words (the fetcher quotes them);
    ``name`` names the failure in a transient's message (the underlying exception's type)."""

    def __init__(self, failure: Failure, detail: str, *, name: str = "") -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail
        self.name = name or type(self).__name__


class Incoming(Protocol):
    """An answer whose body is still to be read."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...  # case-insensitive names

    @property
    def content_length(self) -> int | None:
        """The declared body size, if any: a hint for reserving space, never trusted as a
        bound (the fetcher counts the bytes that arrive)."""

    def chunks(self, size: int) -> AsyncIterator[bytes]:
        """The body, in chunks of at most ``size`` bytes; raises ``TransportError``. Read once
        (by this or ``batches``); closed with the answer, read to its end or not."""

    def batches(self, size: int, max_pieces: int) -> AsyncIterator[list[bytes]]:
        """The body as ``chunks`` gives it, its chunks gathered: a batch is what has arrived
        when it is taken (never waiting for more once one chunk is in), at most ``max_pieces``
        chunks, ended at the first chunk that brings it to ``size`` bytes or more."""


class Transport(Protocol):
    def open(self, request: Request, policy: Policy) -> AbstractAsyncContextManager[Incoming]:
        """Send ``request``, following redirects; the answer's stream is closed on exit.
        Raises ``TransportError``."""


# -- aiohttp ---------------------------------------------------------------------------------


class AiohttpTransport:
    """Over an ``aiohttp.ClientSession`` the caller owns (and closes)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    @asynccontextmanager
    async def open(self, request: Request, policy: Policy) -> AsyncIterator[Incoming]:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
        )
        try:
            resp = await self._session.request(
                request.method,
                request.url,
                timeout=timeout,
                allow_redirects=True,
                max_redirects=policy.max_redirects,
                auto_decompress=False,  # the body is the package, byte for byte
                headers=dict(request.headers),
            )
        except _AIOHTTP_ERRORS as exc:
            raise _converted(exc) from exc
        incoming = _AiohttpIncoming(resp)
        try:
            yield incoming
        finally:  # what ``async with resp`` does on exit: the connection is reused or closed
            await incoming.close()
            resp.release()
            try:
                await resp.wait_for_close()
            except _AIOHTTP_ERRORS as exc:
                raise _converted(exc) from exc


class _AiohttpIncoming:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._chunks: AsyncGenerator[object, None] | None = None

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    @property
    def content_length(self) -> int | None:
        return self._resp.content_length

    def chunks(self, size: int) -> AsyncIterator[bytes]:
        return self._start(self._read(size))

    def batches(self, size: int, max_pieces: int) -> AsyncIterator[list[bytes]]:
        return self._start(self._batched(size, max_pieces))

    def _start(self, body: AsyncGenerator[_B, None]) -> AsyncGenerator[_B, None]:
        assert self._chunks is None, "the body is read once"
        self._chunks = body
        return body

    async def _batched(self, size: int, max_pieces: int) -> AsyncGenerator[list[bytes], None]:
        content = self._resp.content
        taken = 0  # bytes of the body handed on; ``total_bytes``: the bytes aiohttp was fed
        batch: list[bytes] = []
        held = 0
        async with contextlib.aclosing(self._read(size)) as pieces:
            async for piece in pieces:
                batch.append(piece)
                held += len(piece)
                taken += len(piece)
                if held >= size or len(batch) >= max_pieces or content.total_bytes <= taken:
                    yield batch  # the next piece would be waited for: what is here goes now
                    batch, held = [], 0
        if batch:
            yield batch

    async def _read(self, size: int) -> AsyncGenerator[bytes, None]:
        # The pieces as aiohttp buffered them (one per read of the socket), cut only when over
        # ``size``: ``iter_chunked`` joined the buffered pieces into each chunk, a copy into
        # fresh memory on the event loop (0.3-0.6 ms per MiB here, the loop's longest step
        # during a download). ``batches`` gathers them for one write (``os.writev``).
        try:
            async for piece, _ in self._resp.content.iter_chunks():
                if not piece:  # the end of an http chunk, no data
                    continue
                if len(piece) <= size:
                    yield piece
                    continue
                view = memoryview(piece)
                for start in range(0, len(piece), size):
                    yield bytes(view[start : start + size])
        except _AIOHTTP_ERRORS as exc:
            raise _converted(exc) from exc

    async def close(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()


_AIOHTTP_ERRORS = (aiohttp.ClientError, UnicodeError, TimeoutError, ConnectionError)


def _converted(exc: BaseException) -> TransportError:
    """aiohttp's exceptions as failures; the order matters (subclasses first)."""
    if isinstance(exc, aiohttp.TooManyRedirects):
        return TransportError(Failure.TOO_MANY_REDIRECTS, str(exc))
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return TransportError(Failure.BAD_REDIRECT, str(exc))
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):  # not before the cert changes
        return TransportError(Failure.BAD_CERTIFICATE, str(exc.certificate_error))
    if isinstance(exc, aiohttp.ClientResponseError):  # the parser's: not a status we looked at
        return TransportError(Failure.BAD_HTTP, exc.message)
    if isinstance(exc, UnicodeError):  # the idna codec, on a host a redirect named
        return TransportError(Failure.BAD_HOST, str(exc))
    return TransportError(Failure.CONNECTION, str(exc), name=type(exc).__name__)


# -- a function ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """What a ``MockTransport`` handler answers. A bytes body declares its Content-Length
    unless ``headers`` says otherwise (a lie is allowed: a shorter body is a truncated one, a
    longer one is no valid HTTP); an async iterable body declares none unless told."""

    status: int = 200
    body: bytes | AsyncIterable[bytes] = b""
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response | Awaitable[Response]]
_REDIRECTS = (301, 302, 303, 307, 308)


class MockTransport:
    """A transport that calls ``handler`` instead of a server (sync or async). Redirects are
    followed as aiohttp follows them. ``read_timeout_s`` bounds an async handler and each body
    chunk, as a server that stops sending would be; ``connect_timeout_s`` has nothing to bound.

    ``requests``: every request the handler was given, redirects included, in order.
    ``open_streams``: answers handed to the fetcher and not yet closed."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.requests: list[Request] = []
        self.open_streams = 0

    @asynccontextmanager
    async def open(self, request: Request, policy: Policy) -> AsyncIterator[Incoming]:
        response = await self._follow(request, policy)
        try:
            incoming = _MockIncoming(response, policy.read_timeout_s)
        except TransportError:
            await _discard(response.body)
            raise
        self.open_streams += 1
        try:
            yield incoming
        finally:
            self.open_streams -= 1
            await incoming.close()

    async def _follow(self, request: Request, policy: Policy) -> Response:
        redirects = 0
        while True:
            response = await self._call(request, policy)
            location = _header(response.headers, "Location")
            if response.status not in _REDIRECTS or location is None:
                return response
            await _discard(response.body)
            redirects += 1
            if redirects >= policy.max_redirects:
                raise TransportError(Failure.TOO_MANY_REDIRECTS, request.url)
            url = urljoin(request.url, location)
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise TransportError(Failure.BAD_REDIRECT, url)
            headers = request.headers
            if _origin(url) != _origin(request.url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            request = Request(url, headers, request.method)

    async def _call(self, request: Request, policy: Policy) -> Response:
        self.requests.append(request)
        answer = self._handler(request)
        if inspect.isawaitable(answer):
            try:
                async with asyncio.timeout(policy.read_timeout_s):
                    return await answer
            except TimeoutError as exc:
                raise _read_timeout() from exc
        return answer


class _MockIncoming:
    def __init__(self, response: Response, read_timeout_s: float) -> None:
        self._response = response
        self._read_timeout_s = read_timeout_s
        self._headers = CIMultiDictProxy(CIMultiDict(response.headers))
        declared = _header(response.headers, "Content-Length")
        if declared is None and isinstance(response.body, bytes):
            declared = str(len(response.body))
        if declared is not None and not declared.isdigit():
            raise TransportError(Failure.BAD_HTTP, f"invalid Content-Length {declared!r}")
        self._declared = int(declared) if declared is not None else None
        body = response.body
        self._body = _one(body) if isinstance(body, bytes) else aiter(body)
        self._chunks: AsyncGenerator[object, None] | None = None

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def content_length(self) -> int | None:
        return self._declared

    def chunks(self, size: int) -> AsyncIterator[bytes]:
        return self._start(self._read(size))

    def batches(self, size: int, max_pieces: int) -> AsyncIterator[list[bytes]]:
        return self._start(self._batched(size))

    def _start(self, body: AsyncGenerator[_B, None]) -> AsyncGenerator[_B, None]:
        assert self._chunks is None, "the body is read once"
        self._chunks = body
        return body

    async def _batched(self, size: int) -> AsyncGenerator[list[bytes], None]:
        async with contextlib.aclosing(self._read(size)) as chunks:
            async for chunk in chunks:  # each is all that has arrived when it is taken
                yield [chunk]

    async def _read(self, size: int) -> AsyncGenerator[bytes, None]:
        sent = 0
        while True:
            try:
                async with asyncio.timeout(self._read_timeout_s):
                    piece = await anext(self._body, None)
            except TimeoutError as exc:
                raise _read_timeout() from exc
            if piece is None:
                return
            for start in range(0, len(piece), size):
                chunk = piece[start : start + size]
                if self._declared is not None and sent + len(chunk) > self._declared:
                    raise TransportError(
                        Failure.BAD_HTTP, "the body is longer than its Content-Length"
                    )
                sent += len(chunk)
                yield chunk

    async def close(self) -> None:
        """Close the handler's body, as aiohttp releases a connection: read to its end or not."""
        if self._chunks is not None:
            await self._chunks.aclose()
        await _discard(self._body)


async def _one(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body


async def _discard(body: object) -> None:
    """Close a handler's body that will not be read (further), if it can be closed."""
    aclose = getattr(body, "aclose", None)
    if aclose is not None:
        await aclose()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def _read_timeout() -> TransportError:
    return TransportError(
        Failure.CONNECTION, "Timeout on reading data from socket", name="ServerTimeoutError"
    )


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    """A URL's origin (scheme, host, port), the default port spelled out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)
