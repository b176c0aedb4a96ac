"""A real agent in the test's own process, on a real unix socket, with a client for its three
RPCs; a stub servicer served the same way; readers and patches of what the agent holds."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from agent.app.config import Settings
from agent.install.fetch.base import FetchLimits
from agent.ops.server import Agent
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.tempdirs import short_tempdir

FAST_FETCH = FetchLimits(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.05)


class AgentCalls:
    """The three RPCs as a test calls them, on ``self.stub``."""

    stub: agent_pb2_grpc.RuntimeEnvAgentStub

    async def create(
        self, serialized: str, *, request_id: str = "", timeout_s: int = 0
    ) -> agent_pb2.CreateRuntimeEnvReply:
        request = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=serialized,
            request_id=request_id,
            config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=timeout_s),
        )
        reply: agent_pb2.CreateRuntimeEnvReply = await self.stub.CreateRuntimeEnv(
            request, timeout=30
        )
        return reply

    async def delete(self, env_id: str, *, request_id: str = "") -> int:
        reply = await self.stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id, request_id=request_id),
            timeout=30,
        )
        remaining: int = reply.remaining_references
        return remaining

    async def info(self) -> agent_pb2.GetRuntimeEnvsInfoReply:
        reply: agent_pb2.GetRuntimeEnvsInfoReply = await self.stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30
        )
        return reply


@dataclass
class RunningAgent(AgentCalls):
    agent: Agent
    stub: agent_pb2_grpc.RuntimeEnvAgentStub
    root: Path

    @property
    def service(self) -> Any:
        assert self.agent.service is not None
        return self.agent.service

    def uri_dirs(self) -> list[str]:
        return sorted(p.name for p in (self.root / "uris").iterdir())

    async def settle(self) -> None:
        """Wait for the store's passes and background deletions; then the disk matches the
        maps."""
        await self.service.store.settle()


@asynccontextmanager
async def running_agent(**overrides: Any) -> AsyncIterator[RunningAgent]:
    """A real agent on a real unix socket, in this process, and a client stub for it."""
    base = short_tempdir()
    root = base / "root"
    settings = replace(Settings(root=root), **{"fetch": FAST_FETCH, **overrides})
    agent = Agent(settings)
    await agent.start()
    channel = grpc.aio.insecure_channel(agent.address)
    try:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        yield RunningAgent(agent, stub, root)
    finally:
        await channel.close()
        await agent.stop(grace=0.5)
        shutil.rmtree(base, ignore_errors=True)


@asynccontextmanager
async def served(
    stub: agent_pb2_grpc.RuntimeEnvAgentServicer, base: Path
) -> AsyncIterator[grpc.aio.Channel]:
    """A stub agent (a servicer) served on a unix socket in ``base``, and a channel to it;
    both stopped after."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_RuntimeEnvAgentServicer_to_server(stub, server)  # type: ignore[no-untyped-call]
    address = f"unix:{base}/stub.sock"
    server.add_insecure_port(address)
    await server.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(0)


def listed(root: Path, sub: str) -> list[str]:
    """The names under ``root/sub``; for tmp/ and trash/ (one folder per agent serving the
    root, named by its holder id), the names inside those folders."""
    folder = root / sub
    if sub not in ("tmp", "trash"):
        return sorted(p.name for p in folder.iterdir())
    return sorted(p.name for own in folder.iterdir() if own.is_dir() for p in own.iterdir())


def slow_passes(a: RunningAgent, seconds: float = 0.1) -> Callable[..., Awaitable[object]]:
    """A replacement for the agent's index ``sweep`` that waits ``seconds`` first (an index
    busy with other agents); set it with ``monkeypatch.setattr(a.service.store.db, "sweep",
    ...)``."""
    sweep = a.service.store.db.sweep

    async def slow_sweep(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(seconds)
        return await sweep(*args, **kwargs)

    return slow_sweep


async def stray_cancellation(*args: object, **kwargs: object) -> object:
    """A stand-in for a service call that meets a cancellation nobody asked for (a cancelled
    future it awaits): a bug below the doors."""
    cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cancelled.cancel()
    await cancelled
    raise AssertionError("unreachable: awaiting a cancelled future raises")
