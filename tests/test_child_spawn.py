"""tests/harness/child_spawn.py: on uvloop, the test process's children start clean beside its
busy gRPC threads, and behave as asyncio's own (pipes, exit codes, signals, shell). Run in CI's
uvloop pass; skipped where uvloop is not installed (the plugin then leaves asyncio as it is)."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.harness import child_spawn

T = TypeVar("T")
SPAWNS = 1000  # uvloop's own start crashed 1 child in 20 to 200 beside the calls below
BOUND_S = 120.0


def on_uvloop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` run to its end on a uvloop loop of its own (bounded)."""
    uvloop = pytest.importorskip("uvloop")
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(main(), BOUND_S))
    finally:
        loop.close()


def test_the_plugin_is_what_asyncio_starts_children_with() -> None:
    """conftest loads it: the names the harness calls are the plugin's."""
    assert asyncio.create_subprocess_exec is child_spawn.create_subprocess_exec
    assert asyncio.create_subprocess_shell is child_spawn.create_subprocess_shell


def test_children_start_clean_beside_busy_grpc_calls() -> None:
    """1,000 children started while four gRPC calls run back to back in this process: each exits
    0 (grpc's after-fork handlers, run by uvloop's fork, killed some with SIGSEGV)."""

    async def main() -> dict[int, int]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub: Any = health_pb2_grpc.HealthStub(channel)  # grpc's stubs are untyped
        calls = 0
        done = asyncio.Event()

        async def call() -> None:
            nonlocal calls
            while not done.is_set():
                await stub.Check(health_pb2.HealthCheckRequest())
                calls += 1

        callers = [asyncio.create_task(call()) for _ in range(4)]
        codes: dict[int, int] = {}
        true = shutil.which("true")
        assert true is not None
        try:
            for _ in range(SPAWNS):
                proc = await asyncio.create_subprocess_exec(true)
                code = await proc.wait()
                codes[code] = codes.get(code, 0) + 1
        finally:
            done.set()
            await asyncio.gather(*callers)
            await channel.close()
            await server.stop(None)
        assert calls > 0, "no gRPC call ran beside the starts"
        return codes

    assert on_uvloop(main) == {0: SPAWNS}


def test_pipes_exit_codes_signals_and_shell_are_asyncios() -> None:
    """stdin and stdout piped, stderr piped apart; an exit code; a kill read as -SIGKILL; a
    shell command; a missing program raised as asyncio raises it."""

    async def main() -> None:
        cat = await asyncio.create_subprocess_exec(
            "cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        through, nothing = await cat.communicate(b"through\n")
        assert through == b"through\n"
        assert nothing is None  # stderr not piped
        assert cat.returncode == 0

        err = await asyncio.create_subprocess_exec(
            "sh", "-c", "echo out; echo err >&2; exit 3",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert await err.communicate() == (b"out\n", b"err\n")
        assert err.returncode == 3

        sleeper = await asyncio.create_subprocess_exec(
            "sleep", "60", stdout=asyncio.subprocess.PIPE
        )
        sleeper.kill()
        assert await sleeper.wait() == -signal.SIGKILL

        shell = await asyncio.create_subprocess_shell(
            "echo $((1 + 2))", stdout=asyncio.subprocess.PIPE
        )
        assert shell.stdout is not None
        assert await shell.stdout.readline() == b"3\n"
        assert await shell.wait() == 0

        with pytest.raises(FileNotFoundError):
            await asyncio.create_subprocess_exec("/nonexistent/program")

    on_uvloop(main)
