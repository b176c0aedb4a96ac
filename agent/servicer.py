"""The gRPC servicer: protocol messages in and out, errors to status codes. Glue only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from agent.errors import AgentError
from agent.metrics import Metrics
from agent.recovery import RecoverySummary
from agent.service import AgentService, Created, EnvRecord, EnvState
from agent.store import UriState
from rtenv.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")
_REPLIES_KEPT = 4096


async def answer(
    rpc: str,
    context: grpc.aio.ServicerContext[object, object],
    request_id: str,
    call: Callable[[], Awaitable[T]],
    metrics: Metrics | None = None,
) -> T:
    """Run one RPC; map its error to a status, count it and log it. The one place errors become
    statuses.

    Expected errors (``AgentError``) are answered with their code and message and logged as one
    line with the env id and request id; anything else is a bug: logged with its traceback and
    answered INTERNAL. Cancellation passes through untouched (the client has gone).
    """
    code = grpc.StatusCode.OK
    try:
        return await call()
    except AgentError as exc:
        code = exc.code
        env_id = exc.env_id
        log.warning(
            "%s failed (env_id=%s request_id=%r): %s: %s", rpc, env_id or "-", request_id,
            exc.code.name, exc, extra={"env_id": env_id, "request_id": request_id,
                                       "rpc": rpc, "code": exc.code.name},
        )  # fmt: skip
        await context.abort(exc.code, exc.message)
    except asyncio.CancelledError:
        code = grpc.StatusCode.CANCELLED
        raise
    except Exception as exc:
        code = grpc.StatusCode.INTERNAL
        log.exception(
            "%s failed with a bug (request_id=%r)", rpc, request_id,
            extra={"rpc": rpc, "request_id": request_id},
        )  # fmt: skip
        await context.abort(
            grpc.StatusCode.INTERNAL, f"internal error in {rpc}: {type(exc).__name__}: {exc}"
        )
    finally:
        if metrics is not None:
            metrics.count_request(rpc, code)
    raise AssertionError("context.abort returned")


class RuntimeEnvAgentServicer(agent_pb2_grpc.RuntimeEnvAgentServicer):
    def __init__(
        self, service: AgentService, recovery: RecoverySummary, metrics: Metrics | None = None
    ) -> None:
        self._service = service
        self._recovery = recovery
        self._metrics = metrics
        self._replies: dict[str, agent_pb2.CreateRuntimeEnvReply] = {}  # oldest first

    async def CreateRuntimeEnv(
        self,
        request: agent_pb2.CreateRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.CreateRuntimeEnvReply:
        async def call() -> agent_pb2.CreateRuntimeEnvReply:
            started = time.perf_counter()
            created = await self._service.create(
                request.serialized_runtime_env,
                request.config.setup_timeout_seconds,
                request.request_id,
            )
            if self._metrics is not None:
                self._metrics.observe_create(created.hit, time.perf_counter() - started)
            return self._reply(created)

        return await answer("CreateRuntimeEnv", context, request.request_id, call, self._metrics)

    def _reply(self, created: Created) -> agent_pb2.CreateRuntimeEnvReply:
        """The reply of a create: the same for every create of an env, so built once and kept
        (grpc serialises it; nothing changes it)."""
        reply = self._replies.get(created.env_id)
        if reply is None:
            reply = agent_pb2.CreateRuntimeEnvReply(
                runtime_env_id=created.env_id,
                context=agent_pb2.RuntimeEnvContext(
                    env_vars=created.context.env_vars,
                    cwd=created.context.cwd,
                    py_executable=created.context.py_executable,
                ),
                uris=created.uris,
            )
            if len(self._replies) >= _REPLIES_KEPT:
                del self._replies[next(iter(self._replies))]
            self._replies[created.env_id] = reply
        return reply

    async def DeleteRuntimeEnv(
        self,
        request: agent_pb2.DeleteRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.DeleteRuntimeEnvReply:
        async def call() -> agent_pb2.DeleteRuntimeEnvReply:
            remaining = await self._service.delete(
                request.runtime_env_id, request.serialized_runtime_env, request.request_id
            )
            return agent_pb2.DeleteRuntimeEnvReply(remaining_references=remaining)

        return await answer("DeleteRuntimeEnv", context, request.request_id, call, self._metrics)

    async def GetRuntimeEnvsInfo(
        self,
        request: agent_pb2.GetRuntimeEnvsInfoRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.GetRuntimeEnvsInfoReply:
        async def call() -> agent_pb2.GetRuntimeEnvsInfoReply:
            reply = info_reply(self._service, request.limit)
            r = self._recovery
            reply.recovery.CopyFrom(
                agent_pb2.RecoverySummary(
                    rows_kept=r.rows_kept, rows_dropped=r.rows_dropped,
                    orphans_deleted=r.orphans_deleted, bytes_freed=r.bytes_freed,
                    envs_forgotten=r.envs_forgotten, seconds=r.seconds,
                )
            )  # fmt: skip
            return reply

        return await answer("GetRuntimeEnvsInfo", context, "", call, self._metrics)


def info_reply(service: AgentService, limit: int) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """A snapshot of both maps and the store, taken in one step on the loop."""
    cap = service.settings.max_info_envs
    limit = cap if limit <= 0 else min(limit, cap)
    envs = [_env_info(service, r) for r in list(service.records.values())[:limit]]
    live = set(service.records)
    for failed in reversed(service.failures):
        if len(envs) >= limit:
            break
        if failed.env.env_id not in live:
            envs.append(_env_info(service, failed))
    uris = []
    for entry in service.store.entries():
        count = service.tables.uri_count(entry.key)
        if entry.state is UriState.READY:
            state = "unused" if service.store.is_unused(entry.key) else "ready"
        else:
            state = entry.state.value
        uris.append(
            agent_pb2.UriInfo(
                uri=entry.key.uri,
                kind=entry.key.kind.value,
                references=count,
                state=state,
                size_bytes=entry.size,
                last_used_ms=entry.last_used_ms,
                local_path=str(entry.path) if entry.state is UriState.READY else "",
            )
        )
    stats = service.store.stats()
    return agent_pb2.GetRuntimeEnvsInfoReply(
        envs=envs,
        uris=uris,
        cache=agent_pb2.CacheStats(
            used_bytes=stats.used_bytes,
            unused_bytes=stats.unused_bytes,
            budget_bytes=stats.budget_bytes,
            downloads=stats.downloads,
            extractions=stats.extractions,
            evictions=stats.evictions,
            hits=stats.hits,
        ),
        total_envs=len(service.records),
    )


def _env_info(service: AgentService, record: EnvRecord) -> agent_pb2.RuntimeEnvInfo:
    env = record.env
    live = record.state is not EnvState.FAILED
    return agent_pb2.RuntimeEnvInfo(
        runtime_env_id=env.env_id,
        serialized_runtime_env=env.canonical,
        references=service.tables.env_count(env.env_id) if live else 0,
        uris=[str(key) for key in env.uri_keys],
        state=record.state.value,
        error=record.error,
        creation_time_ms=record.created_ms,
    )
