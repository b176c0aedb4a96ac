"""Installs beyond max-concurrent-installs wait in a queue; a SIGTERM'd agent process stops
accepting, lets in-flight RPCs finish within its grace, cancels the installs left and removes
their files, flushes its database; a second SIGTERM makes it exit at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from agent.app.config import Settings
from agent.core.errors import StartupError
from agent.ops.server import Agent, AgentState
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import STOP_S, Served, serving
from tests.harness.in_process import FAST_FETCH, listed, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip
from tests.harness.packages import workdir_zip as wd_zip
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir

GRACE_S = 2.0  # Agent.stop()'s grace for in-flight RPCs, as serve() uses it


async def test_installs_beyond_max_concurrent_installs_queue_and_all_succeed() -> None:
    async with package_server() as pkgs, running_agent(max_concurrent_installs=2) as a:
        names = [f"p{i}.zip" for i in range(5)]
        urls = [pkgs.add(name, wd_zip({"name.txt": name})) for name in names]
        gates = {name: pkgs.hold(name) for name in names}

        def staging() -> int:
            return len(listed(a.root, "tmp"))

        def gets() -> int:
            return sum(pkgs.gets.values())

        try:
            creates = [asyncio.create_task(a.create(env_json(url))) for url in urls]
            await wait_until(
                lambda: a.service.store.installs_in_flight() == 5 and gets() == 2,
                what="5 installs begun, 2 of them downloading",
            )
            await a.info()  # a round trip: a queued install had every chance to start
            assert (gets(), staging()) == (2, 2), "more than 2 installs at once"
            assert not any(c.done() for c in creates), "an install over the limit failed"

            first = next(name for name in names if pkgs.gets[name])
            gates[first].set()
            reply = await asyncio.wait_for(creates[names.index(first)], 10)
            assert (Path(reply.context.cwd) / "name.txt").read_text() == first
            await wait_until(lambda: gets() == 3, what="a queued install to take the free slot")
            await a.info()
            await a.settle()  # the finished install's staging goes in the background
            assert (gets(), staging()) == (3, 2)
            assert a.service.store.installs_in_flight() == 4

            for gate in gates.values():
                gate.set()
            replies = await asyncio.wait_for(asyncio.gather(*creates), 10)
            for name, reply in zip(names, replies, strict=True):
                assert (Path(reply.context.cwd) / "name.txt").read_text() == name
            assert dict(pkgs.gets) == dict.fromkeys(names, 1)
            await a.settle()
            assert (a.service.store.installs_in_flight(), staging()) == (0, 0)
            a.service.check_invariants()
        finally:
            for gate in gates.values():
                gate.set()


# -- shutdown of a whole process -------------------------------------------------------------


def stub_for(channel: grpc.aio.Channel) -> agent_pb2_grpc.RuntimeEnvAgentStub:
    return agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]


def create_call(
    stub: agent_pb2_grpc.RuntimeEnvAgentStub, url: str
) -> grpc.aio.UnaryUnaryCall[agent_pb2.CreateRuntimeEnvRequest, agent_pb2.CreateRuntimeEnvReply]:
    request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(url))
    call: grpc.aio.UnaryUnaryCall[
        agent_pb2.CreateRuntimeEnvRequest, agent_pb2.CreateRuntimeEnvReply
    ] = stub.CreateRuntimeEnv(request, timeout=30)
    return call


async def refuses_new_calls(address: str) -> bool:
    """Whether a call on a new connection is refused (the server no longer accepts)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await stub_for(channel).GetRuntimeEnvsInfo(
                agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=1
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def staged_bytes(root: Path) -> int:
    """Bytes under tmp/ (files may vanish while we look)."""
    total = 0
    for path in (root / "tmp").rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size if path.is_file() else 0
    return total


async def wait_log(agent: Served, text: str) -> None:
    await wait_until(lambda: text in agent.log_text(), what=f"{text!r} in the agent's log")


def db_rows(root: Path) -> tuple[int, dict[str, tuple[str, int]]]:
    """(rows naming a holder: its own, its references and its install claims; {uri: (dir,
    last use)} of the ready packages) from a stopped agent's state.db."""
    conn = sqlite3.connect(root / "state.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        [(held,)] = conn.execute(
            "SELECT (SELECT count(*) FROM holders) + (SELECT count(*) FROM refs)"
            " + (SELECT count(*) FROM uris WHERE state = 'installing')"
        ).fetchall()
        uris = {
            uri: (directory, used)
            for uri, directory, used in conn.execute(
                "SELECT uri, dir, last_used_ms FROM uris WHERE state = 'ready'"
            )
        }
    finally:
        conn.close()
    return held, uris


async def test_sigterm_refuses_new_calls_lets_in_flight_creates_finish_and_flushes(
    base: Path,
) -> None:
    root = base / "root"
    async with package_server() as pkgs:
        a_url = pkgs.add("a.zip", wd_zip({"a.txt": "a"}))
        b_url = pkgs.add("b.zip", wd_zip({"b.txt": "b"}))
        gate = pkgs.hold("b.zip")
        try:
            async with (
                serving(base / "agent.log", "--root", str(root)) as agent,
                grpc.aio.insecure_channel(agent.address) as channel,
            ):
                stub = stub_for(channel)
                await create_call(stub, a_url)
                hit_ms = int(time.time() * 1000)
                await create_call(stub, a_url)  # a hit: its last use is written behind
                in_flight = create_call(stub, b_url)
                await asyncio.wait_for(pkgs.requested("b.zip").wait(), 10)

                agent.proc.send_signal(signal.SIGTERM)
                await wait_until(lambda: refuses_new_calls(agent.address), what="refusal")
                assert agent.proc.returncode is None, "it did not wait for the in-flight create"
                gate.set()
                second = await asyncio.wait_for(in_flight, 10)
                assert (Path(second.context.cwd) / "b.txt").read_text() == "b"
                assert await asyncio.wait_for(agent.proc.wait(), STOP_S) == 0, agent.log_text()
        finally:
            gate.set()
    held, uris = db_rows(root)
    assert held == 0, "a clean stop left its holder's rows for a reaper"
    assert set(uris) == {a_url, b_url}
    assert uris[a_url][1] >= hit_ms, "the hit's last use noted behind was not written at the stop"
    assert sorted(d for d, _ in uris.values()) == sorted(p.name for p in (root / "uris").iterdir())
    assert os.listdir(root / "tmp") == [], "the agent's staging folder outlived its clean stop"


async def test_sigterm_cancels_an_install_outlasting_the_grace_and_removes_its_files(
    base: Path,
) -> None:
    root = base / "root"
    async with package_server() as pkgs:
        body = make_zip({"big.bin": os.urandom(4 * 1024**2)}, compression=zipfile.ZIP_STORED)
        url = pkgs.add("slow.zip", body)
        pkgs.slow("slow.zip", 0.2)  # 64 KiB every 0.2 s: far longer than the grace
        async with (
            serving(base / "agent.log", "--root", str(root)) as agent,
            grpc.aio.insecure_channel(agent.address) as channel,
        ):
            call = create_call(stub_for(channel), url)
            await wait_until(lambda: staged_bytes(root) > 0, what="a partial download in tmp/")
            started = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(agent.proc.wait(), STOP_S) == 0, agent.log_text()
            assert time.monotonic() - started < GRACE_S + 3
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert os.listdir(root / "tmp") == [], "the cancelled install left its files"
    assert list((root / "uris").iterdir()) == []
    assert db_rows(root) == (0, {})


async def test_second_sigterm_during_the_graceful_wait_exits_at_once_non_zero(base: Path) -> None:
    async with package_server() as pkgs:
        url = pkgs.add("held.zip", wd_zip({"h.txt": "h"}))
        gate = pkgs.hold("held.zip")
        try:
            async with (
                serving(base / "agent.log", "--root", str(base / "root")) as agent,
                grpc.aio.insecure_channel(agent.address) as channel,
            ):
                call = create_call(stub_for(channel), url)
                await asyncio.wait_for(pkgs.requested("held.zip").wait(), 10)
                agent.proc.send_signal(signal.SIGTERM)
                await wait_log(agent, "shutting down")  # now waiting on the in-flight create
                assert agent.proc.returncode is None
                started = time.monotonic()
                agent.proc.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
                assert time.monotonic() - started < GRACE_S, "it waited out the grace"
                assert code == 1, agent.log_text()
                assert "second signal: exiting at once" in agent.log_text()
                with pytest.raises(grpc.aio.AioRpcError):
                    await call
        finally:
            gate.set()


async def test_a_step_of_stop_that_fails_still_releases_the_root_lock_and_raises() -> None:
    """Stopping releases every resource whatever an earlier step raised (a state.db whose
    flusher died raises at close): the root's lock is freed, so a new agent that needs the root
    alone (--no-state-db) starts on it, and the failure is raised, not swallowed."""
    base = short_tempdir()
    try:
        settings = replace(Settings(root=base / "root"), fetch=FAST_FETCH)
        first = Agent(settings)
        await first.start()
        assert first.service is not None

        async def broken_close() -> None:
            raise RuntimeError("planted: the write-behind flusher died")

        first.service.store.db.close = broken_close  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="planted"):
            await first.stop()
        assert first.state is AgentState.STOPPED
        second = Agent(replace(settings, persist=False))
        await second.start()  # the lock was released: even an exclusive one is taken
        await second.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_start_refused_after_binding_lets_the_port_go(base: Path) -> None:
    """A start that fails after the gRPC port is bound (here: the metrics port is taken during
    recovery, after the start found it free) stops the server it made: the same port can be
    bound again at once."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        metrics_port = taken.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            grpc_port = probe.getsockname()[1]
        settings = replace(
            Settings(root=base / "root"), fetch=FAST_FETCH, address=f"127.0.0.1:{grpc_port}",
            metrics_address=f"127.0.0.1:{metrics_port}",
        )  # fmt: skip

        async def take_the_metrics_port() -> None:
            taken.listen()

        agent = Agent(settings, before_recovery=take_the_metrics_port)
        said = rf"^cannot listen on 127.0.0.1:{metrics_port} \(--metrics-address\): Address"
        with pytest.raises(StartupError, match=said):
            await agent.start()
    with socket.socket() as again:  # nobody listens there: the failed start's server let it go
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", grpc_port))


async def test_one_sigterm_after_the_parents_death_is_not_a_second_signal(base: Path) -> None:
    """The parent's death starts the graceful stop; one signal during it (Ctrl-C on the
    parent's process group) is the first signal, not an order to exit at once."""
    parent = await asyncio.create_subprocess_exec("sleep", "600")
    async with package_server() as pkgs:
        url = pkgs.add("held.zip", wd_zip({"h.txt": "h"}))
        gate = pkgs.hold("held.zip")
        try:
            async with (
                serving(
                    base / "agent.log", "--root", str(base / "root"),
                    "--parent-pid", str(parent.pid),
                ) as agent,
                grpc.aio.insecure_channel(agent.address) as channel,
            ):  # fmt: skip
                call = create_call(stub_for(channel), url)
                await asyncio.wait_for(pkgs.requested("held.zip").wait(), 10)
                parent.kill()
                await parent.wait()
                await wait_log(agent, "shutting down")  # the parent's death: the stop begins
                agent.proc.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
                assert code == 0, agent.log_text()
                assert "second signal" not in agent.log_text()
                call.cancel()
        finally:
            gate.set()
            if parent.returncode is None:
                parent.kill()
                await parent.wait()
