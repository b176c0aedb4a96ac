"""systemd readiness (Type=notify): a real ``python -m agent serve`` process, given
NOTIFY_SOCKET, sends READY=1 once it serves and STOPPING=1 when told to stop, on a datagram
socket the test binds (a path, or an abstract @name); the notifier's edge cases in-process."""

from __future__ import annotations

import asyncio
import configparser
import logging
import os
import secrets
import shlex
import signal
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.ops.sdnotify import Notifier
from tests.harness.agent_process import REPO, START_S, STOP_S, run_cli, serving


async def _receive(sock: socket.socket, timeout_s: float) -> str:
    data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096), timeout_s)
    return data.decode()


async def _health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        status: int = reply.status
        return status


@pytest.mark.parametrize("kind", ["path", "abstract"])
async def test_a_real_agent_sends_ready_once_serving_and_stopping_on_sigterm(
    base: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "path":
        given = str(base / "notify.sock")
        bound = given
    else:  # abstract: nothing on disk; the name is unique to this test run
        given = f"@rtenv-test-notify-{os.getpid()}-{secrets.token_hex(4)}"
        bound = "\0" + given[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(bound)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", given)
        async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
            monkeypatch.delenv("NOTIFY_SOCKET")
            ready = await _receive(sock, START_S)
            assert ready.split("\n") == ["READY=1", f"STATUS=serving on {agent.address}"]
            # READY=1 came after SERVING, not before: checked once, without retrying
            assert await _health(agent.address) == health_pb2.HealthCheckResponse.SERVING
            agent.proc.send_signal(signal.SIGTERM)
            assert await _receive(sock, STOP_S) == "STOPPING=1"
            assert await asyncio.wait_for(agent.proc.wait(), STOP_S) == 0
        with pytest.raises(BlockingIOError):
            sock.recv(4096)  # nothing more was sent


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier.from_environment({})
    assert notifier.address == ""
    assert notifier.send("READY=1") is False


def test_the_variable_is_taken_out_of_the_environment_so_children_do_not_inherit_it() -> None:
    environ = {"NOTIFY_SOCKET": "@somewhere", "OTHER": "kept"}
    assert Notifier.from_environment(environ).address == "@somewhere"
    assert environ == {"OTHER": "kept"}


@pytest.mark.parametrize("value", ["vsock:2:1234", "relative/notify.sock"])
def test_an_unsupported_notify_socket_is_logged_and_ignored(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.ops.sdnotify"):
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": value})
    assert notifier.address == ""
    assert "not a unix socket path or @abstract name" in caplog.text


def test_a_socket_nobody_listens_on_is_logged_not_raised(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.ops.sdnotify"):
        assert Notifier(str(base / "absent.sock")).send("READY=1") is False
    assert "could not notify the service manager" in caplog.text


async def test_the_example_unit_is_type_notify_and_its_command_line_is_the_agents() -> None:
    """docs/rtenv-agent.service (named in the README) waits for READY=1, and the flags of its
    ExecStart are accepted by the agent (checked with ``config``, which takes the same ones)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(REPO / "docs" / "rtenv-agent.service")
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    command = shlex.split(service["ExecStart"])
    assert command[0].endswith("/rtenv-agent")
    assert command[1] == "serve"
    code, out, err = await run_cli("config", *command[2:])
    assert code == 0, err
    assert "/var/lib/rtenv-agent" in out
    assert "docs/rtenv-agent.service" in (REPO / "README.md").read_text()
