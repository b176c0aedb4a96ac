"""Disk pressure on a real, small tmpfs as the agent's root: an install that would leave less
than min-free-disk (its download's declared size reserved before the first byte) evicts unused
packages first, then fails RESOURCE_EXHAUSTED naming what it needs and what is free; a real
ENOSPC mid-install leaves no partial files; the agent keeps serving. More cases of the floor
held while a download runs: tests/test_hostile_fetch.py.

Needs root (mount); each test is skipped with the reason when a tmpfs cannot be mounted.
"""

from __future__ import annotations

import asyncio
import os
import re
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from agent.install.disk.root import DiskFloor, unpack_reservation
from agent.install.unpack.plan import ArchiveLimits
from tests.harness.disk import TMPFS_BYTES, MiB, floor, free_bytes, noise_zip, tmpfs
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, make_zip

RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@asynccontextmanager
async def agent_on(fs: Path, *, min_free_disk: DiskFloor) -> AsyncIterator[RunningAgent]:
    """A real agent whose root is on the tmpfs ``fs``."""
    async with running_agent(root=fs / "root", min_free_disk=min_free_disk) as a:
        yield replace(a, root=fs / "root")


async def cache_unused(a: RunningAgent, pkgs: PackageServer, names: list[str]) -> list[str]:
    """Install each package and release it: unused, cached, in this LRU order. Return its dirs."""
    dirs = []
    for name in names:
        before = set(a.uri_dirs())
        reply = await a.create(env_json(f"{pkgs.base_url}/{name}"))
        [added] = set(a.uri_dirs()) - before
        dirs.append(added)
        assert await a.delete(reply.runtime_env_id) == 0
    info = await a.info()
    assert {u.state for u in info.uris} == {"unused"}
    return dirs


async def assert_clean_and_serving(
    a: RunningAgent, pkgs: PackageServer, *, install: bool = True
) -> None:
    """No staging or trash left (in the agent's own folders under tmp/ and trash/), no
    reference held; a create (of a small package, or of env
    vars only where the floor leaves no room at all) still works."""
    await a.settle()
    assert (listed(a.root, "tmp"), listed(a.root, "trash")) == ([], [])
    assert len(a.service.tables) == 0
    a.service.check_invariants()
    if not install:
        reply = await a.create(env_json(env_vars={"AFTER": "pressure"}))
        assert reply.context.env_vars["AFTER"] == "pressure"
        assert await a.delete(reply.runtime_env_id) == 0
        return
    url = pkgs.add("small.zip", make_zip({"proj/ok.txt": "ok"}))
    reply = await a.create(env_json(url, env_vars={"AFTER": "pressure"}))
    assert (Path(reply.context.cwd) / "ok.txt").read_text() == "ok"
    assert await a.delete(reply.runtime_env_id) == 0


async def test_install_crossing_the_floor_evicts_the_oldest_unused_package_then_succeeds() -> None:
    with tmpfs() as fs:
        async with package_server() as pkgs:
            for name in ("p1.zip", "p2.zip", "p3.zip"):
                pkgs.add(name, noise_zip(MiB))
            new = noise_zip(MiB)
            url = pkgs.add("new.zip", new)
            # Fill the cache, then restart with a floor that the new package (its zip, then as
            # much unpacked) crosses by half a package: one eviction makes room.
            async with agent_on(fs, min_free_disk=floor(0)) as a:
                p1, p2, p3 = await cache_unused(a, pkgs, ["p1.zip", "p2.zip", "p3.zip"])
            limit = free_bytes(fs) - len(new) - MiB // 2
            async with agent_on(fs, min_free_disk=floor(limit)) as a:
                assert a.agent.recovery.rows_kept == 3
                reply = await a.create(env_json(url))
                assert (Path(reply.context.cwd) / "data.bin").stat().st_size == MiB
                info = await a.info()
                assert info.cache.evictions == 1
                assert p1 not in a.uri_dirs(), (
                    "the least recently used package was not the one evicted"
                )
                assert {p2, p3} <= set(a.uri_dirs())
                assert sorted(u.state for u in info.uris) == ["ready", "unused", "unused"]
                assert await a.delete(reply.runtime_env_id) == 0
                await assert_clean_and_serving(a, pkgs)


async def test_install_too_large_even_after_evicting_everything_is_resource_exhausted() -> None:
    with tmpfs() as fs:
        async with package_server() as pkgs:
            for name in ("p1.zip", "p2.zip"):
                pkgs.add(name, noise_zip(MiB))
            big = pkgs.add("big.zip", noise_zip(3 * MiB))
            limit = 4 * MiB
            async with agent_on(fs, min_free_disk=floor(limit)) as a:
                await cache_unused(a, pkgs, ["p1.zip", "p2.zip"])
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await a.create(env_json(big))
                details = caught.value.details() or ""
                assert caught.value.code() == RESOURCE_EXHAUSTED, details
                match = re.search(
                    rf"installing needs {3 * MiB} bytes and keeps {limit} free \(the "
                    r"min-free-disk setting\), but (\d+) bytes are free on the agent's disk "
                    r"after evicting [02] unused package\(s\)",  # 2 for the zip, before its GET
                    details,
                )
                assert match is not None, details
                assert 0 < int(match.group(1)) - 3 * MiB < limit, details
                assert pkgs.gets["big.zip"] == 1
                assert (a.uri_dirs(), (await a.info()).cache.evictions) == ([], 2)
                await assert_clean_and_serving(a, pkgs)


async def test_floor_already_crossed_refuses_before_downloading() -> None:
    with tmpfs() as fs:
        async with package_server() as pkgs:
            url = pkgs.add("p.zip", noise_zip(MiB))
            too_much = TMPFS_BYTES + MiB
            async with agent_on(fs, min_free_disk=floor(too_much)) as a:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await a.create(env_json(url))
                details = caught.value.details() or ""
                assert caught.value.code() == RESOURCE_EXHAUSTED, details
                assert re.search(
                    rf"p.zip: \d+ bytes are free on the agent's disk and the agent keeps "
                    rf"{too_much} free \(the min-free-disk setting\), after evicting 0 unused "
                    r"package\(s\): nothing can be installed until space is freed",
                    details,
                ), details
                assert pkgs.gets["p.zip"] == 0, "it downloaded with no room for the result"
                assert a.uri_dirs() == []
                await assert_clean_and_serving(a, pkgs, install=False)


async def test_enospc_while_unpacking_is_resource_exhausted_and_leaves_no_partial_files() -> None:
    """Thousands of 1-byte files: the zip declares a few KiB, but each file takes a page of the
    tmpfs, so the extraction itself runs out of space (the floor is 0)."""
    with tmpfs() as fs:
        async with package_server() as pkgs:
            files = {f"proj/f{i:05}.txt": b"x" for i in range(2500)}
            url = pkgs.add("many.zip", make_zip(files, compression=zipfile.ZIP_STORED))
            async with agent_on(fs, min_free_disk=floor(0)) as a:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await a.create(env_json(url))
                details = caught.value.details() or ""
                assert caught.value.code() == RESOURCE_EXHAUSTED, details
                assert f"working_dir:{url}: no space left on the agent's disk" in details
                cache = (await a.info()).cache
                assert (cache.downloads, cache.extractions) == (1, 0), "not mid-extraction"
                assert a.uri_dirs() == []
                assert list(a.service.store.entries()) == []
                await assert_clean_and_serving(a, pkgs)


async def test_disk_filled_while_a_download_waits_is_refused_by_the_floor_then_serves() -> None:
    """The disk fills (outside the agent's control) while the download is held at the server:
    its Content-Length no longer fits, so it is refused before writing, with the figures."""
    with tmpfs() as fs:
        async with package_server() as pkgs:
            url = pkgs.add("wd.zip", noise_zip(2 * MiB))
            gate = pkgs.hold("wd.zip")
            filler = fs / "filler"
            try:
                async with agent_on(fs, min_free_disk=floor(0)) as a:
                    create = asyncio.create_task(a.create(env_json(url)))
                    await asyncio.wait_for(pkgs.requested("wd.zip").wait(), 10)
                    with filler.open("wb") as f:
                        os.posix_fallocate(f.fileno(), 0, free_bytes(fs) - 128 * 1024)
                    gate.set()
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await asyncio.wait_for(create, 30)
                    details = caught.value.details() or ""
                    assert caught.value.code() == RESOURCE_EXHAUSTED, details
                    body = len(pkgs._packages["wd.zip"].body)
                    assert f"installing needs {body} bytes and keeps 0 free" in details
                    assert (await a.info()).cache.downloads == 0, "not mid-download"
                    await a.settle()
                    assert (a.uri_dirs(), listed(a.root, "tmp")) == ([], [])
                    filler.unlink()
                    reply = await a.create(env_json(url))
                    assert (Path(reply.context.cwd) / "data.bin").stat().st_size == 2 * MiB
                    assert pkgs.gets["wd.zip"] == 2
                    assert await a.delete(reply.runtime_env_id) == 0
                    await assert_clean_and_serving(a, pkgs)
            finally:
                gate.set()
                filler.unlink(missing_ok=True)


def test_a_zip_the_extraction_will_refuse_reserves_no_disk_and_evicts_nothing() -> None:
    """Pure: the space reserved for unpacking is what the zip declares, unless the extraction
    refuses it before writing (over max_uncompressed_bytes, or a bomb's ratio): then none, so a
    lying central directory never flushes the cache."""
    limits = ArchiveLimits(max_uncompressed_bytes=100 * MiB, max_ratio=10, ratio_floor_bytes=MiB)
    assert unpack_reservation(5 * MiB, MiB, limits) == 5 * MiB
    assert unpack_reservation(101 * MiB, 50 * MiB, limits) == 0  # over max_uncompressed_bytes
    assert unpack_reservation(20 * MiB, MiB, limits) == 0  # ratio 20 over 10, above the floor
    assert unpack_reservation(MiB // 2, 1, limits) == MiB // 2  # ratio high, but under the floor
