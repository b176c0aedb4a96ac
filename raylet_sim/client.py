"""The pool's client of the agent: the generated stubs, a request id per call, bounded retries.

Retries reuse the call's ``request_id``, so the agent counts a retried create or delete once.
Only failures that say nothing about the request itself are retried: UNAVAILABLE (the agent is
restarting or the connection broke) and a client-side DEADLINE_EXCEEDED. The backoff doubles up
to a cap, and each wait is jittered (a random share of it, ``jitter``, is drawn), so the pools of
a node whose agent restarted do not retry in lockstep.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from rtenv.v1 import agent_pb2, agent_pb2_grpc

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0
    call_timeout_s: float = 900.0  # a create may download gigabytes
    jitter: float = 0.5  # each wait is the backoff times a uniform draw in [1 - jitter, 1]

    def wait_s(self, retry: int, draw: float) -> float:
        """The wait before retry number ``retry`` (1, 2, ...), given a draw in [0, 1)."""
        backoff = min(self.backoff_initial_s * 2.0 ** (retry - 1), self.backoff_max_s)
        return backoff * (1.0 - self.jitter * draw)


class AgentClient:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        policy: RetryPolicy = RetryPolicy(),
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        self._policy = policy
        self._sleep = sleep
        self._draw = draw  # the jitter's random source, in [0, 1)
        self.calls = 0  # RPCs sent, retries included

    async def create(
        self, serialized_env: str, job_id: str = "", *, eager_install: bool = False
    ) -> agent_pb2.CreateRuntimeEnvReply:
        """CreateRuntimeEnv; ``eager_install`` sets ``config.eager_install`` (a job's env,
        created at the job's start rather than at its first worker)."""
        request = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=serialized_env, job_id=job_id, request_id=_new_id("create")
        )
        if eager_install:
            request.config.eager_install = True
        reply: agent_pb2.CreateRuntimeEnvReply = await self._retry(
            lambda timeout: self._stub.CreateRuntimeEnv(request, timeout=timeout)
        )
        return reply

    async def delete(self, runtime_env_id: str) -> int:
        request = agent_pb2.DeleteRuntimeEnvRequest(
            runtime_env_id=runtime_env_id, request_id=_new_id("delete")
        )
        reply: agent_pb2.DeleteRuntimeEnvReply = await self._retry(
            lambda timeout: self._stub.DeleteRuntimeEnv(request, timeout=timeout)
        )
        return reply.remaining_references

    async def info(self, limit: int = 0) -> agent_pb2.GetRuntimeEnvsInfoReply:
        request = agent_pb2.GetRuntimeEnvsInfoRequest(limit=limit)
        reply: agent_pb2.GetRuntimeEnvsInfoReply = await self._retry(
            lambda timeout: self._stub.GetRuntimeEnvsInfo(request, timeout=min(timeout, 30.0))
        )
        return reply

    async def _retry(self, call: Callable[[float], Awaitable[T]]) -> T:
        policy = self._policy
        for attempt in range(1, policy.attempts + 1):
            self.calls += 1
            try:
                return await call(policy.call_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or attempt == policy.attempts:
                    raise
            await self._sleep(policy.wait_s(attempt, self._draw()))
        raise AssertionError("unreachable: the loop returns or raises")


def _new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"
