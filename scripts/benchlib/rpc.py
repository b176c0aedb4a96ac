"""The one client code every figure and its baseline go through: create+delete pairs at a
concurrency, creates of many envs at once, and GetRuntimeEnvsInfo probes at a fixed period.
Every loop is bounded by a count and a deadline.

The calls go to a ``Target``: this agent's gRPC door (``GrpcTarget``, what a gRPC stub is
wrapped in) or Ray's HTTP protocol (``benchlib.ray_http.RayHttpTarget``: this agent's Ray door
or Ray's own agent), so the same loops measure every door and Ray's agent alike. A failed call
raises ``CallFailed`` whatever the transport.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from rtenv.v1 import agent_pb2, agent_pb2_grpc

CALL_TIMEOUT_S = 60.0


def stub(channel: grpc.aio.Channel) -> agent_pb2_grpc.RuntimeEnvAgentStub:
    return agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]


class CallFailed(Exception):
    """A call that got no good reply: a gRPC error, an HTTP error, a FAILED status."""


class Target(Protocol):
    """Where the calls go. ``create`` returns what ``delete`` gives the reference back with
    (an env id over gRPC, the serialized env itself in Ray's protocol)."""

    async def create(self, env: str, timeout_s: float) -> str: ...

    async def delete(self, handle: str, timeout_s: float) -> None: ...

    async def info(self, timeout_s: float) -> Any: ...


class GrpcTarget:
    """This agent's gRPC door, through a stub."""

    def __init__(self, target: agent_pb2_grpc.RuntimeEnvAgentStub) -> None:
        self.stub = target

    async def create(self, env: str, timeout_s: float) -> str:
        request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env)
        try:
            reply = await self.stub.CreateRuntimeEnv(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise CallFailed(_grpc_text(exc)) from exc
        env_id: str = reply.runtime_env_id
        return env_id

    async def delete(self, handle: str, timeout_s: float) -> None:
        request = agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=handle)
        try:
            await self.stub.DeleteRuntimeEnv(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise CallFailed(_grpc_text(exc)) from exc

    async def info(self, timeout_s: float) -> agent_pb2.GetRuntimeEnvsInfoReply:
        request = agent_pb2.GetRuntimeEnvsInfoRequest(limit=1)
        try:
            reply: agent_pb2.GetRuntimeEnvsInfoReply = await self.stub.GetRuntimeEnvsInfo(
                request, timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise CallFailed(_grpc_text(exc)) from exc
        return reply


def _grpc_text(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


def as_target(target: Target | agent_pb2_grpc.RuntimeEnvAgentStub) -> Target:
    """A gRPC stub is this agent's gRPC door; anything else is already a target."""
    if isinstance(target, agent_pb2_grpc.RuntimeEnvAgentStub):
        return GrpcTarget(target)
    return target


@dataclass
class Calls:
    """Latencies of the calls made, errors, and the wall time they took."""

    create_s: list[float] = field(default_factory=list)
    delete_s: list[float] = field(default_factory=list)
    info_s: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    error_sample: str = ""

    @property
    def pairs(self) -> int:
        return len(self.delete_s)

    def failed(self, exc: CallFailed) -> None:
        self.errors += 1
        if not self.error_sample:
            self.error_sample = str(exc)[:500]


async def pairs(
    target: Target | agent_pb2_grpc.RuntimeEnvAgentStub,
    envs: Callable[[int], str],
    count: int,
    concurrency: int,
    *,
    deadline_s: float,
    on_issue: Callable[[int], None] | None = None,
) -> Calls:
    """``count`` create+delete pairs, ``concurrency`` at a time; pair i creates ``envs(i)`` and
    deletes the id the create returned. Stops issuing at ``deadline_s`` (monotonic)."""
    calls = Calls()
    issued = 0
    to = as_target(target)

    async def worker() -> None:
        nonlocal issued
        while issued < count and time.monotonic() < deadline_s:
            i = issued
            issued += 1
            if on_issue is not None:
                on_issue(i)
            t0 = time.perf_counter()
            try:
                handle = await to.create(envs(i), CALL_TIMEOUT_S)
            except CallFailed as exc:
                calls.failed(exc)
                continue
            t1 = time.perf_counter()
            calls.create_s.append(t1 - t0)
            try:
                await to.delete(handle, CALL_TIMEOUT_S)
            except CallFailed as exc:
                calls.failed(exc)
                continue
            calls.delete_s.append(time.perf_counter() - t1)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    calls.wall_s = time.perf_counter() - started
    return calls


async def creates(
    target: Target | agent_pb2_grpc.RuntimeEnvAgentStub,
    envs: Callable[[int], str],
    count: int,
    concurrency: int,
    *,
    deadline_s: float,
) -> tuple[Calls, list[str]]:
    """``count`` creates (no deletes), ``concurrency`` at a time, until ``deadline_s``; return
    their latencies and the handles, so the caller can give the references back."""
    calls = Calls()
    ids: list[str] = []
    issued = 0
    to = as_target(target)

    async def worker() -> None:
        nonlocal issued
        while issued < count and time.monotonic() < deadline_s:
            i = issued
            issued += 1
            t0 = time.perf_counter()
            try:
                handle = await to.create(envs(i), CALL_TIMEOUT_S * 10)
            except CallFailed as exc:
                calls.failed(exc)
                continue
            calls.create_s.append(time.perf_counter() - t0)
            ids.append(handle)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    calls.wall_s = time.perf_counter() - started
    return calls, ids


async def probe_info(
    target: Target | agent_pb2_grpc.RuntimeEnvAgentStub,
    period_s: float,
    *,
    until: asyncio.Future[Any] | None,
    max_calls: int,
    deadline_s: float,
    on_reply: Callable[[Any], None] | None = None,
) -> Calls:
    """GetRuntimeEnvsInfo(limit=1) every ``period_s`` (the next call starts at its slot, or at
    once if the last one overran it) until ``until`` is done, ``max_calls`` or ``deadline_s``."""
    calls = Calls()
    started = time.perf_counter()
    to = as_target(target)
    for n in range(max_calls):
        if (until is not None and until.done()) or time.monotonic() >= deadline_s:
            break
        slot = started + n * period_s
        wait = slot - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        t0 = time.perf_counter()
        try:
            reply = await to.info(10)
        except CallFailed as exc:
            calls.failed(exc)
            continue
        calls.info_s.append(time.perf_counter() - t0)
        if on_reply is not None:
            on_reply(reply)
    calls.wall_s = time.perf_counter() - started
    return calls


async def info(address: str) -> agent_pb2.GetRuntimeEnvsInfoReply:
    async with grpc.aio.insecure_channel(address) as channel:
        reply: agent_pb2.GetRuntimeEnvsInfoReply = await stub(channel).GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(limit=1), timeout=30
        )
    return reply
