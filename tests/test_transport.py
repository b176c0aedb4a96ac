"""The fetcher's HTTP outcomes over a ``MockTransport`` (no sockets), and the mock's own promises:
redirects followed as aiohttp follows them, a body longer than declared is no valid HTTP, the
stream is closed when the fetcher stops reading. The same outcomes over aiohttp and a real
server are pinned by test_fetch.py and test_hostile_fetch.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.core.errors import DownloadFailed, PackageRejected
from agent.core.uris import parse_uri
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.transport import (
    Failure,
    Handler,
    MockTransport,
    Request,
    Response,
    TransportError,
)
from tests.harness.packages import make_zip
from tests.harness.store_rig import RecordingSleep

BODY = make_zip({"proj/main.py": "print('hi')\n" * 50})
URL = "http://pkgs.test/p.zip"
LIMITS = FetchLimits(attempts=3, backoff_initial_s=0.5, backoff_max_s=1.5)


async def fetch(
    handler: Handler, dest: Path, *, limits: FetchLimits = LIMITS, url: str = URL
) -> tuple[int, MockTransport, RecordingSleep]:
    transport, sleep = MockTransport(handler), RecordingSleep()
    fetcher = Fetcher(transport, limits, sleep=sleep, rand=lambda: 0.0)
    try:
        size = await fetcher.fetch(parse_uri("working_dir", url), dest, label=url)
    finally:
        assert transport.open_streams == 0
    return size, transport, sleep


async def test_a_200_is_stored_byte_for_byte_after_asking_for_the_identity_encoding(
    tmp_path: Path,
) -> None:
    size, transport, sleep = await fetch(lambda _: Response(200, BODY), tmp_path / "out")
    assert size == len(BODY)
    assert (tmp_path / "out").read_bytes() == BODY
    assert transport.requests == [Request(URL, {"Accept-Encoding": "identity"}, "GET")]
    assert sleep.delays == []


async def test_408_is_retried_and_another_non_200_answer_is_final(tmp_path: Path) -> None:
    answers = iter([Response(408), Response(200, BODY)])
    size, transport, sleep = await fetch(lambda _: next(answers), tmp_path / "out")
    assert size == len(BODY)
    assert len(transport.requests) == 2
    assert sleep.delays == [0.5]

    with pytest.raises(PackageRejected) as refused:
        await fetch(lambda _: Response(204), tmp_path / "out")
    assert refused.value.message == f"{URL}: the server answered 204; a package is served with 200"


async def test_a_redirect_is_followed_with_the_same_headers(tmp_path: Path) -> None:
    def handler(request: Request) -> Response:
        if request.url == URL:
            return Response(302, headers={"Location": "/elsewhere/p.zip"})
        return Response(200, BODY)

    size, transport, _ = await fetch(handler, tmp_path / "out")
    assert size == len(BODY)
    assert [r.url for r in transport.requests] == [URL, "http://pkgs.test/elsewhere/p.zip"]
    assert {r.headers["Accept-Encoding"] for r in transport.requests} == {"identity"}


async def test_a_redirect_loop_is_final_after_max_redirects_answers(tmp_path: Path) -> None:
    calls = 0

    def loop(_: Request) -> Response:
        nonlocal calls
        calls += 1
        return Response(302, headers={"Location": URL})

    with pytest.raises(PackageRejected) as refused:
        await fetch(loop, tmp_path / "out")
    assert refused.value.message == f"{URL}: more than 10 redirects (max_redirects)"
    assert calls == 10  # as aiohttp sends them: test_hostile_fetch counts 10 on a real server


async def test_a_redirect_to_a_non_http_url_is_final(tmp_path: Path) -> None:
    def handler(_: Request) -> Response:
        return Response(301, headers={"location": "file:///etc/passwd"})

    with pytest.raises(PackageRejected) as refused:
        await fetch(handler, tmp_path / "out")
    assert refused.value.message == (
        f"{URL}: the server redirected to a URL the agent will not fetch: "
        "'file:///etc/passwd' (only http and https with a valid host)"
    )


async def test_a_body_longer_than_its_content_length_is_no_valid_http_and_final(
    tmp_path: Path,
) -> None:
    handler_calls = 0

    def handler(_: Request) -> Response:
        nonlocal handler_calls
        handler_calls += 1
        return Response(200, BODY + b"junk", {"Content-Length": str(len(BODY))})

    with pytest.raises(PackageRejected) as refused:
        await fetch(handler, tmp_path / "out")
    assert refused.value.message == (
        f"{URL}: the server's answer is not valid HTTP: "
        "'the body is longer than its Content-Length'"
    )
    assert handler_calls == 1


async def test_a_body_shorter_than_its_content_length_is_retried_then_download_failed(
    tmp_path: Path,
) -> None:
    def handler(_: Request) -> Response:
        return Response(200, BODY[:100], {"Content-Length": str(len(BODY))})

    with pytest.raises(DownloadFailed) as failed:
        await fetch(handler, tmp_path / "out")
    assert failed.value.message == (
        f"{URL}: download failed after 3 attempts: body ended after 100 of {len(BODY)} bytes"
    )


async def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(
    tmp_path: Path,
) -> None:
    read = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal read
        read += 1
        yield b"x"

    def handler(_: Request) -> Response:
        return Response(200, body(), {"Content-Length": "5000"})

    with pytest.raises(PackageRejected) as refused:
        await fetch(handler, tmp_path / "out", limits=FetchLimits(max_download_bytes=4999))
    assert refused.value.message == f"{URL} is 5000 bytes; the limit is 4999 (max_download_bytes)"
    assert read == 0


async def test_the_body_is_closed_when_the_fetcher_stops_reading_early(tmp_path: Path) -> None:
    closed = False

    async def endless() -> AsyncIterator[bytes]:
        nonlocal closed
        try:
            while True:
                yield b"z" * 1024
        finally:
            closed = True

    limits = FetchLimits(max_download_bytes=2048, chunk_bytes=1024)
    with pytest.raises(PackageRejected, match="max_download_bytes"):
        await fetch(lambda _: Response(200, endless()), tmp_path / "out", limits=limits)
    assert closed


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (Failure.BAD_CERTIFICATE, "the server's TLS certificate failed verification: 'why'"),
        (Failure.BAD_HOST, "a redirect named an invalid host name: 'why'"),
        (Failure.BAD_HTTP, "the server's answer is not valid HTTP: 'why'"),
    ],
)
async def test_a_final_transport_failure_is_package_rejected_after_one_request(
    tmp_path: Path, failure: Failure, says: str
) -> None:
    calls = 0

    def handler(_: Request) -> Response:
        nonlocal calls
        calls += 1
        raise TransportError(failure, "why")

    with pytest.raises(PackageRejected) as refused:
        await fetch(handler, tmp_path / "out")
    assert refused.value.message == f"{URL}: {says}"
    assert calls == 1
