"""Extraction while the download runs, through a real agent, its real unpack workers and a real
http server on 127.0.0.1: a large zip's entries are on disk before its last bytes are sent; a
tail that is not the download's, a retried download, a failed digest, a cancelled create and a
server without ranges all end as the plain download-then-extract would; a download the workers
wait on does not hold up another install."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import random
import zipfile
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from agent.install.unpack.overlap import OVERLAP_MIN_BYTES
from agent.install.unpack.plan import ArchiveLimits
from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until

BIG = "big.zip"
HELD = 1024 * 1024  # the last bytes the server holds back


def big_zip(seed: int = 3, *, first: str = "FIRST = 1\n") -> bytes:
    """A working dir over the overlap's threshold: a small module first, then incompressible
    data (stored), then many small files and a text file at the end."""
    rng = random.Random(seed)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("proj/first.py", first)
        zf.writestr("proj/data/blob.bin", rng.randbytes(OVERLAP_MIN_BYTES + 2**20), 0)
        for n in range(200):
            zf.writestr(f"proj/pkg/m{n}.py", f"X = {n}\n" * 20)
        zf.writestr("proj/data/table.txt", rng.randbytes(2**20).hex())
    return buf.getvalue()


def staged(a: RunningAgent, name: str) -> list[Path]:
    """``name`` under the agent's staging folders (an install's early extraction)."""
    return [p for p in (a.root / "tmp").rglob(name) if "unpacked" in p.parts[-3:-1]]


def installed_tree(reply: agent_pb2.CreateRuntimeEnvReply) -> dict[str, bytes]:
    """The files of the env's working dir, as the agent's reply names it."""
    folder = Path(reply.context.cwd)
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def tree_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {
            i.filename.removeprefix("proj/"): zf.read(i) for i in zf.infolist() if not i.is_dir()
        }


async def test_a_large_zip_is_on_disk_before_its_last_bytes_are_sent() -> None:
    data = big_zip()
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        release = server.hold_last(BIG, HELD)
        create = asyncio.ensure_future(a.create(env_json(working_dir=url)))
        await wait_until(lambda: bool(staged(a, "first.py")), timeout_s=30, what="first.py")
        assert not create.done()  # the download is still held: its end is not sent
        release.set()
        reply = await asyncio.wait_for(create, 30)
        assert installed_tree(reply) == tree_of(data)
        assert server.gets[BIG] == 1  # one download, and the tail read apart
        assert server.ranged[BIG] >= 1
        info = await a.info()
        assert info.cache.extractions == 1


async def test_a_tail_unlike_the_download_is_thrown_away_and_the_file_extracted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another object of the same size answers the ranged GET: the early extraction is not
    kept; the package is the downloaded file's."""
    data, other = big_zip(first="A = 1\n"), big_zip(first="B = 2\n")
    assert len(data) == len(other)
    assert data != other
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        server.package(BIG).range_body = other
        with caplog.at_level(logging.WARNING, logger="agent.install.unpack.overlap"):
            reply = await a.create(env_json(working_dir=url))
        assert installed_tree(reply) == tree_of(data)
        assert any("differs from the downloaded file" in r.getMessage() for r in caplog.records)


async def test_a_server_without_ranges_gets_the_plain_download() -> None:
    data = big_zip()
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        server.package(BIG).ranges = False  # no Accept-Ranges; a Range would be answered whole
        reply = await a.create(env_json(working_dir=url))
        assert installed_tree(reply) == tree_of(data)
        assert server.ranged[BIG] == 0
        assert server.gets[BIG] == 1  # no ranged GET sent, so no whole body sent twice


async def test_a_retried_download_throws_the_early_extraction_away() -> None:
    data = big_zip()
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        server.package(BIG).cuts = [len(data) - HELD]  # the first body ends early
        reply = await a.create(env_json(working_dir=url))
        assert installed_tree(reply) == tree_of(data)
        assert server.gets[BIG] == 2


async def test_a_failed_digest_fails_the_create_and_stops_the_early_extraction() -> None:
    data = big_zip()
    wrong = hashlib.sha256(b"another package").hexdigest()
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await a.create(env_json(working_dir=f"{url}#sha256={wrong}"))
        assert "sha256" in (failed.value.details() or "")
        await a.settle()
        assert a.agent._unpack is not None
        assert a.agent._unpack.busy == 0  # the workers were stopped and waited for
        await wait_until(lambda: not staged(a, "first.py"), what="the staging folder gone")
        assert a.uri_dirs() == []


async def test_a_cancelled_create_stops_the_workers_waiting_for_its_bytes() -> None:
    data = big_zip()
    async with package_server() as server, running_agent() as a:
        url = server.add(BIG, data)
        release = server.hold_last(BIG, HELD)
        try:
            create = asyncio.ensure_future(a.create(env_json(working_dir=url)))
            await wait_until(lambda: bool(staged(a, "first.py")), timeout_s=30, what="first.py")
            create.cancel()  # the client gone: its build is cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await create
            assert a.agent._unpack is not None
            pool = a.agent._unpack
            await wait_until(lambda: pool.busy == 0, what="the workers stopped")
            await wait_until(lambda: not staged(a, "first.py"), what="the staging folder gone")
        finally:
            release.set()
        small = server.add("small.zip", workdir_zip({"main.py": "OK = 1\n"}))
        reply = await a.create(env_json(working_dir=small))  # the pool serves on
        assert (Path(reply.context.cwd) / "main.py").read_text() == "OK = 1\n"


async def test_a_download_the_workers_wait_on_does_not_hold_up_another_install() -> None:
    """With one worker busy waiting for a held download, a small zip is still extracted: the
    pool starts one more process rather than queue it behind the download."""
    data = big_zip()
    async with package_server() as server, running_agent(extract_workers=1) as a:
        url = server.add(BIG, data)
        release = server.hold_last(BIG, HELD)
        try:
            big = asyncio.ensure_future(a.create(env_json(working_dir=url)))
            await wait_until(lambda: bool(staged(a, "first.py")), timeout_s=30, what="first.py")
            small = server.add("small.zip", workdir_zip({"main.py": "OK = 1\n"}))
            reply = await asyncio.wait_for(a.create(env_json(working_dir=small)), 30)
            assert (Path(reply.context.cwd) / "main.py").read_text() == "OK = 1\n"
            assert not big.done()
            assert a.agent._unpack is not None
            assert len(a.agent._unpack.pids) == 2
        finally:
            release.set()
        reply = await asyncio.wait_for(big, 30)
        assert installed_tree(reply) == tree_of(data)


async def test_an_archive_refused_by_its_tail_gives_the_plain_extractions_error() -> None:
    data = big_zip()
    limits = replace(ArchiveLimits(), max_uncompressed_bytes=2**20)
    async with package_server() as server, running_agent(archive=limits) as a:
        url = server.add(BIG, data)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await a.create(env_json(working_dir=url))
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "max_uncompressed_bytes" in (failed.value.details() or "")
        assert server.gets[BIG] == 1


async def test_with_overlap_off_a_large_zip_is_downloaded_then_extracted() -> None:
    data = big_zip()
    async with package_server() as server, running_agent(overlap_downloads=False) as a:
        url = server.add(BIG, data)
        reply = await a.create(env_json(working_dir=url))
        assert installed_tree(reply) == tree_of(data)
        assert server.ranged[BIG] == 0
        assert server.gets[BIG] == 1
