"""Stampedes: many concurrent creates that share one URI cause one download, and one outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until

WD_ZIP = "wd.zip"


class HeldAnswerServer(PackageServer):
    """The package server, able to hold any answer to a name (an injected 404 included)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer_gates: dict[str, asyncio.Event] = {}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        gate = self.answer_gates.get(request.match_info["name"])
        if gate is not None:
            await gate.wait()
        return await super()._handle(request)


def listing(a: RunningAgent, sub: str) -> list[str]:
    """What is under ``sub``: for tmp/ and trash/, what is in the agents' own folders there."""
    return listed(a.root, sub)


async def assert_no_references(
    a: RunningAgent, *, cached: int
) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """No env holds a reference; ``cached`` URIs are unused on disk; tmp/ and trash/ empty."""
    await a.settle()
    info = await a.info()
    assert info.total_envs == 0
    assert [e for e in info.envs if e.state != "failed"] == []
    assert [(u.references, u.state) for u in info.uris] == [(0, "unused")] * cached
    assert sorted(Path(u.local_path).name for u in info.uris) == listing(a, "uris")
    assert (listing(a, "tmp"), listing(a, "trash")) == ([], [])
    assert info.cache.used_bytes == 0
    a.service.check_invariants()
    return info


async def test_fifty_envs_sharing_a_uri_download_it_once_and_all_get_a_context() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD_ZIP, workdir_zip({"main.py": "print('hi')\n"}))
        gate = pkgs.hold(WD_ZIP)
        creates = [
            asyncio.create_task(a.create(env_json(wd, env_vars={"N": str(i)}))) for i in range(50)
        ]
        await wait_until(lambda: len(a.service.tables) == 50, what="50 envs in flight")
        await asyncio.wait_for(pkgs.requested(WD_ZIP).wait(), timeout=10)
        a.service.check_invariants()
        info = await a.info()
        assert [(u.references, u.state) for u in info.uris] == [(50, "installing")]
        assert not any(c.done() for c in creates)

        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*creates), timeout=30)
        assert pkgs.gets[WD_ZIP] == 1
        assert len({r.runtime_env_id for r in replies}) == 50
        assert {r.context.env_vars["N"] for r in replies} == {str(i) for i in range(50)}
        cwds = {r.context.cwd for r in replies}
        assert len(cwds) == 1
        assert (Path(cwds.pop()) / "main.py").is_file()
        info = await a.info()
        assert info.total_envs == 50
        assert {e.references for e in info.envs} == {1}
        assert [(u.references, u.state) for u in info.uris] == [(50, "ready")]
        assert info.cache.downloads == 1
        a.service.check_invariants()

        remaining = await asyncio.gather(*(a.delete(r.runtime_env_id) for r in replies))
        assert remaining == [0] * 50
        info = await assert_no_references(a, cached=1)
        assert info.cache.downloads == 1


async def test_fifty_creates_of_one_env_share_one_setup_and_count_fifty_references() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add(WD_ZIP, workdir_zip({"main.py": "print('hi')\n"}))
        gate = pkgs.hold(WD_ZIP)
        serialized = env_json(wd, env_vars={"SAME": "1"})
        creates = [asyncio.create_task(a.create(serialized)) for _ in range(50)]

        def env_counts() -> list[int]:
            return [refs.count for _, refs in a.service.tables.envs()]

        await wait_until(lambda: env_counts() == [50], what="50 creates of one env in flight")
        await asyncio.wait_for(pkgs.requested(WD_ZIP).wait(), timeout=10)
        a.service.check_invariants()
        info = await a.info()
        assert [(e.references, e.state) for e in info.envs] == [(50, "creating")]
        assert [u.references for u in info.uris] == [1]

        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*creates), timeout=30)
        assert len({r.runtime_env_id for r in replies}) == 1
        assert len({r.context.cwd for r in replies}) == 1
        assert (Path(replies[0].context.cwd) / "main.py").is_file()
        assert pkgs.gets[WD_ZIP] == 1
        info = await a.info()
        assert [(e.references, e.state) for e in info.envs] == [(50, "ready")]
        assert [(u.references, u.state) for u in info.uris] == [(1, "ready")]
        assert info.cache.downloads == 1
        a.service.check_invariants()

        env_id = replies[0].runtime_env_id
        left = [await a.delete(env_id) for _ in range(50)]
        assert left == list(range(49, -1, -1))
        await assert_no_references(a, cached=1)


@pytest.mark.parametrize(
    ("statuses", "code", "gets", "words"),
    [
        ([404], grpc.StatusCode.NOT_FOUND, 1, "404"),
        ([500, 500, 500], grpc.StatusCode.UNAVAILABLE, 3, "after 3 attempts"),
    ],
)
async def test_twenty_creates_sharing_a_failing_package_fail_alike_after_one_install(
    statuses: list[int], code: grpc.StatusCode, gets: int, words: str
) -> None:
    """The failure reaches all 20 creates; GETs are one install's, and no reference is left."""
    pkgs = HeldAnswerServer()
    await pkgs.start()
    try:
        async with running_agent() as a:
            missing = pkgs.add(WD_ZIP, b"never served", statuses=statuses)
            answer = pkgs.answer_gates[WD_ZIP] = asyncio.Event()
            creates = [
                asyncio.create_task(a.create(env_json(missing, env_vars={"N": str(i)})))
                for i in range(20)
            ]
            await wait_until(lambda: len(a.service.tables) == 20, what="20 envs in flight")
            info = await a.info()
            assert [(u.references, u.state) for u in info.uris] == [(20, "installing")]

            answer.set()
            results = await asyncio.gather(*creates, return_exceptions=True)
            for result in results:
                assert isinstance(result, grpc.aio.AioRpcError), result
                assert result.code() == code
                assert words in (result.details() or "")
            assert pkgs.gets[WD_ZIP] == gets
            assert len(a.service.tables) == 0
            info = await assert_no_references(a, cached=0)
            assert len(info.envs) == 20
            assert {(e.state, e.references) for e in info.envs} == {("failed", 0)}
            assert all(words in e.error for e in info.envs)
            assert info.cache.downloads == 0

            # The failure is not cached: the next create fetches again, and the server now serves.
            pkgs.add(WD_ZIP, workdir_zip({"main.py": "print('hi')\n"}))
            reply = await a.create(env_json(missing, env_vars={"N": "0"}))
            assert (Path(reply.context.cwd) / "main.py").is_file()
            assert pkgs.gets[WD_ZIP] == gets + 1
            assert await a.delete(reply.runtime_env_id) == 0
            await assert_no_references(a, cached=1)
    finally:
        await pkgs.stop()
