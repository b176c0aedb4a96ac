"""Fetcher tests against a real aiohttp package server on 127.0.0.1, with a recorded sleep."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.core.errors import (
    DownloadFailed,
    ErrorKind,
    IntegrityError,
    PackageNotFound,
    PackageRejected,
)
from agent.core.uris import SCHEMES, parse_uri
from agent.install.fetch import file as fetch_file
from agent.install.fetch import http as fetch_http
from agent.install.fetch import landing as landing_module
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import FETCHERS, Fetcher
from agent.install.fetch.transport import AiohttpTransport, MockTransport, Policy, Request, Response
from tests.harness.package_server import package_server, route_server
from tests.harness.packages import make_zip
from tests.harness.polling import wait_until

BODY = make_zip({"proj/main.py": "print('hi')\n" * 50})
LIMITS = FetchLimits(attempts=4, backoff_initial_s=0.5, backoff_max_s=1.5)


class RecordingSleep:
    """Stands in for asyncio.sleep: records each backoff delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


async def fetch(
    url: str,
    dest: Path,
    *,
    limits: FetchLimits = LIMITS,
    sleep: RecordingSleep | None = None,
    rand: Callable[[], float] = lambda: 0.0,
) -> int:
    """Fetch with a recorded sleep; the jitter's random source gives 0 unless told (no jitter)."""
    async with aiohttp.ClientSession() as session:
        fetcher = Fetcher(session, limits, sleep=sleep or RecordingSleep(), rand=rand)
        return await fetcher.fetch(parse_uri("working_dir", url), dest, label=url)


def test_every_scheme_the_core_parses_has_a_fetcher_and_no_other_has_one() -> None:
    """A scheme is one entry in each table: the core's (how its URIs are checked, its traits)
    and the install layer's (how its packages are fetched); in one and not the other, a URI
    would parse and then have no fetcher, or a fetcher would never be reached."""
    assert list(FETCHERS) == list(SCHEMES)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- http ---------------------------------------------------------------------------------------


async def test_http_download_writes_the_body_and_returns_its_size(tmp_path: Path) -> None:
    sleep = RecordingSleep()
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY)
        assert await fetch(url, tmp_path / "out", sleep=sleep) == len(BODY)
        assert pkgs.gets["p.zip"] == 1
    assert (tmp_path / "out").read_bytes() == BODY
    assert sleep.delays == []


async def test_a_body_sent_a_few_bytes_at_a_time_is_written_whole_in_bounded_writevs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body's pieces are gathered and written by one ``writev`` per hop, never more pieces
    than ``MAX_PIECES`` (a server that trickles makes many small ones; the kernel takes at
    most IOV_MAX), and a write the kernel takes only part of is finished: the file is the
    body, byte for byte, and its pinned digest holds."""
    body = os.urandom(200_000)
    monkeypatch.setattr(fetch_http, "MAX_PIECES", 8)
    calls: list[int] = []
    real_writev = os.writev

    def partial_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        return real_writev(fd, [b"".join(buffers)[:250]])  # the kernel took 250 bytes at most

    monkeypatch.setattr(os, "writev", partial_writev)

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(len(body))})
        await response.prepare(request)
        for start in range(0, len(body), 100):
            await response.write(body[start : start + 100])
            await asyncio.sleep(0)  # the client reads between the writes
        await response.write_eof()
        return response

    async with route_server(trickle, "/p.zip") as base:
        digest = hashlib.sha256(body).hexdigest()
        assert await fetch(f"{base}/p.zip#sha256={digest}", tmp_path / "out") == len(body)
    assert (tmp_path / "out").read_bytes() == body
    assert max(calls) == 8, calls  # pieces gathered, up to the cap and no further
    assert len(calls) >= len(body) // 250  # each call took 250 bytes at most: all were finished


async def test_aiohttp_pieces_are_never_over_the_size_asked_and_make_the_body() -> None:
    """The aiohttp transport hands on the body in pieces of at most the size asked for (as
    read from the socket, a piece over it cut), which together are the body."""
    body = os.urandom(300_000)
    async with package_server() as pkgs, aiohttp.ClientSession() as session:
        url = pkgs.add("p.zip", body)
        policy = Policy(connect_timeout_s=10, read_timeout_s=10, max_redirects=0)
        async with AiohttpTransport(session).open(Request(url, {}), policy) as incoming:
            pieces = [piece async for piece in incoming.chunks(4096)]
    assert b"".join(pieces) == body
    assert max(len(p) for p in pieces) == 4096


async def test_what_has_arrived_is_on_disk_while_the_server_stalls(tmp_path: Path) -> None:
    """Pieces are gathered only while more are already there: a body that stops short of its
    end has all it sent written (an extraction that overlaps the download reads it), not held
    back until a chunk's worth has come."""
    body = os.urandom(300_000)
    out = tmp_path / "out"
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", body)
        gate = pkgs.hold_last("p.zip", 1000)
        task = asyncio.create_task(fetch(url, out))
        await wait_until(
            lambda: out.exists() and out.stat().st_size == len(body) - 1000,
            what="all but the held-back bytes on disk",
        )
        gate.set()
        assert await asyncio.wait_for(task, 30) == len(body)
    assert out.read_bytes() == body


async def test_transient_5xx_is_retried_then_succeeds(tmp_path: Path) -> None:
    sleep = RecordingSleep()
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[500, 503, 429])
        assert await fetch(url, tmp_path / "out", sleep=sleep) == len(BODY)
        assert pkgs.gets["p.zip"] == 4
    assert sleep.delays == [0.5, 1.0, 1.5]
    assert (tmp_path / "out").read_bytes() == BODY


async def test_backoff_delays_double_and_are_capped(tmp_path: Path) -> None:
    sleep = RecordingSleep()
    limits = FetchLimits(attempts=6, backoff_initial_s=0.25, backoff_max_s=1.5)
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[500, 502, 503, 504, 500])
        assert await fetch(url, tmp_path / "out", limits=limits, sleep=sleep) == len(BODY)
        assert pkgs.gets["p.zip"] == 6
    assert sleep.delays == [0.25, 0.5, 1.0, 1.5, 1.5]


async def test_backoff_delays_are_shortened_by_the_injected_jitter(tmp_path: Path) -> None:
    """Each delay loses up to backoff_jitter of itself, drawn from the injected source: many
    agents retrying one failed server do not retry in step."""
    sleep = RecordingSleep()
    draws = iter([0.0, 0.5, 0.999])
    limits = FetchLimits(attempts=4, backoff_initial_s=1.0, backoff_max_s=4.0, backoff_jitter=0.5)
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[500, 500, 500])
        await fetch(url, tmp_path / "out", limits=limits, sleep=sleep, rand=lambda: next(draws))
    assert sleep.delays == pytest.approx([1.0, 2.0 * 0.75, 4.0 * (1 - 0.4995)])


async def test_gives_up_after_attempts_with_download_failed(tmp_path: Path) -> None:
    sleep = RecordingSleep()
    limits = FetchLimits(attempts=3, backoff_initial_s=0.5, backoff_max_s=5.0)
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[503] * 10)
        with pytest.raises(DownloadFailed) as info:
            await fetch(url, tmp_path / "out", limits=limits, sleep=sleep)
        assert pkgs.gets["p.zip"] == 3
    assert info.value.kind is ErrorKind.UNAVAILABLE
    assert f"{url}: download failed after 3 attempts" in info.value.message
    assert "503" in info.value.message
    assert sleep.delays == [0.5, 1.0]  # no sleep after the last attempt


@pytest.mark.parametrize("status", [404, 410])
async def test_not_found_is_package_not_found_at_once(tmp_path: Path, status: int) -> None:
    sleep = RecordingSleep()
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[status])
        with pytest.raises(PackageNotFound) as info:
            await fetch(url, tmp_path / "out", sleep=sleep)
        assert pkgs.gets["p.zip"] == 1
    assert info.value.kind is ErrorKind.NOT_FOUND
    assert f"answered {status}" in info.value.message
    assert sleep.delays == []


async def test_unknown_package_404_is_package_not_found(tmp_path: Path) -> None:
    async with package_server() as pkgs:
        with pytest.raises(PackageNotFound):
            await fetch(f"{pkgs.base_url}/missing.zip", tmp_path / "out")
        assert pkgs.gets["missing.zip"] == 1


@pytest.mark.parametrize("status", [403, 401, 400])
async def test_other_4xx_is_package_rejected_at_once(tmp_path: Path, status: int) -> None:
    sleep = RecordingSleep()
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY, statuses=[status])
        with pytest.raises(PackageRejected) as info:
            await fetch(url, tmp_path / "out", sleep=sleep)
        assert pkgs.gets["p.zip"] == 1
    assert info.value.kind is ErrorKind.REFUSED
    assert f"answered {status}" in info.value.message
    assert sleep.delays == []


async def test_body_over_max_download_bytes_is_package_rejected(tmp_path: Path) -> None:
    limits = FetchLimits(max_download_bytes=len(BODY) - 1)
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY)
        with pytest.raises(PackageRejected) as info:
            await fetch(url, tmp_path / "out", limits=limits)
        assert pkgs.gets["p.zip"] == 1
        assert await fetch(url, tmp_path / "ok", limits=FetchLimits(max_download_bytes=len(BODY)))
    assert f"is {len(BODY)} bytes; the limit is {len(BODY) - 1}" in info.value.message
    assert "max_download_bytes" in info.value.message


async def test_sha256_mismatch_is_integrity_error_and_a_match_passes(tmp_path: Path) -> None:
    good = hashlib.sha256(BODY).hexdigest()
    bad = hashlib.sha256(b"other").hexdigest()
    sleep = RecordingSleep()
    async with package_server() as pkgs:
        url = pkgs.add("p.zip", BODY)
        with pytest.raises(IntegrityError) as info:
            await fetch(f"{url}#sha256={bad}", tmp_path / "bad", sleep=sleep)
        assert pkgs.gets["p.zip"] == 1  # never retried
        assert await fetch(f"{url}#sha256={good.upper()}", tmp_path / "good") == len(BODY)
    assert info.value.kind is ErrorKind.REFUSED
    assert f"is {good}, the URI expects {bad}" in info.value.message
    assert sleep.delays == []
    assert (tmp_path / "good").read_bytes() == BODY


async def test_the_digest_is_taken_as_the_chunks_are_written_never_by_reading_the_file_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``#sha256=``: each chunk is hashed in the hop that writes it (the whole file was read
    again after the download); a retried download's digest is of its own bytes only (the first
    attempt's body was cut short after a few chunks)."""
    opened: list[str] = []

    def no_read_back(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        raise AssertionError(f"the fetcher opened {path} ({mode})")

    for module in (fetch_http, landing_module):  # where a download is written
        monkeypatch.setattr(module, "open", no_read_back, raising=False)
    good = hashlib.sha256(BODY).hexdigest()
    attempts: list[int] = []

    def handler(request: Request) -> Response:
        attempts.append(1)
        if len(attempts) == 1:  # declares the whole body, sends a third of it
            return Response(body=_chunks(BODY[: len(BODY) // 3]), headers=_length(BODY))
        return Response(body=_chunks(BODY), headers=_length(BODY))

    limits = FetchLimits(attempts=2, backoff_initial_s=0.0, chunk_bytes=1024)
    fetcher = Fetcher(MockTransport(handler), limits, sleep=RecordingSleep())
    uri = parse_uri("working_dir", f"http://pkgs/p.zip#sha256={good}")
    assert await fetcher.fetch(uri, tmp_path / "out", label="p") == len(BODY)
    assert len(attempts) == 2
    assert opened == []
    assert (tmp_path / "out").read_bytes() == BODY
    bad = parse_uri("working_dir", f"http://pkgs/p.zip#sha256={'0' * 64}")
    with pytest.raises(IntegrityError, match=f"is {good}, the URI expects {'0' * 64}"):
        await fetcher.fetch(bad, tmp_path / "bad", label="p")


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 1024):
        yield body[start : start + 1024]


def _length(body: bytes) -> dict[str, str]:
    return {"Content-Length": str(len(body))}


async def test_connection_refused_is_retried_then_download_failed(tmp_path: Path) -> None:
    sleep = RecordingSleep()
    limits = FetchLimits(attempts=3, backoff_initial_s=0.5, backoff_max_s=5.0)
    url = f"http://127.0.0.1:{closed_port()}/p.zip"
    with pytest.raises(DownloadFailed) as info:
        await fetch(url, tmp_path / "out", limits=limits, sleep=sleep)
    assert "download failed after 3 attempts" in info.value.message
    assert "ClientConnectorError" in info.value.message
    assert sleep.delays == [0.5, 1.0]


# -- file:// ------------------------------------------------------------------------------------


async def test_file_uri_is_copied(tmp_path: Path) -> None:
    source = tmp_path / "src.zip"
    source.write_bytes(BODY)
    digest = hashlib.sha256(BODY).hexdigest()
    assert await fetch(f"file://{source}#sha256={digest}", tmp_path / "out") == len(BODY)
    assert (tmp_path / "out").read_bytes() == BODY


async def test_file_uri_sha256_mismatch_is_integrity_error(tmp_path: Path) -> None:
    source = tmp_path / "src.zip"
    source.write_bytes(BODY)
    with pytest.raises(IntegrityError, match="the URI expects"):
        await fetch(f"file://{source}#sha256={'0' * 64}", tmp_path / "out")


async def test_missing_file_is_package_not_found(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/missing.zip"
    with pytest.raises(PackageNotFound) as info:
        await fetch(url, tmp_path / "out")
    assert info.value.message == f"{url}: no such file on this node"
    assert not (tmp_path / "out").exists()


async def test_directory_is_package_rejected(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(PackageRejected, match="is a directory; a package must be a zip file"):
        await fetch(f"file://{tmp_path}/pkg", tmp_path / "out")
    assert not (tmp_path / "out").exists()


async def test_file_over_max_download_bytes_is_package_rejected(tmp_path: Path) -> None:
    source = tmp_path / "src.zip"
    source.write_bytes(BODY)
    with pytest.raises(PackageRejected, match="max_download_bytes"):
        await fetch(f"file://{source}", tmp_path / "out", limits=FetchLimits(max_download_bytes=10))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("step", ["open_package", "create_landing"])
async def test_a_fetch_cancelled_while_a_file_is_being_opened_closes_what_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The opening runs in a thread that a cancellation cannot stop: it ends, and the
    descriptor it opened is closed rather than leaked (the package's, or the download's)."""
    source = tmp_path / "src.zip"
    source.write_bytes(BODY)
    entered, release = threading.Event(), threading.Event()
    real = getattr(fetch_file, step)

    def held(*args: Any) -> Any:
        entered.set()
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(fetch_file, step, held)
    before = set(os.listdir("/proc/self/fd"))
    task = asyncio.ensure_future(fetch(f"file://{source}", tmp_path / "out"))
    await wait_until(entered.is_set, what=f"{step} running in its thread")
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(
        lambda: set(os.listdir("/proc/self/fd")) <= before, what="no descriptor left open"
    )
