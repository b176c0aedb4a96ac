"""A fake agent (a servicer honouring test-only env fields) and raylet-sim's worker pool served by
it on a unix socket, with a client of fast retries."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from raylet_sim.client import AgentClient, RetryPolicy
from raylet_sim.pool import WorkerPool
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.in_process import served
from tests.harness.tempdirs import short_tempdir

FAST = RetryPolicy(attempts=4, backoff_initial_s=0.01, backoff_max_s=0.05, call_timeout_s=20.0)


STUBMOD = """\
import os, sys
def info():
    return {"cwd": os.getcwd(), "exe": sys.executable, "var": os.environ.get("STUB_VAR"),
            "pid": os.getpid()}
"""


@dataclass
class Call:
    method: str
    request_id: str
    env: str  # the env JSON (create) or the runtime env id (delete)
    job_id: str = ""  # a create's
    eager_install: bool = False  # a create's config.eager_install


@dataclass
class StubAgent(agent_pb2_grpc.RuntimeEnvAgentServicer):
    """A fake agent. An env JSON may carry test-only fields it honours: ``reject`` (answer
    INVALID_ARGUMENT), ``py_executable``, ``big_var_kib`` (one env var of that many KiB)."""

    workdir: Path
    calls: list[Call] = field(default_factory=list)
    refs: dict[str, int] = field(default_factory=dict)  # runtime env id -> references
    unavailable: int = 0  # answer this many next calls (create or delete) UNAVAILABLE
    hold: asyncio.Event | None = None  # when set: creates wait for it
    _seen: set[str] = field(default_factory=set)

    def creates(self) -> list[Call]:
        return [c for c in self.calls if c.method == "create"]

    def deletes(self) -> list[Call]:
        return [c for c in self.calls if c.method == "delete"]

    async def CreateRuntimeEnv(
        self,
        request: agent_pb2.CreateRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> agent_pb2.CreateRuntimeEnvReply:
        key = request.serialized_runtime_env
        self.calls.append(
            Call("create", request.request_id, key, request.job_id, request.config.eager_install)
        )
        await self._maybe_unavailable(context)
        env = json.loads(key)
        if "reject" in env:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rejected: {env['reject']}")
        if self.hold is not None:
            await self.hold.wait()
        env_id = "env-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        if request.request_id not in self._seen:  # a retry with the same id counts once
            self._seen.add(request.request_id)
            self.refs[env_id] = self.refs.get(env_id, 0) + 1
        env_vars = {"PYTHONPATH": str(self.workdir), **env.get("env_vars", {})}
        if "big_var_kib" in env:
            env_vars["BIG"] = "x" * (1024 * env["big_var_kib"])
        return agent_pb2.CreateRuntimeEnvReply(
            runtime_env_id=env_id,
            context=agent_pb2.RuntimeEnvContext(
                env_vars=env_vars,
                cwd=str(self.workdir),
                # shell words, as the agent sends it: a path with a space is quoted
                py_executable=env.get("py_executable", shlex.quote(sys.executable)),
            ),
        )

    async def DeleteRuntimeEnv(
        self,
        request: agent_pb2.DeleteRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> agent_pb2.DeleteRuntimeEnvReply:
        self.calls.append(Call("delete", request.request_id, request.runtime_env_id))
        await self._maybe_unavailable(context)
        env_id = request.runtime_env_id
        if request.request_id not in self._seen:
            self._seen.add(request.request_id)
            if self.refs.get(env_id, 0) <= 0:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no env {env_id}")
            self.refs[env_id] -= 1
        return agent_pb2.DeleteRuntimeEnvReply(remaining_references=self.refs[env_id])

    async def _maybe_unavailable(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self.unavailable > 0:
            self.unavailable -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: agent restarting")


@dataclass
class Harness:
    stub: StubAgent
    client: AgentClient
    pool: WorkerPool

    def deleted_ids(self) -> list[str]:
        return [c.env for c in self.stub.deletes()]


@asynccontextmanager
async def harness(
    idle_timeout_s: float = 30.0, env_keepalive_s: float = 0.0, max_idle_workers: int | None = None
) -> AsyncIterator[Harness]:
    """A stub agent on a unix socket, a client with fast retries, and a pool; all stopped."""
    base = short_tempdir()
    (base / "stubmod.py").write_text(STUBMOD)
    stub = StubAgent(base)
    try:
        async with served(stub, base) as channel:
            client = AgentClient(channel, FAST)
            pool = WorkerPool(
                client,
                idle_timeout_s=idle_timeout_s,
                env_keepalive_s=env_keepalive_s,
                max_idle_workers=max_idle_workers,
            )
            try:
                yield Harness(stub, client, pool)
            finally:
                if stub.hold is not None:
                    stub.hold.set()
                await asyncio.wait_for(pool.close(), 30)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def absent(mapping: Mapping[int, object], item: int) -> Callable[[], bool]:
    return lambda: item not in mapping


def key(name: str, **extra: Any) -> str:
    return json.dumps({"name": name, **extra})


INFO = "stubmod:info"
