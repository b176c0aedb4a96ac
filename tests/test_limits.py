"""Limits that are settings, hit through a real agent with non-default values: each refusal has
its status and names the limit, the setting's value is the one applied, and the agent keeps
serving. (The defaults are hit in test_bad_input and test_lifecycle.)"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import serving
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip, workdir_zip
from tests.harness.polling import wait_until
from tests.harness.rpc import rpc_refused

LIMIT = 64 * 1024


async def still_serves(a: RunningAgent, url: str) -> None:
    assert len(a.service.tables) == 0
    await a.settle()  # staging is removed in the background
    assert listed(a.root, "tmp") == []
    reply = await a.create(env_json(url))
    assert (Path(reply.context.cwd) / "ok.txt").read_text() == "ok"
    assert await a.delete(reply.runtime_env_id) == 0
    a.service.check_invariants()


async def test_download_over_max_download_bytes_is_refused_naming_size_and_limit(
    base: Path,
) -> None:
    """Through the flag of a real ``serve`` process, for an http and a file package."""
    big = make_zip({"proj/big.bin": os.urandom(LIMIT + 1)}, compression=zipfile.ZIP_STORED)
    (base / "big.zip").write_bytes(big)
    root = base / "root"
    args = ("--root", str(root), "--max-download-bytes", "64K")
    async with (
        package_server() as pkgs,
        serving(base / "agent.log", *args) as agent,
        grpc.aio.insecure_channel(agent.address) as channel,
    ):
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]

        def create(url: str) -> Awaitable[agent_pb2.CreateRuntimeEnvReply]:
            request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(url))
            reply: Awaitable[agent_pb2.CreateRuntimeEnvReply] = stub.CreateRuntimeEnv(
                request, timeout=30
            )
            return reply

        for url in (pkgs.add("big.zip", big), f"file://{base}/big.zip"):
            await rpc_refused(
                create(url),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"is {len(big)} bytes; the limit is {LIMIT} (max_download_bytes)",
            )
        assert list((root / "uris").iterdir()) == []
        await wait_until(lambda: not listed(root, "tmp"), what="staging removed")
        reply = await create(pkgs.add("ok.zip", workdir_zip({"ok.txt": "ok"})))
        assert (Path(reply.context.cwd) / "ok.txt").read_text() == "ok"


async def test_request_over_a_lowered_max_message_bytes_is_resource_exhausted() -> None:
    async with package_server() as pkgs, running_agent(max_message_bytes=LIMIT) as a:
        small = env_json(env_vars={"V": "x" * (LIMIT // 2)})
        reply = await a.create(small)
        assert await a.delete(reply.runtime_env_id) == 0
        large = env_json(env_vars={"V": "x" * LIMIT})
        await rpc_refused(a.create(large), grpc.StatusCode.RESOURCE_EXHAUSTED)
        await still_serves(a, pkgs.add("ok.zip", workdir_zip({"ok.txt": "ok"})))


@pytest.mark.parametrize("asked", [3600, -1])
async def test_setup_timeout_over_max_setup_timeout_is_capped_to_it(asked: int) -> None:
    """A request for an hour (or -1, "the most allowed") gets max-setup-timeout, here 1 s."""
    async with package_server() as pkgs, running_agent(max_setup_timeout_s=1.0) as a:
        url = pkgs.add("held.zip", workdir_zip({"ok.txt": "ok"}))
        gate = pkgs.hold("held.zip")
        try:
            await rpc_refused(
                a.create(env_json(url), timeout_s=asked),
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "was not set up within 1s (setup_timeout_seconds)",
            )
        finally:
            gate.set()
        await wait_until(lambda: not listed(a.root, "tmp"), what="staging removed")

        # the build went on past the timeout: placed whole, unused (evictable), nothing held
        async def unused() -> bool:
            return [(u.state, u.references) for u in (await a.info()).uris] == [("unused", 0)]

        await wait_until(unused, what="the build kept going, ready and unused")
        assert len(a.uri_dirs()) == 1
        await still_serves(a, url)
