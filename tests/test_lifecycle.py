"""Lifecycle edges through the real agent: each ends with the counts and the disk as they should be.

Every scenario checks GetRuntimeEnvsInfo (envs, URI references and states, cache stats), the
directories (uris/, tmp/, trash/ once background deletions are done) and the invariants, and
then shows the agent still serves a good create.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.core.errors import echo
from agent.install.installers import zip_archive
from agent.install.unpack import archive
from agent.install.unpack import write as zip_write
from agent.install.unpack.plan import ArchiveLimits
from rtenv.v1 import agent_pb2
from tests.harness.in_process import (
    FAST_FETCH,
    RunningAgent,
    listed,
    running_agent,
    slow_passes,
    stray_cancellation,
)
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, make_zip, workdir_zip
from tests.harness.polling import wait_until
from tests.harness.rpc import rpc_refused

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
WD = "wd.zip"
GOOD = "good.zip"


def listing(a: RunningAgent, sub: str) -> list[str]:
    """What is under ``sub``: for tmp/ and trash/, what is in the agents' own folders there."""
    return listed(a.root, sub)


def on_disk(path: str | Path) -> bool:
    """Whether anything (a dangling symlink included) exists at ``path``; a direct, quick stat."""
    return os.path.lexists(path)


async def settled(a: RunningAgent, *, cached: int) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """No env holds a reference; ``cached`` URIs are unused on disk; tmp/ and trash/ empty."""
    await a.settle()
    info = await a.info()
    assert info.total_envs == 0
    assert len(a.service.tables) == 0
    assert [e for e in info.envs if e.state != "failed"] == []
    assert [(u.references, u.state) for u in info.uris] == [(0, "unused")] * cached
    assert sorted(Path(u.local_path).name for u in info.uris) == listing(a, "uris")
    assert (listing(a, "tmp"), listing(a, "trash")) == ([], [])
    assert info.cache.used_bytes == 0
    assert info.cache.unused_bytes == sum(u.size_bytes for u in info.uris)
    a.service.check_invariants()
    return info


async def still_serves(a: RunningAgent, pkgs: PackageServer) -> None:
    """A good create works after whatever went before, and its delete leaves it cached."""
    url = pkgs.add(GOOD, workdir_zip({"ok.py": "OK = 1\n"}))
    before = len(list(a.service.store.entries()))
    reply = await a.create(env_json(url, env_vars={"CHECK": "still-serves"}))
    assert (Path(reply.context.cwd) / "ok.py").is_file()
    assert await a.delete(reply.runtime_env_id) == 0
    await settled(a, cached=before + 1 if a.agent.settings.cache_budget_bytes else 0)


async def test_delete_during_create_is_refused_until_the_create_returns() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        gate = pkgs.hold(WD)
        create = asyncio.create_task(a.create(env_json(wd)))
        await asyncio.wait_for(pkgs.requested(WD).wait(), timeout=10)
        env_id = next(env_id for env_id, _ in a.service.tables.envs())
        await rpc_refused(a.delete(env_id), FAILED_PRECONDITION, "in flight")
        info = await a.info()
        assert [(e.references, e.state) for e in info.envs] == [(1, "creating")]
        assert [u.references for u in info.uris] == [1]
        a.service.check_invariants()

        gate.set()
        reply = await asyncio.wait_for(create, timeout=10)
        assert reply.runtime_env_id == env_id
        assert await a.delete(env_id) == 0
        await settled(a, cached=1)
        await still_serves(a, pkgs)


async def test_create_whose_client_deadline_passes_leaves_nothing() -> None:
    """A client deadline during the download: references given back, and the install, which
    nobody waits for any more, cancelled: no download counted, no file left."""
    async with package_server() as pkgs, running_agent(cache_budget_bytes=0) as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        gate = pkgs.hold(WD)
        request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(wd))
        call = a.stub.CreateRuntimeEnv(request, timeout=1.0)
        await asyncio.wait_for(pkgs.requested(WD).wait(), timeout=1.0)
        assert len(a.service.tables) == 1
        await rpc_refused(call, grpc.StatusCode.DEADLINE_EXCEEDED)
        await wait_until(lambda: len(a.service.tables) == 0, what="the create to give back")
        await wait_until(lambda: not list(a.service.store.entries()), what="the install to stop")
        a.service.check_invariants()
        gate.set()
        info = await settled(a, cached=0)
        assert (info.cache.downloads, info.cache.evictions) == (0, 0)
        await still_serves(a, pkgs)


async def test_install_whose_creates_were_all_cancelled_is_cancelled_and_leaves_nothing() -> None:
    """Both creates waiting on one download are cancelled: the download stops, its staging
    files go, and the next create downloads afresh."""
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        gate = pkgs.hold(WD)
        calls = [
            a.stub.CreateRuntimeEnv(
                agent_pb2.CreateRuntimeEnvRequest(
                    serialized_runtime_env=env_json(wd, [], {"N": n})
                ),
                timeout=30,
            )
            for n in ("1", "2")
        ]
        await wait_until(lambda: len(a.service.tables) == 2, what="both creates in flight")
        # the download has begun (else a cancel before its GET leaves gets[WD] one short)
        await asyncio.wait_for(pkgs.requested(WD).wait(), 30)
        for call in calls:
            assert call.cancel()
        await wait_until(lambda: len(a.service.tables) == 0, what="the creates to give back")
        assert [await call.code() for call in calls] == [grpc.StatusCode.CANCELLED] * 2

        await wait_until(lambda: not list(a.service.store.entries()), what="the install to stop")
        info = await settled(a, cached=0)
        assert info.envs == []  # a cancelled create is not a failure to report
        gate.set()

        reply = await a.create(env_json(wd))
        assert (Path(reply.context.cwd) / "main.py").is_file()
        assert pkgs.gets[WD] == 2
        assert await a.delete(reply.runtime_env_id) == 0
        await still_serves(a, pkgs)


async def test_a_cancelled_install_stops_its_extraction_before_its_staging_folder_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create cancelled while its package unpacks: the extraction thread stops at its next
    file and is waited for, so nothing is written in the staging folder once it is removed
    (the thread wrote on and left tmp/<agent>/<staging> behind for good: chaos, seed 5)."""
    copy, extract = zip_write._copy, archive.extract_zip
    extracting: list[int] = []  # one item per extraction thread running
    started = threading.Event()

    def slow_copy(*args: Any) -> int:
        started.set()
        time.sleep(0.005)  # a big package: the cancellation comes mid-way
        return copy(*args)

    def counted_extract(*args: Any, **kwargs: Any) -> int:
        extracting.append(1)
        try:
            return extract(*args, **kwargs)
        finally:
            extracting.pop()

    monkeypatch.setattr(zip_write, "_copy", slow_copy)
    monkeypatch.setattr(zip_archive, "extract_zip", counted_extract)
    # the thread of --extract-workers 0 (the pool's workers: tests/test_unpack_pool.py)
    async with package_server() as pkgs, running_agent(extract_workers=0) as a:
        files = {f"f{n:03}.txt": f"{n}\n" for n in range(400)}
        wd = pkgs.add(WD, workdir_zip(files))
        call = a.stub.CreateRuntimeEnv(
            agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(wd)), timeout=30
        )
        await wait_until(started.is_set, what="the extraction to begin")
        assert call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED
        await wait_until(lambda: not extracting, timeout_s=30, what="the extraction to end")
        await wait_until(lambda: not list(a.service.store.entries()), what="the install to stop")
        info = await settled(a, cached=0)  # tmp/ and trash/ drained, and they stay so
        assert info.cache.extractions == 0
        assert listing(a, "tmp") == []
        await still_serves(a, pkgs)


async def test_a_cancellation_nobody_asked_for_is_answered_internal_not_left_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler's CancelledError while its call was not cancelled is a bug below: answered
    INTERNAL at once (a cancelled handler sends no status: the client waited for its deadline),
    and the agent keeps serving."""
    async with package_server() as pkgs, running_agent() as a:
        create = a.service.create
        monkeypatch.setattr(a.service, "create", stray_cancellation)
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        await rpc_refused(
            a.create(env_json(wd), timeout_s=20),
            grpc.StatusCode.INTERNAL,
            "CreateRuntimeEnv",
            "cancelled unexpectedly",
        )
        monkeypatch.setattr(a.service, "create", create)
        await still_serves(a, pkgs)


@pytest.mark.parametrize(
    ("statuses", "code", "words"),
    [
        ([500] * FAST_FETCH.attempts, grpc.StatusCode.UNAVAILABLE, ("after 3 attempts", "500")),
        ([404], grpc.StatusCode.NOT_FOUND, ("404",)),
        ([403], FAILED_PRECONDITION, ("403",)),
    ],
)
async def test_failed_download_answers_its_status_and_keeps_nothing(
    statuses: list[int], code: grpc.StatusCode, words: tuple[str, ...]
) -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}), statuses=statuses)
        await rpc_refused(a.create(env_json(wd)), code, *words)
        assert pkgs.gets[WD] == len(statuses)
        info = await settled(a, cached=0)
        assert [(e.state, e.references) for e in info.envs] == [("failed", 0)]
        assert info.cache.downloads == 0
        # A failed install is not remembered: the next create fetches again and succeeds.
        reply = await a.create(env_json(wd))
        assert pkgs.gets[WD] == len(statuses) + 1
        assert await a.delete(reply.runtime_env_id) == 0
        await settled(a, cached=1)
        await still_serves(a, pkgs)


async def test_checksum_mismatch_is_refused_before_extraction_and_the_right_digest_works() -> None:
    async with package_server() as pkgs, running_agent() as a:
        body = workdir_zip({"main.py": "M = 1\n"})
        wd = pkgs.add(WD, body)
        wrong = "0" * 64
        await rpc_refused(a.create(env_json(f"{wd}#sha256={wrong}")), FAILED_PRECONDITION, "sha256")
        info = await settled(a, cached=0)
        assert info.cache.downloads == 0
        assert "sha256" in info.envs[0].error

        right = hashlib.sha256(body).hexdigest()
        reply = await a.create(env_json(f"{wd}#sha256={right}"))
        assert (Path(reply.context.cwd) / "main.py").is_file()
        assert await a.delete(reply.runtime_env_id) == 0
        await settled(a, cached=1)
        await still_serves(a, pkgs)


def _unsafe_archives(token: str) -> dict[str, tuple[bytes, str]]:
    evil = f"evil-{token}.py"
    return {
        "dotdot": (make_zip({"ok.py": "", "../" * 4 + evil: "pwned"}), "'..'"),
        "absolute": (make_zip({"ok.py": "", f"/tmp/{evil}": "pwned"}), "absolute path"),
        "symlink-absolute": (make_zip({"ok.py": ""}, symlinks={"etc": "/etc"}), "outside"),
        "symlink-climbs": (make_zip({"ok.py": ""}, symlinks={"up": "../../.."}), "outside"),
        "symlink-chain": (
            make_zip({"c/keep.txt": "k"}, symlinks={"a": "b/b/b/c/../../../..", "b": "."}),
            "outside",
        ),
        "write-through-symlink": (
            make_zip({"out/" + evil: "pwned"}, symlinks={"out": "../../../.."}),
            "symlink",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "dotdot",
        "absolute",
        "symlink-absolute",
        "symlink-climbs",
        "symlink-chain",
        "write-through-symlink",
    ],
)
async def test_unsafe_archive_is_refused_and_writes_nothing_outside_its_root(case: str) -> None:
    token = uuid.uuid4().hex
    body, words = _unsafe_archives(token)[case]
    async with package_server() as pkgs, running_agent() as a:
        mod = pkgs.add("mod.zip", body)
        await rpc_refused(a.create(env_json(py_modules=[mod])), FAILED_PRECONDITION, words)
        info = await settled(a, cached=0)
        assert info.cache.downloads == 1
        assert listing(a, "uris") == []
        base = a.root.parent
        written = [p for p in base.rglob("*") if token in p.name]
        assert written == []
        assert not on_disk(f"/tmp/evil-{token}.py")
        assert not on_disk(base.parent / f"evil-{token}.py")
        await still_serves(a, pkgs)


@pytest.mark.parametrize(
    ("files", "entry"),
    [
        ({"clash": "file", "clash/inner.py": "x"}, "clash/inner.py"),
        ({"clash/inner.py": "x", "clash": "file"}, "clash"),
        ({"n" * 300: "x"}, "n" * 300),
    ],
    ids=["file-then-dir", "dir-then-file", "name-too-long"],
)
async def test_archive_whose_entry_cannot_be_written_is_refused_not_an_internal_error(
    files: dict[str, str], entry: str
) -> None:
    """Entries that collide or whose name the filesystem refuses: FAILED_PRECONDITION."""
    async with package_server() as pkgs, running_agent() as a:
        mod = pkgs.add("mod.zip", make_zip(files))
        details = await rpc_refused(
            a.create(env_json(py_modules=[mod])), FAILED_PRECONDITION, echo(entry)
        )
        assert "internal error" not in details
        await settled(a, cached=0)
        await still_serves(a, pkgs)


def _zeros_zip(size: int) -> bytes:
    return make_zip({"proj/zeros.bin": bytes(size)}, compression=zipfile.ZIP_DEFLATED)


@pytest.mark.parametrize(
    ("limits", "body", "limit_name"),
    [
        (ArchiveLimits(), _zeros_zip(64 * 1024**2), "max_ratio"),
        (
            ArchiveLimits(max_uncompressed_bytes=1024**2),
            make_zip({"proj/noise.bin": os.urandom(2 * 1024**2)}, compression=zipfile.ZIP_STORED),
            "max_uncompressed_bytes",
        ),
        (
            ArchiveLimits(max_entries=10),
            make_zip({f"proj/{i}.txt": str(i) for i in range(11)}),
            "max_entries",
        ),
    ],
    ids=["ratio", "uncompressed", "entries"],
)
async def test_archive_over_a_limit_is_refused_naming_the_limit(
    limits: ArchiveLimits, body: bytes, limit_name: str
) -> None:
    async with package_server() as pkgs, running_agent(archive=limits) as a:
        wd = pkgs.add(WD, body)
        await rpc_refused(a.create(env_json(wd)), FAILED_PRECONDITION, limit_name)
        info = await settled(a, cached=0)
        assert limit_name in info.envs[0].error
        assert info.cache.unused_bytes == 0
        await still_serves(a, pkgs)


async def test_duplicate_request_ids_count_once_and_a_reused_id_is_refused() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        gate = pkgs.hold(WD)
        first = asyncio.create_task(a.create(env_json(wd), request_id="c1"))
        retry = asyncio.create_task(a.create(env_json(wd), request_id="c1"))
        await asyncio.wait_for(pkgs.requested(WD).wait(), timeout=10)
        gate.set()
        replies = await asyncio.gather(first, retry)
        assert replies[0] == replies[1]
        env_id = replies[0].runtime_env_id
        again = await a.create(env_json(wd), request_id="c1")  # a retry after the answer
        assert again == replies[0]
        assert a.service.tables.env_count(env_id) == 1
        await rpc_refused(
            a.create(env_json(wd, env_vars={"OTHER": "1"}), request_id="c1"),
            FAILED_PRECONDITION,
            "request_id",
            "c1",
        )
        info = await a.info()
        assert [(e.runtime_env_id, e.references) for e in info.envs] == [(env_id, 1)]
        assert [u.references for u in info.uris] == [1]
        assert pkgs.gets[WD] == 1

        await a.create(env_json(wd), request_id="c2")
        assert a.service.tables.env_count(env_id) == 2
        assert await a.delete(env_id, request_id="d1") == 1
        assert await a.delete(env_id, request_id="d1") == 1  # retried: not counted again
        assert a.service.tables.env_count(env_id) == 1
        a.service.check_invariants()
        assert await a.delete(env_id, request_id="d2") == 0
        assert await a.delete(env_id, request_id="d2") == 0  # the remembered answer
        await rpc_refused(a.delete(env_id, request_id="d3"), grpc.StatusCode.NOT_FOUND, env_id)
        await settled(a, cached=1)
        await still_serves(a, pkgs)


async def test_delete_of_an_unknown_env_or_past_the_last_reference_is_not_found() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        reply = await a.create(env_json(wd))
        before = await a.info()
        await rpc_refused(a.delete("f" * 32), grpc.StatusCode.NOT_FOUND, "f" * 32)
        never_created = a.stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(serialized_runtime_env=env_json(env_vars={"X": "1"})),
            timeout=30,
        )
        await rpc_refused(never_created, grpc.StatusCode.NOT_FOUND, "unknown")
        after = await a.info()
        assert (after.envs, after.uris, after.cache) == (before.envs, before.uris, before.cache)
        a.service.check_invariants()

        assert await a.delete(reply.runtime_env_id) == 0
        await rpc_refused(a.delete(reply.runtime_env_id), grpc.StatusCode.NOT_FOUND, "unknown")
        await settled(a, cached=1)
        await still_serves(a, pkgs)


async def test_lru_evicts_the_least_recently_released_package_first_under_the_budget() -> None:
    size = 1000
    async with package_server() as pkgs, running_agent(cache_budget_bytes=int(size * 2.5)) as a:
        urls = {
            n: pkgs.add(f"p{n}.zip", workdir_zip({"data.txt": n * size})) for n in ("1", "2", "3")
        }
        ids = {n: (await a.create(env_json(url))).runtime_env_id for n, url in urls.items()}
        info = await a.info()
        assert sorted(u.size_bytes for u in info.uris) == [size] * 3
        assert info.cache.used_bytes == 3 * size
        for n in ("2", "1", "3"):  # release order: 2 is the least recently used
            assert await a.delete(ids[n]) == 0
        info = await settled(a, cached=2)
        assert sorted(u.uri for u in info.uris) == [urls["1"], urls["3"]]
        assert (info.cache.evictions, info.cache.unused_bytes) == (1, 2 * size)

        hits = info.cache.hits
        again = {n: await a.create(env_json(urls[n])) for n in ("2", "3")}
        assert pkgs.gets["p2.zip"] == 2, "an evicted package is downloaded again"
        assert pkgs.gets["p3.zip"] == 1, "a cached package is not"
        assert (Path(again["2"].context.cwd) / "data.txt").read_text() == "2" * size
        info = await a.info()
        assert info.cache.downloads == 4
        assert info.cache.hits == hits + 1, "a create finding its package cached is a hit"
        for n in ("2", "3"):  # now 1 is the least recently used
            assert await a.delete(again[n].runtime_env_id) == 0
        info = await settled(a, cached=2)
        assert sorted(u.uri for u in info.uris) == [urls["2"], urls["3"]]
        assert info.cache.evictions == 2
        await still_serves(a, pkgs)


async def test_info_right_after_a_create_counts_its_package_even_while_passes_are_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The root's figures come from passes over the index; info waits for the pass a create
    asked for, so a package just installed is in used_bytes (not the pass before's figures)."""
    size = 1000
    async with package_server() as pkgs, running_agent() as a:
        monkeypatch.setattr(a.service.store.db, "sweep", slow_passes(a))
        ids = []
        for n in range(1, 4):
            url = pkgs.add(f"p{n}.zip", workdir_zip({"data.txt": "x" * size}))
            ids.append((await a.create(env_json(url))).runtime_env_id)
            info = await a.info()
            assert info.cache.used_bytes == n * size, f"after create {n}"
            assert info.cache.unused_bytes == 0
        for env_id in ids:
            assert await a.delete(env_id) == 0
        info = await a.info()
        assert (info.cache.used_bytes, info.cache.unused_bytes) == (0, 3 * size)
        await still_serves(a, pkgs)


async def test_setup_timeout_answers_deadline_exceeded_and_gives_back_references() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))
        gate = pkgs.hold(WD)
        await rpc_refused(
            a.create(env_json(wd), timeout_s=1),
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "setup_timeout_seconds",
        )
        assert len(a.service.tables) == 0
        info = await a.info()
        assert [(e.state, e.references) for e in info.envs] == [("failed", 0)]
        assert [(u.state, u.references) for u in info.uris] == [("installing", 0)]
        assert [b.kept for b in info.builds] == [True]  # the download goes on
        a.service.check_invariants()
        gate.set()
        await wait_until(lambda: a.service.store.installs_in_flight() == 0, what="its end")
        info = await settled(a, cached=1)  # kept whole, unused: evictable
        assert info.cache.downloads == 1
        await still_serves(a, pkgs)
