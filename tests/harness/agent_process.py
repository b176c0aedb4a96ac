"""Whole agent processes: ``python -m agent serve`` as a real child process (serving, or refusing
to start), the CLI run to its end, stopping a process by its PID, the health check polled."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

REPO = Path(__file__).resolve().parents[2]
START_S = 30.0  # deadline for a process to start serving or to exit
STOP_S = 10.0  # deadline for a process to exit once told to
NO_PROXY = [("grpc.enable_http_proxy", 0)]
Proc = asyncio.subprocess.Process


async def stop(proc: Proc) -> None:
    """Stop one process by its PID: SIGTERM, a bounded wait, then SIGKILL."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), STOP_S)
    except TimeoutError:
        proc.kill()
        await asyncio.wait_for(proc.wait(), STOP_S)


@dataclass
class Served:
    proc: Proc
    address: str
    log: Path  # the agent's stderr

    def log_text(self) -> str:
        return _read(self.log)


@asynccontextmanager
async def serving(log: Path, *args: str) -> AsyncIterator[Served]:
    """``python -m agent serve ARGS``, once it has printed the address it serves on."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "serve", *args,
            stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START_S)
        text = line.decode().strip()
        prefix = "rtenv-agent serving on "
        served = Served(proc, text.removeprefix(prefix), log)
        assert text.startswith(prefix), f"no serving line: {text!r}; log:\n{served.log_text()}"
        yield served
    finally:
        await stop(proc)


async def run_cli(*args: str, timeout_s: float = START_S) -> tuple[int, str, str]:
    """Run ``python -m agent ARGS`` to its end (bounded); return (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        await stop(proc)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def refused(log: Path, *args: str, under: Sequence[str] = ()) -> tuple[int, str]:
    """Start ``serve ARGS`` (through the command ``under``, if given, which must exec it), which
    must exit without serving; return (exit code, stderr).

    Fails at once, rather than at a timeout, if it serves after all (it is then stopped)."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *under, sys.executable, "-m", "agent", "serve", *args,
            stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START_S)
        assert not line, f"serve {args} was expected to refuse, but it printed {line!r}"
        code = await asyncio.wait_for(proc.wait(), STOP_S)
    finally:
        await stop(proc)
    text = _read(log)
    assert "Traceback" not in text, text
    return code, text


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


async def wait_health_serving(address: str, service: str = "", timeout_s: float = START_S) -> None:
    """Poll the standard health check until it answers SERVING, within a deadline."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with grpc.aio.insecure_channel(address, options=NO_PROXY) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        for _ in range(1000):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                reply = await check(
                    health_pb2.HealthCheckRequest(service=service),
                    timeout=min(remaining, 5.0),
                    wait_for_ready=True,
                )
            except grpc.aio.AioRpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            else:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            await asyncio.sleep(0.05)
    raise AssertionError(f"{address} health({service!r}) not SERVING in {timeout_s}s: {last}")
