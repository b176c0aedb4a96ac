"""Everything a package folder holds is counted: a real agent on a unix socket installs a
working_dir from a real package server on 127.0.0.1, a worker-like process (a real child, cwd in
that folder) writes 10 MB into it, and once the env is deleted (the package's last reference
gone) the folder is re-measured: ``info`` (the agent's, and ``info --root``'s reading of the
shared index) and the budget pass see the bytes. A re-measure never writes back a package that
was evicted meanwhile, and a package taken again while measured is kept."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from agent.install.disk.root import Measured, measure_tree
from agent.ops.root_view import read_root
from agent.state.index import Found
from agent.state.state_db import UriRow
from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.index_holders import holder, rows
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until

MiB = 1024 * 1024
WRITTEN = 10 * MiB
# what a worker running `uv run` leaves in a shared working_dir: a venv's bytes, written by a
# process of its own, with its cwd in the folder
WORKER = """
import os, pathlib
target = pathlib.Path(".venv/lib/site-packages")
target.mkdir(parents=True)
with open(target / "blob.bin", "wb") as out:
    for _ in range(10):
        out.write(os.urandom(1024 * 1024))
"""


@asynccontextmanager
async def agent_and_server(
    **overrides: object,
) -> AsyncIterator[tuple[RunningAgent, PackageServer]]:
    async with package_server() as pkgs, running_agent(**overrides) as a:
        yield a, pkgs


async def create_working_dir(a: RunningAgent, pkgs: PackageServer, name: str) -> tuple[str, Path]:
    """An env with a working_dir from the package server: its id and the package's folder."""
    reply = await a.create(env_json(url_of(pkgs, name)))
    [uri] = [u for u in (await a.info()).uris if u.uri == url_of(pkgs, name)]
    return reply.runtime_env_id, Path(uri.local_path)


def url_of(pkgs: PackageServer, name: str) -> str:
    """The package ``name`` (a small working_dir) served (added again: the same bytes)."""
    return pkgs.add(name, workdir_zip({"main.py": "print('hi')\n"}))


def worker_writes(folder: Path) -> None:
    """A real process, cwd in the package's folder, writes 10 MB there and exits."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER], cwd=folder, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


async def package_size(a: RunningAgent, folder: Path) -> int:
    [uri] = [u for u in (await a.info()).uris if u.local_path == str(folder)]
    size: int = uri.size_bytes
    return size


async def test_bytes_a_worker_wrote_show_in_info_once_released() -> None:
    async with agent_and_server() as (a, pkgs):
        env_id, folder = await create_working_dir(a, pkgs, "wd.zip")
        installed = await package_size(a, folder)
        assert installed < MiB
        await asyncio.to_thread(worker_writes, folder)
        assert await a.delete(env_id) == 0

        async def counted() -> bool:
            return await package_size(a, folder) >= installed + WRITTEN

        await wait_until(counted, timeout_s=20, what="the package re-measured after its release")
        await a.service.store.caught_up()
        cache = (await a.info()).cache
        assert cache.unused_bytes >= installed + WRITTEN, cache
        assert cache.used_bytes == 0, cache
        # info --root: the shared index's row, read as that command reads it
        view = await asyncio.to_thread(read_root, a.root)
        [package] = [p for p in view.packages if p.dir == folder.name]
        assert package.size_bytes >= installed + WRITTEN, package
        assert view.total_bytes >= installed + WRITTEN


async def test_budget_pass_evicts_a_package_a_worker_grew_over_the_budget() -> None:
    """Budget 5 MB: an untouched released package stays; one a worker wrote 10 MB into is
    evicted by the pass its re-measure asks for."""
    async with agent_and_server(cache_budget_bytes=5 * MiB) as (a, pkgs):
        kept_id, kept = await create_working_dir(a, pkgs, "kept.zip")
        grown_id, grown = await create_working_dir(a, pkgs, "grown.zip")
        await asyncio.to_thread(worker_writes, grown)
        assert await a.delete(grown_id) == 0
        assert await a.delete(kept_id) == 0  # used last: the pass evicts the grown one first

        def evicted() -> bool:
            return not grown.exists()

        await wait_until(evicted, timeout_s=20, what="the grown package evicted over the budget")
        await a.settle()
        assert kept.is_dir(), "the untouched package fits the budget: kept"
        cache = (await a.info()).cache
        assert cache.evictions == 1, cache
        assert cache.unused_bytes <= 5 * MiB, cache


async def test_a_package_taken_again_while_measured_is_kept_and_counted() -> None:
    """Budget 5 MB: the package is created again while its walk runs (held again); the walk's
    10 MB are committed, and no pass evicts it while held; released again, it goes."""
    gate = threading.Event()
    walking = threading.Event()

    def held_walk(path: Path) -> Measured | None:
        walking.set()
        gate.wait(30)
        return measure_tree(path)

    async with agent_and_server(cache_budget_bytes=5 * MiB) as (a, pkgs):
        env_id, folder = await create_working_dir(a, pkgs, "again.zip")
        await asyncio.to_thread(worker_writes, folder)
        a.service.store.remeasures.measure = held_walk
        assert await a.delete(env_id) == 0
        await asyncio.to_thread(walking.wait, 30)
        reply = await a.create(env_json(url_of(pkgs, "again.zip")))
        a.service.store.pass_loop.ask()  # a pass while measured: the package is held
        gate.set()

        async def counted() -> bool:
            return await package_size(a, folder) >= WRITTEN

        await wait_until(counted, timeout_s=20, what="the walk's bytes committed")
        await a.settle()
        assert folder.is_dir(), "held again: never evicted, over the budget or not"
        a.service.store.remeasures.measure = measure_tree
        assert await a.delete(reply.runtime_env_id) == 0
        await wait_until(lambda: not folder.exists(), timeout_s=20, what="evicted once released")


async def test_a_package_evicted_while_measured_is_not_written_back(tmp_path: Path) -> None:
    """Another agent of the root evicts the package (and installs it again, a new folder under
    the same name) while this agent's walk runs: the walk's size goes nowhere."""
    gate = threading.Event()
    walking = threading.Event()

    def held_walk(path: Path) -> Measured | None:
        measured = measure_tree(path)
        walking.set()
        gate.wait(30)
        return measured

    async with agent_and_server() as (a, pkgs):
        env_id, folder = await create_working_dir(a, pkgs, "gone.zip")
        await asyncio.to_thread(worker_writes, folder)
        a.service.store.remeasures.measure = held_walk
        assert await a.delete(env_id) == 0
        await asyncio.to_thread(walking.wait, 30)
        peer = await holder(a.root)
        try:
            await a.service.store.db.notes.flush()  # this agent's reference dropped in the index
            swept = await peer.sweep(0)  # budget 0: the peer evicts every unused package
            [evicted] = [e.row for e in swept.evicted]
            assert evicted.dir == folder.name
            # installed again by the peer: another folder under the same name, its own size
            got = await peer.obtain((evicted.kind, evicted.uri), folder.name, take_ref=True)
            assert got.found is Found.CLAIMED
            folder.mkdir()
            row = UriRow(evicted.kind, evicted.uri, folder.name, 123, 1)
            assert await peer.record_install(row)
            gate.set()
            await a.settle()
            assert rows(a.root, "SELECT size FROM uris WHERE dir = ?", folder.name) == [(123,)]
        finally:
            gate.set()
            await peer.close()


def test_measure_tree_follows_no_link_and_counts_each_inode_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 100_000)
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a").write_bytes(b"y" * 1000)
    (pkg / "sub" / "a-again").hardlink_to(pkg / "a")
    (pkg / "to-outside").symlink_to(outside, target_is_directory=True)
    measured = measure_tree(pkg)
    assert measured is not None
    assert measured.complete
    assert 1000 <= measured.size < 2000, measured  # the link's own few bytes, never its target
    assert measure_tree(pkg / "to-outside") is None, "a link is no folder to measure"
    bounded = measure_tree(pkg, max_entries=1)
    assert bounded is not None
    assert not bounded.complete
