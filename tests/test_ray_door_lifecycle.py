"""The Ray door around the agent's lifecycle, on a real agent (in-process) spoken to over
127.0.0.1 by a real aiohttp client: a client gone mid-create gives its count back, the door
takes the other doors' token, the venvs' python version reaches the front, the door stops
before the gRPC grace period, and ``serve`` honours the parent's death while the start is held
before recovery."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from agent.app.config import RaySettings, Settings
from agent.ops.entry import serve
from agent.ops.startup import lock_root
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.in_process import FAST_FETCH, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import workdir_zip
from tests.harness.polling import wait_until
from tests.harness.processes import parent
from tests.harness.ray_door import RayClient
from tests.harness.tempdirs import short_tempdir

OK = ray_pb2.AGENT_RPC_STATUS_OK
SPACED = '{"env_vars": {"A": "1"}, "working_dir": "%s"}'


def _listens(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


async def test_a_client_that_times_out_during_a_create_gives_its_count_back() -> None:
    async with package_server() as server, running_agent(ray=RaySettings()) as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        gate = server.hold("wd.zip")
        text = SPACED % url
        front = ra.agent.ray_front
        assert front is not None
        try:
            timeout = aiohttp.ClientTimeout(total=0.5)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                with pytest.raises(asyncio.TimeoutError):
                    await RayClient(session, ra.agent.ray_address).create(text)
            env_id = next(iter(ra.service.records))

            def settled() -> bool:
                return (
                    front.in_flight() == 0
                    and front.references() == 0
                    and ra.service.tables.env_count(env_id) == 0
                )

            await wait_until(settled, timeout_s=10, what="the create cancelled and given back")
            assert front.info().states == ()
            front.check_invariants()
            ra.service.check_invariants()
        finally:
            gate.set()


async def test_the_ray_door_requires_the_token_file_and_rays_own_token_wins(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("filesecret\n")
    body = ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()
    path = "/get_runtime_envs_info"
    async with (
        running_agent(token_file=str(token_file), ray=RaySettings()) as ra,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, ra.agent.ray_address, token="filesecret")
        assert (await ray.post(path, body, headers={})).status == 401
        assert (await ray.post(path, body, headers={"Authorization": "Bearer x"})).status == 403
        assert (await ray.post(path, body)).status == 200
    async with (
        running_agent(token_file=str(token_file), ray=RaySettings(token="raysecret")) as ra,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, ra.agent.ray_address, token="raysecret")
        assert (await ray.post(path, body)).status == 200
        wrong = {"Authorization": "Bearer filesecret"}
        assert (await ray.post(path, body, headers=wrong)).status == 403


async def test_the_front_gets_the_version_of_the_venvs_python_not_the_agents(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "python3.9"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = "-c" ] && echo "3 9" && exit 0\nexec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    async with running_agent(py_executable=str(fake), ray=RaySettings()) as ra:
        assert ra.agent.ray_front is not None
        assert ra.agent.ray_front.python_version == (3, 9)


async def test_the_ray_door_closes_before_the_grpc_grace_period() -> None:
    async with package_server() as server, running_agent(ray=RaySettings()) as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        gate = server.hold("wd.zip")
        creating = asyncio.create_task(ra.create(SPACED % url))
        stopping: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(server.requested("wd.zip").wait(), 10)
            address = ra.agent.ray_address
            assert _listens(address)
            stopping = asyncio.create_task(ra.agent.stop(grace=8.0))
            await wait_until(lambda: not _listens(address), timeout_s=4, what="the Ray door closed")
            assert not stopping.done(), "the gRPC grace period ended first"
        finally:
            gate.set()
            if stopping is not None:
                await asyncio.wait_for(asyncio.wait([stopping]), 30)
            await asyncio.wait([creating])


async def test_serve_exits_when_the_parent_dies_while_the_start_is_held() -> None:
    base = short_tempdir()
    port_file = base / "port"
    held = asyncio.Event()

    async def before_recovery() -> None:
        await held.wait()

    with parent() as proc:
        settings = replace(
            Settings(root=base / "root"), fetch=FAST_FETCH, parent_pid=proc.pid,
            ray=RaySettings(port_file=port_file),
        )  # fmt: skip
        serving = asyncio.create_task(serve(settings, before_recovery=before_recovery))
        try:
            await wait_until(port_file.exists, timeout_s=30, what="the Ray door's port file")
            address = f"127.0.0.1:{int(port_file.read_text())}"
            proc.kill()
            assert await asyncio.wait_for(serving, 10) == 0
            assert not port_file.exists()
            assert not _listens(address)
            os.close(lock_root((base / "root").resolve()))  # the root's lock was let go
        finally:
            held.set()
            if not serving.done():
                serving.cancel()
            await asyncio.wait([serving])
            shutil.rmtree(base, ignore_errors=True)


async def test_a_start_cancelled_while_the_port_file_is_written_leaves_no_port_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The write runs in a thread a cancellation cannot stop: the close waits for it, then
    removes the file, so no port file is left naming a port nobody serves."""
    import threading

    from agent.ops import ray_door
    from agent.ops import server as server_module

    writing, release, written = threading.Event(), threading.Event(), threading.Event()
    real_write = ray_door._write_port_file

    def slow_write(path: Path, port: int) -> None:
        writing.set()
        release.wait(10)
        real_write(path, port)
        written.set()

    monkeypatch.setattr(ray_door, "_write_port_file", slow_write)
    base = short_tempdir()
    port_file = base / "runtime_env_agent_port_node"
    agent = server_module.Agent(Settings(root=base / "root", ray=RaySettings(port_file=port_file)))
    try:
        starting = asyncio.create_task(agent.start())
        await wait_until(writing.is_set, what="the port file's write begun")
        starting.cancel()
        await asyncio.sleep(0)  # the cancellation delivered while the thread still writes
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(starting, 10)
        await wait_until(written.is_set, what="the writer thread done")
        assert not port_file.exists()
    finally:
        release.set()
        await agent.stop()
        shutil.rmtree(base, ignore_errors=True)
