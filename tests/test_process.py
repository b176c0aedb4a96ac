"""Whole-process tests: ``python -m agent serve`` as a real child process, stopped by its PID."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import (
    START_S,
    STOP_S,
    refused,
    run_cli,
    serving,
    stop,
    wait_health_serving,
)
from tests.harness.packages import env_json, workdir_zip

SERVICE = "rtenv.v1.RuntimeEnvAgent"


async def test_serves_on_a_0600_socket_in_the_root_is_healthy_and_info_prints_the_table(
    base: Path,
) -> None:
    root = base / "root"
    (base / "pkgs").mkdir()
    package = base / "pkgs" / "wd.zip"
    package.write_bytes(workdir_zip({"main.py": "print('hi')\n"}))
    async with serving(base / "agent.log", "--root", str(root)) as agent:
        socket_path = root.resolve() / "agent.sock"
        assert agent.address == f"unix:{socket_path}"
        mode = os.stat(socket_path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        await wait_health_serving(agent.address)
        await wait_health_serving(agent.address, SERVICE)

        code, out, err = await run_cli("info", "--address", agent.address)
        assert code == 0, err
        assert re.search(r"^ENV ID\s+REFS\s+STATE\s+URIS$", out, re.M), out
        assert re.search(r"^KIND\s+REFS\s+STATE\s+SIZE\s+FOLDER\s+URI$", out, re.M), out
        assert "0 envs, cache:" in out

        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            request = agent_pb2.CreateRuntimeEnvRequest(
                serialized_runtime_env=env_json(f"file://{package}")
            )
            reply = await stub.CreateRuntimeEnv(request, timeout=30)
        env_id = reply.runtime_env_id
        code, out, err = await run_cli("info", "--address", agent.address)
        assert code == 0, err
        uri = re.escape(f"file://{package}")
        assert re.search(rf"^{env_id}\s+1\s+ready\s+working_dir:{uri}$", out, re.M), out
        folder = r"working_dir-[0-9a-f]{32}"
        assert re.search(rf"^working_dir\s+1\s+ready\s+\d+ B\s+{folder}\s+{uri}$", out, re.M), out
        assert "1 env, cache:" in out, "a count of one is singular"
        assert "1 download, 0 hits" in out, out


async def test_sigterm_makes_it_exit_0_promptly_and_log_that_it_stopped(base: Path) -> None:
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        started = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
        assert code == 0, agent.log_text()
        assert time.monotonic() - started < STOP_S
        log = agent.log_text()
        assert "shutting down" in log
        assert re.search(r"INFO agent\.ops\.server: stopped$", log, re.M), log


async def test_exits_on_its_own_when_its_parent_pid_dies(base: Path) -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)"
    )
    try:
        args = ("--root", str(base / "root"), "--parent-pid", str(parent.pid))
        async with serving(base / "agent.log", *args) as agent:
            await wait_health_serving(agent.address)
            parent.kill()
            await asyncio.wait_for(parent.wait(), STOP_S)
            code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
            assert code == 0, agent.log_text()
            assert f"parent {parent.pid} exited; shutting down" in agent.log_text()
    finally:
        await stop(parent)


async def test_parent_pid_already_gone_exits_2_before_serving_and_touches_no_root(
    base: Path,
) -> None:
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    assert await asyncio.wait_for(gone.wait(), START_S) == 0
    args = ("--root", str(base / "root"), "--parent-pid", str(gone.pid))
    code, err = await refused(base / "refused.log", *args)
    assert code == 2, err
    assert f"--parent-pid {gone.pid}: no such process" in err, err
    assert not (base / "root").exists()


@pytest.mark.parametrize("via", ["root", "address"])
async def test_socket_path_over_107_bytes_exits_2_naming_length_and_limit(
    base: Path, via: str
) -> None:
    if via == "root":
        root = base / ("r" * 110)
        socket_path = root / "agent.sock"
        args = ["--root", str(root)]
    else:
        socket_path = base / ("s" * 110 + ".sock")
        args = ["--root", str(base / "root"), "--address", f"unix:{socket_path}"]
    size = len(os.fsencode(socket_path))
    assert size > 107
    code, err = await refused(base / "refused.log", *args)
    assert code == 2, err
    assert f"is {size} bytes; the kernel allows 107" in err, err
    assert not socket_path.exists()


ALONE = "and this start needs it alone (--no-state-db keeps the index in memory"


async def test_two_agents_share_a_root_and_one_that_needs_it_alone_is_refused_by_them(
    base: Path,
) -> None:
    """Agents with state.db share a root, each on its own address; --no-state-db and
    --reset-state need the root alone: refused (exit 2, one line) while others serve it, and
    those keep serving."""
    root = base / "root"
    second_address = f"unix:{base / 'second.sock'}"
    async with (
        serving(base / "first.log", "--root", str(root)) as first,
        serving(base / "second.log", "--root", str(root), "--address", second_address) as second,
    ):
        await wait_health_serving(first.address)
        await wait_health_serving(second.address)
        assert second.address != first.address
        for flag in ("--no-state-db", "--reset-state"):
            address = f"unix:{base / 'alone.sock'}"
            code, err = await refused(
                base / f"{flag}.log", "--root", str(root), "--address", address, flag
            )
            assert code == 2, err
            assert f"other agents serve root {root.resolve()}, {ALONE}" in err, err
            assert len(err.strip().splitlines()) == 1, err
        for served in (first, second):
            await wait_health_serving(served.address)
            assert served.proc.returncode is None
        assert (root / "state.db").is_file(), "--reset-state moved the shared index aside"


async def test_an_agent_with_no_state_db_serves_its_root_alone_and_refuses_any_other(
    base: Path,
) -> None:
    """An agent whose index is in memory cannot share its root: a second agent is refused
    (exit 2, naming the first's pid), with state.db or without, and the first keeps serving."""
    root = base / "root"
    async with serving(base / "first.log", "--root", str(root), "--no-state-db") as first:
        await wait_health_serving(first.address)
        address = f"unix:{base / 'second.sock'}"
        code, err = await refused(base / "shared.log", "--root", str(root), "--address", address)
        assert code == 2, err
        expected = (
            f"an agent (pid {first.proc.pid}) holds root {root.resolve()} alone: one started "
            "with --no-state-db"
        )
        assert expected in err, err
        code, err = await refused(
            base / "alone.log", "--root", str(root), "--address", address, "--no-state-db"
        )
        assert code == 2, err
        assert f"other agents serve root {root.resolve()}, {ALONE}" in err, err
        await wait_health_serving(first.address)
        assert first.proc.returncode is None


async def test_agent_on_another_root_cannot_take_over_a_live_socket_path(base: Path) -> None:
    """An explicit --address naming another agent's live socket is refused, not unlinked."""
    shared = f"unix:{base / 'shared.sock'}"
    args = ("--root", str(base / "r1"), "--address", shared, "--cache-budget", "1M")
    async with serving(base / "first.log", *args) as first:
        await wait_health_serving(first.address)
        code, err = await refused(
            base / "second.log", "--root", str(base / "r2"), "--address", shared
        )
        assert code == 2, err
        assert str(base / "shared.sock") in err, err
        code, out, err = await run_cli("info", "--address", shared)
        assert code == 0, err
        assert "of budget 1.0 MiB" in out, "the socket no longer leads to the first agent"


async def test_root_that_is_a_regular_file_exits_2_with_a_message_naming_it(base: Path) -> None:
    root = base / "not-a-dir"
    root.write_bytes(b"")
    code, err = await refused(base / "refused.log", "--root", str(root))
    assert code == 2, err
    assert str(root) in err, err


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0", "192.0.2.1:0"])
async def test_non_loopback_tcp_address_is_refused_without_allow_remote(
    base: Path, address: str
) -> None:
    args = ("--root", str(base / "root"), "--address", address)
    code, err = await refused(base / "refused.log", *args)
    assert code == 2, err
    assert f"address {address!r} is not a loopback address; pass --allow-remote" in err, err


async def test_loopback_tcp_with_port_0_serves_on_the_printed_port(base: Path) -> None:
    args = ("--root", str(base / "root"), "--address", "127.0.0.1:0")
    async with serving(base / "agent.log", *args) as agent:
        match = re.fullmatch(r"127\.0\.0\.1:(\d+)", agent.address)
        assert match is not None, agent.address
        assert int(match.group(1)) > 0
        await wait_health_serving(agent.address)


async def test_reflection_lets_a_client_without_stubs_find_and_call_the_service(
    base: Path,
) -> None:
    async with (
        serving(base / "agent.log", "--root", str(base / "root")) as agent,
        grpc.aio.insecure_channel(agent.address) as channel,
    ):
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
        reflect: Any = stub.ServerReflectionInfo  # typed Incomplete in the stubs
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
        ]
        replies = [r async for r in reflect(iter(requests), timeout=30)]
        assert len(replies) == 2
        names = {s.name for s in replies[0].list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= names, names

        pool = descriptor_pool.DescriptorPool()  # empty: nothing compiled into it
        for raw in replies[1].file_descriptor_response.file_descriptor_proto:
            pool.AddSerializedFile(raw)
        service = pool.FindServiceByName(SERVICE)
        methods = [m.name for m in service.methods]
        assert methods == ["CreateRuntimeEnv", "DeleteRuntimeEnv", "GetRuntimeEnvsInfo"]

        method = service.methods_by_name["GetRuntimeEnvsInfo"]
        request_cls = message_factory.GetMessageClass(method.input_type)
        reply_cls = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            f"/{SERVICE}/GetRuntimeEnvsInfo",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=reply_cls.FromString,
        )
        info = json_format.MessageToDict(
            await call(request_cls(limit=5), timeout=30),
            always_print_fields_with_no_presence=True,
            preserving_proto_field_name=True,
        )
        assert info["total_envs"] == "0", info
        assert info["cache"]["budget_bytes"] == str(10 * 1024**3), info
