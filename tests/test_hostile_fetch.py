"""A hostile client on the socket, at the fetch door: every limit counts what was read and every
allowed root holds. Each case runs a real agent over a real unix socket; packages come from real
files, special files, and a real aiohttp server on 127.0.0.1 that misbehaves on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from agent.app.config import Settings
from agent.core.errors import echo
from agent.install.disk.root import DiskFloor
from agent.ops.server import Agent
from rtenv.v1 import agent_pb2_grpc
from tests.harness.disk import free_bytes, noise_zip, tmpfs
from tests.harness.in_process import FAST_FETCH, RunningAgent, listed
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip
from tests.harness.polling import wait_until
from tests.harness.rpc import rpc_refused
from tests.harness.tempdirs import short_tempdir

MiB = 1024**2
INSIDE = make_zip({"proj/who.txt": "inside"})
OUTSIDE = make_zip({"proj/who.txt": "outside"})
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


async def refused(
    a: RunningAgent, serialized: str, code: grpc.StatusCode, *words: str, **kw: Any
) -> str:
    """Create, expecting a refusal with ``code`` naming ``words``: its details; the agent then
    holds no reference."""
    details = await rpc_refused(a.create(serialized, **kw), code, *words)
    await a.settle()
    assert len(a.service.tables) == 0
    a.service.check_invariants()
    return details


async def assert_serving(a: RunningAgent, tmp: Path) -> None:
    """Nothing left in staging; a good package still installs."""
    await a.settle()
    assert listed(a.root, "tmp") == []
    good = tmp / "after.zip"
    good.write_bytes(make_zip({"proj/ok.txt": "ok"}))
    reply = await a.create(env_json(f"file://{good}"))
    assert (Path(reply.context.cwd) / "ok.txt").read_text() == "ok"
    assert await a.delete(reply.runtime_env_id) == 0


@asynccontextmanager
async def agent(**overrides: Any) -> AsyncIterator[RunningAgent]:
    """``running_agent`` with any setting overridden, the fetch limits included; with ``root``
    given, the returned handle points at it."""
    base = short_tempdir()
    settings = replace(Settings(root=base / "root"), fetch=FAST_FETCH)
    settings = replace(settings, **overrides)
    server = Agent(settings)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    try:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        yield RunningAgent(server, stub, settings.root)
    finally:
        await channel.close()
        await server.stop(grace=0.5)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = short_tempdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- special files: only a regular file is a package -------------------------------------------


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
async def test_a_device_is_refused_without_reading_it(device: str, tmp: Path) -> None:
    """Before: /dev/zero's size 0 passed max-download-bytes and was copied until the disk
    filled, in a thread no timeout could stop."""
    async with agent() as a:
        details = await refused(a, env_json(f"file://{device}"), FAILED_PRECONDITION)
        assert (
            f"file://{device} is a character device; a package must be a zip file, a regular file"
            in details
        )
        assert (await a.info()).cache.downloads == 0
        await assert_serving(a, tmp)


async def test_a_fifo_is_refused_at_once_not_waited_on(tmp: Path) -> None:
    """Before: INTERNAL with a traceback (copyfile's SpecialFileError). Opening a FIFO for
    reading would block until a writer came: the refusal must come without one."""
    fifo = tmp / "pkg.zip"
    os.mkfifo(fifo)
    async with agent() as a:
        started = time.monotonic()
        details = await refused(a, env_json(f"file://{fifo}"), FAILED_PRECONDITION)
        assert "is a FIFO (named pipe); a package must be a zip file, a regular file" in details
        assert time.monotonic() - started < 5
        await assert_serving(a, tmp)


async def test_a_unix_socket_is_refused(tmp: Path) -> None:
    """Before: INTERNAL (open() of a socket file fails with ENXIO, an unexpected OSError)."""
    path = tmp / "pkg.zip"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        async with agent() as a:
            details = await refused(a, env_json(f"file://{path}"), FAILED_PRECONDITION)
            assert "is a socket; a package must be a zip file, a regular file" in details
            await assert_serving(a, tmp)


async def test_a_proc_file_of_size_zero_is_bounded_by_the_bytes_read(tmp: Path) -> None:
    """/proc files report size 0 and yet hold bytes: the limit counts what was read. Before:
    the declared 0 passed max-download-bytes and the whole file was copied."""
    fetch = replace(FAST_FETCH, max_download_bytes=1024)
    async with agent(fetch=fetch) as a:
        assert os.stat("/proc/self/maps").st_size == 0
        details = await refused(a, env_json("file:///proc/self/maps"), FAILED_PRECONDITION)
        assert "file:///proc/self/maps is larger than 1024 bytes; the limit is 1024" in details
        await assert_serving(a, tmp)


# -- cancellation: a copy stops with its install -----------------------------------------------


def source_open(path: Path) -> bool:
    """Whether this process (the in-process agent) holds ``path`` open."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


async def test_a_cancelled_create_stops_the_copy_and_frees_its_space(tmp: Path) -> None:
    """A 900 MiB file copied 512 bytes a hop (so it lasts) onto a tmpfs; its create cancelled
    by the client, within half a second the copy itself has stopped: the source is closed,
    staging is empty, the tmpfs's space is back. Before: the copy ran on in its thread to the
    end, writing into an unlinked file. (A setup timeout keeps a build going:
    tests/test_slow_build.py.)"""
    source = tmp / "big.zip"
    with source.open("wb") as f:
        f.truncate(900 * MiB)  # sparse: reading it is fast, writing it fills the tmpfs
    with tmpfs(1024 * MiB) as fs:
        fetch = replace(FAST_FETCH, chunk_bytes=512)
        floor0 = DiskFloor(bytes_=0, percent=None)
        async with agent(root=fs / "root", fetch=fetch, min_free_disk=floor0) as a:
            before = free_bytes(fs)
            create = asyncio.ensure_future(a.create(env_json(f"file://{source}")))
            await wait_until(lambda: source_open(source), what="the copy started")
            create.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await create
            await wait_until(lambda: not source_open(source), timeout_s=0.5, what="copy stopped")
            await a.settle()
            assert listed(a.root, "tmp") == []
            assert before - free_bytes(fs) < MiB, "the cancelled copy's space was not freed"
            await assert_serving(a, tmp)


# -- allowed roots --------------------------------------------------------------------------


FLIPPER = """
import os, sys, time
link, a, b, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
tmp = link + ".new"
end = time.monotonic() + seconds
while time.monotonic() < end:
    for target in (a, b):
        os.symlink(target, tmp)
        os.replace(tmp, link)
"""


async def test_a_flipping_symlink_never_gets_an_outside_file_installed(tmp: Path) -> None:
    """A process flips a link inside the allowed root between an allowed zip and one outside,
    while 200 creates (each a fresh install: the cache budget is 0) read through it. Every
    create installs the inside zip or is PERMISSION_DENIED. Before: the check resolved the name,
    the copy opened it again, and 27 in 200 installed the outside file."""
    inside, outside = tmp / "inside", tmp / "outside"
    inside.mkdir()
    outside.mkdir()
    (inside / "good.zip").write_bytes(INSIDE)
    (outside / "evil.zip").write_bytes(OUTSIDE)
    link = inside / "pkg.zip"
    link.symlink_to(inside / "good.zip")
    flipper = subprocess.Popen(  # noqa: ASYNC220 - starting it does not wait
        [sys.executable, "-c", FLIPPER, str(link), str(inside / "good.zip"),
         str(outside / "evil.zip"), "60"],
    )  # fmt: skip
    outcomes: Counter[str] = Counter()
    denied = "PERMISSION_DENIED: evil.zip is outside"

    def racing() -> bool:  # at least 200 creates, and on until the flipper has won one
        done = sum(outcomes.values())
        return done < 200 or (outcomes[denied] == 0 and done < 2000)

    try:
        # the flipper is flipping (a loaded machine may start it late) before the creates go
        await wait_until(lambda: os.readlink(link).endswith("evil.zip"), what="link flipped")
        async with agent(allow_file_roots=(str(inside),), cache_budget_bytes=0) as a:
            deadline = time.monotonic() + 40
            while racing() and time.monotonic() < deadline:
                try:
                    reply = await a.create(env_json(f"file://{link}"))
                except grpc.aio.AioRpcError as exc:
                    why = (
                        "evil.zip is outside"
                        if "evil.zip' is outside" in (exc.details() or "")
                        else "?"
                    )
                    outcomes[f"{exc.code().name}: {why}"] += 1
                    continue
                outcomes[(Path(reply.context.cwd) / "who.txt").read_text()] += 1
                assert await a.delete(reply.runtime_env_id) == 0
            await a.settle()
            a.service.check_invariants()
    finally:
        flipper.kill()
        flipper.wait(timeout=10)
    assert outcomes["outside"] == 0, outcomes
    assert set(outcomes) <= {"inside", denied}, outcomes
    assert outcomes["inside"] >= 1, outcomes
    assert outcomes[denied] >= 1, f"the flipper never won a race: {outcomes}"


async def test_a_package_cached_before_the_roots_is_denied_after_a_restart_with_them(
    tmp: Path,
) -> None:
    """Installed while no roots were set, then the agent restarts with --allow-file-root: the
    cached copy is not handed out (PERMISSION_DENIED on every create naming it). Before: the
    cache served it as a hit."""
    inside, outside = tmp / "inside", tmp / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "pkg.zip").write_bytes(OUTSIDE)
    (inside / "pkg.zip").write_bytes(INSIDE)
    root = tmp / "root"
    evil, good = env_json(f"file://{outside}/pkg.zip"), env_json(f"file://{inside}/pkg.zip")
    async with agent(root=root) as a:
        reply = await a.create(evil)
        assert await a.delete(reply.runtime_env_id) == 0
        cached = a.uri_dirs()
    async with agent(root=root, allow_file_roots=(str(inside),)) as a:
        assert a.agent.recovery.rows_kept == 1
        for _ in range(2):
            details = await refused(a, evil, grpc.StatusCode.PERMISSION_DENIED)
            assert (
                f"{echo(f'{outside}/pkg.zip')} is outside the folders file:// packages" in details
            )
        assert (await a.info()).cache.hits == 0
        assert a.uri_dirs() == cached  # kept, not handed out: the roots may widen again
        reply = await a.create(good)
        assert (Path(reply.context.cwd) / "who.txt").read_text() == "inside"


async def test_allow_file_root_slash_allows_every_file(tmp: Path) -> None:
    """Before: '/' was compared as '//' and denied everything."""
    (tmp / "pkg.zip").write_bytes(INSIDE)
    async with agent(allow_file_roots=("/",)) as a:
        reply = await a.create(env_json(f"file://{tmp}/pkg.zip"))
        assert (Path(reply.context.cwd) / "who.txt").read_text() == "inside"


async def test_dot_dot_out_of_a_root_is_denied_before_opening(tmp: Path) -> None:
    """A guard: a name climbing out with '..' is refused on the name alone."""
    (tmp / "inside").mkdir()
    (tmp / "evil.zip").write_bytes(OUTSIDE)
    async with agent(allow_file_roots=(str(tmp / "inside"),)) as a:
        details = await refused(
            a, env_json(f"file://{tmp}/inside/../evil.zip"), grpc.StatusCode.PERMISSION_DENIED
        )
        assert f"{echo(f'{tmp}/evil.zip')} is outside the folders" in details


# -- host names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("a..b", "has an empty label"),
        ("x" * 64 + ".example", "has a label of 64 bytes; the limit is 63"),
        (".a", "has an empty label"),
        ("a%20b", "has a label with characters other than"),
    ],
)
async def test_a_malformed_host_is_invalid_argument_at_parse_time(host: str, why: str) -> None:
    """Before: INTERNAL from the idna codec, deep in the connection."""
    url = f"http://{host}/p.zip"
    async with agent() as a:
        details = await refused(a, env_json(url), grpc.StatusCode.INVALID_ARGUMENT)
        assert f"working_dir {url!r}: host" in details
        assert why in details


# -- a misbehaving server -------------------------------------------------------------------


class HostileServer:
    """A real aiohttp server on 127.0.0.1 whose answers lie in the ways servers do."""

    def __init__(self) -> None:
        self.gets: Counter[str] = Counter()
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.base_url = f"http://127.0.0.1:{port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.gets[name] += 1
        if name == "gzip-if-asked.zip":  # static gzip serving: only to a client that asks
            if "gzip" in request.headers.get("Accept-Encoding", ""):
                return _gzipped(INSIDE)
            return web.Response(body=INSIDE)
        if name == "gzip-always.zip":  # a CDN that ignores Accept-Encoding
            return _gzipped(INSIDE)
        if name == "to-file.zip":
            raise web.HTTPFound("file:///etc/passwd")
        if name == "to-bad-host.zip":
            raise web.HTTPFound("http://a..b/p.zip")
        if name == "loop.zip":
            raise web.HTTPFound(self.url("loop.zip"))
        if name.startswith("status-"):
            status = int(name.removeprefix("status-").removesuffix(".zip"))
            if self.gets[name] == 1 or status not in (408,):
                return web.Response(status=status, body=b"")
            return web.Response(body=INSIDE)
        return web.Response(status=404)


def _gzipped(body: bytes) -> web.Response:
    data = gzip.compress(body)
    return web.Response(body=data, headers={"Content-Encoding": "gzip"})


@asynccontextmanager
async def lying_server(answers: dict[str, bytes]) -> AsyncIterator[tuple[str, Counter[str]]]:
    """A bare asyncio server on 127.0.0.1 writing canned HTTP answers byte for byte (what no
    framework would send), then hanging up; yields its base URL and a count of requests."""
    gets: Counter[str] = Counter()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode().lstrip("/")
        gets[path] += 1
        writer.write(answers.get(path, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", gets
    finally:
        server.close()
        await server.wait_closed()


def _http(body: bytes, declared: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % declared + body


@asynccontextmanager
async def hostile_server() -> AsyncIterator[HostileServer]:
    server = HostileServer()
    await server.start()
    try:
        yield server
    finally:
        if server._runner is not None:
            await server._runner.cleanup()


async def test_a_package_served_gzip_to_clients_that_ask_is_fetched_as_identity() -> None:
    """Before: aiohttp asked for gzip, un-gzipped the body, compared it with the compressed
    Content-Length, and retried until UNAVAILABLE."""
    async with hostile_server() as srv, agent() as a:
        reply = await a.create(env_json(srv.url("gzip-if-asked.zip")))
        assert (Path(reply.context.cwd) / "who.txt").read_text() == "inside"
        assert srv.gets["gzip-if-asked.zip"] == 1


async def test_a_body_gzipped_regardless_is_stored_as_bytes_and_refused_once() -> None:
    """The body is the package byte for byte: a gzip stream is no zip, a permanent
    FAILED_PRECONDITION after one GET. Before: UNAVAILABLE after every retry."""
    async with hostile_server() as srv, agent() as a:
        details = await refused(a, env_json(srv.url("gzip-always.zip")), FAILED_PRECONDITION)
        assert "is not a readable zip archive" in details
        assert srv.gets["gzip-always.zip"] == 1


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("to-file.zip", "redirected to a URL the agent will not fetch"),
        ("to-bad-host.zip", "invalid host name"),
        ("loop.zip", "more than 10 redirects (max_redirects)"),
    ],
)
async def test_a_bad_redirect_is_a_permanent_failure(name: str, why: str) -> None:
    """Before: a redirect to file: and a redirect loop were retried until UNAVAILABLE (a retry
    that can never succeed); a redirect to a malformed host was INTERNAL from idna."""
    async with hostile_server() as srv, agent() as a:
        details = await refused(a, env_json(srv.url(name)), FAILED_PRECONDITION)
        assert why in details
        assert srv.gets[name] == (10 if name == "loop.zip" else 1)


async def test_408_is_retried_and_other_non_200_answers_are_refused_at_once() -> None:
    """408 (request timeout) is transient: the retry gets the package. 204 and a 300 without a
    Location are no package: FAILED_PRECONDITION naming the status, one GET. Before: 408 was
    refused at once, and 204's empty body was stored and then failed to unzip."""
    async with hostile_server() as srv, agent() as a:
        reply = await a.create(env_json(srv.url("status-408.zip")))
        assert (Path(reply.context.cwd) / "who.txt").read_text() == "inside"
        assert srv.gets["status-408.zip"] == 2
        assert await a.delete(reply.runtime_env_id) == 0
        for status in (204, 300):
            name = f"status-{status}.zip"
            details = await refused(a, env_json(srv.url(name)), FAILED_PRECONDITION)
            assert f"the server answered {status}; a package is served with 200" in details
            assert srv.gets[name] == 1


async def test_a_content_length_that_lies_is_never_retried_into_unavailable_wrongly() -> None:
    """More bytes sent than declared is no valid HTTP: FAILED_PRECONDITION after one GET, never
    past the declared bytes (before: aiohttp's parser error was taken for a transient failure
    and retried until UNAVAILABLE). Fewer sent than declared is a truncated body, which a
    network does: retried, then UNAVAILABLE (a guard). Nothing is left in staging."""
    answers = {
        "long.zip": _http(INSIDE + b"trailing junk" * 1000, len(INSIDE)),
        "short.zip": _http(INSIDE[:100], len(INSIDE)),
    }
    async with lying_server(answers) as (base, gets), agent() as a:
        details = await refused(a, env_json(f"{base}/long.zip"), FAILED_PRECONDITION)
        assert "the server's answer is not valid HTTP" in details
        assert gets["long.zip"] == 1
        details = await refused(a, env_json(f"{base}/short.zip"), grpc.StatusCode.UNAVAILABLE)
        assert gets["short.zip"] == FAST_FETCH.attempts
        assert listed(a.root, "tmp") == []


# -- the disk floor holds while a download runs ------------------------------------------------


@asynccontextmanager
async def agent_on_tmpfs(fs: Path, floor_bytes: int) -> AsyncIterator[RunningAgent]:
    floor = DiskFloor(bytes_=floor_bytes, percent=None)
    async with agent(root=fs / "root", min_free_disk=floor) as a:
        yield a


@contextmanager
def low_watermark(fs: Path) -> Iterator[list[int]]:
    """The least free space seen on ``fs`` while the block runs, sampled by a thread."""
    seen = [free_bytes(fs)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.001):
            seen[0] = min(seen[0], free_bytes(fs))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)


async def test_a_download_with_a_known_length_is_refused_before_crossing_the_floor() -> None:
    """20 MiB declared, 24 MiB free and an 8 MiB floor: refused up front with
    the real figures, free space never under the floor. Before: the floor was checked before
    the GET only ('needs 0 bytes'), and the download took free space down to 4 MiB."""
    with tmpfs(24 * MiB) as fs:
        async with package_server() as pkgs, agent_on_tmpfs(fs, 8 * MiB) as a:
            body = noise_zip(20 * MiB)
            url = pkgs.add("big.zip", body)
            with low_watermark(fs) as seen:
                details = await refused(a, env_json(url), grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert f"installing needs {len(body)} bytes and keeps {8 * MiB} free" in details
            assert seen[0] >= 8 * MiB, f"free space fell to {seen[0]}"
            await a.settle()
            assert listed(a.root, "tmp") == []


async def test_a_download_of_unknown_length_stops_at_the_floor() -> None:
    """No Content-Length (chunked): the floor is re-checked as bytes arrive, and the download
    stops before crossing it, saying how much it had written."""
    with tmpfs(24 * MiB) as fs:
        async with agent_on_tmpfs(fs, 8 * MiB) as a:
            body = noise_zip(20 * MiB)

            async def chunked(request: web.Request) -> web.StreamResponse:
                response = web.StreamResponse()
                response.enable_chunked_encoding()
                await response.prepare(request)
                for start in range(0, len(body), 256 * 1024):
                    await response.write(body[start : start + 256 * 1024])
                await response.write_eof()
                return response

            app = web.Application()
            app.router.add_get("/big.zip", chunked)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            assert site._server is not None
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
            try:
                with low_watermark(fs) as seen:
                    details = await refused(
                        a,
                        env_json(f"http://127.0.0.1:{port}/big.zip"),
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                    )
            finally:
                await runner.cleanup()
            assert "the download has written" in details
            assert f"keeps {8 * MiB} free" in details
            assert seen[0] >= 8 * MiB, f"free space fell to {seen[0]}"
            await a.settle()
            assert listed(a.root, "tmp") == []


async def test_a_download_in_flight_keeps_its_reservation_against_a_second_one() -> None:
    """On a 28 MiB tmpfs with a 4 MiB floor, a 6 MiB download streams slowly; a 19 MiB one
    would fit the free space, but not with what the first still expects to write: it is refused
    before its first byte, naming the bytes held by the install in flight; the first completes.
    Without the reservation both would stream until one was cut off midway."""
    with tmpfs(28 * MiB) as fs:
        async with package_server() as pkgs, agent_on_tmpfs(fs, 4 * MiB) as a:
            first = pkgs.add("first.zip", noise_zip(6 * MiB))
            second = pkgs.add("second.zip", noise_zip(19 * MiB))
            pkgs.slow("first.zip", 0.02)
            creating = asyncio.create_task(a.create(env_json(first)))
            await wait_until(
                lambda: any((a.root / "tmp").glob("*/*/package.zip")), what="first download"
            )
            details = await rpc_refused(
                a.create(env_json(second)), grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            assert "of them expected by other installs in flight" in details
            assert pkgs.gets["second.zip"] == 1
            reply = await asyncio.wait_for(creating, 60)
            assert (Path(reply.context.cwd) / "data.bin").stat().st_size == 6 * MiB
            assert await a.delete(reply.runtime_env_id) == 0


async def test_a_tls_certificate_that_fails_verification_is_final(tmp: Path) -> None:
    """A self-signed certificate will not verify on the next try either: FAILED_PRECONDITION at
    once, not UNAVAILABLE after every retry (before: a transient connection error)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    made = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
        "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await asyncio.wait_for(made.wait(), 60) == 0
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=INSIDE)

    app = web.Application()
    app.router.add_get("/p.zip", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        async with agent() as a:
            details = await refused(
                a, env_json(f"https://127.0.0.1:{port}/p.zip"), FAILED_PRECONDITION
            )
            assert "the server's TLS certificate failed verification" in details
    finally:
        await runner.cleanup()
