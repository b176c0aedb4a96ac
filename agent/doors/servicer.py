"""The gRPC servicer: protocol messages in and out; each call runs through ``answer``
(``grpc_errors.py``), which turns its error into a status. Glue only: info is the service's
snapshot converted (it reads neither the store nor the tables)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TypeVar

import grpc

from agent.app.service import AgentService, Created
from agent.app.snapshot import EnvView, Snapshot, UriView
from agent.core.bounded import BoundedCache
from agent.core.runtime_env import env_var_bytes
from agent.doors.grpc_errors import answer
from agent.doors.metrics import Metrics
from rtenv.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")
_REPLIES_KEPT = 4096
_REPLIES_BYTES = 8 * 1024 * 1024  # a reply holds the env's variables: up to 1 MiB of them
# GetRuntimeEnvsInfo stays under a default client's 4 MiB receive limit: envs fill up to the
# first figure, URIs up to the second (one env is at most ~2 MiB: its JSON and its URIs again).
_INFO_ENV_BYTES = 5 * 1024 * 1024 // 2
_INFO_BYTES = 7 * 1024 * 1024 // 2


class RuntimeEnvAgentServicer(agent_pb2_grpc.RuntimeEnvAgentServicer):
    def __init__(self, service: AgentService, metrics: Metrics | None = None) -> None:
        self._service = service
        self._metrics = metrics
        self._replies: BoundedCache[str, agent_pb2.CreateRuntimeEnvReply] = BoundedCache(
            _REPLIES_KEPT, _REPLIES_BYTES
        )

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
                job_id=request.job_id,
                eager_install=request.config.eager_install,
            )
            if self._metrics is not None:
                self._metrics.observe_create(created.hit, time.perf_counter() - started)
            return self._reply(created)

        return await answer(
            "CreateRuntimeEnv", context, request.request_id, call, self._metrics,
            agent_pb2.CreateRuntimeEnvReply,
        )  # fmt: skip

    def _reply(self, created: Created) -> agent_pb2.CreateRuntimeEnvReply:
        """The reply of a create: the same for every create of an env, so built once and kept
        (grpc serialises it; nothing changes it), within a byte budget."""
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
            weight = env_var_bytes(created.context.env_vars) + 100 * len(created.uris) + 1024
            self._replies.put(created.env_id, reply, weight + sum(map(len, created.uris)))
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

        return await answer(
            "DeleteRuntimeEnv", context, request.request_id, call, self._metrics,
            agent_pb2.DeleteRuntimeEnvReply,
        )  # fmt: skip

    async def GetRuntimeEnvsInfo(
        self,
        request: agent_pb2.GetRuntimeEnvsInfoRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.GetRuntimeEnvsInfoReply:
        async def call() -> agent_pb2.GetRuntimeEnvsInfoReply:
            return info_reply(await self._service.current_snapshot(request.limit))

        return await answer(
            "GetRuntimeEnvsInfo", context, "", call, self._metrics,
            agent_pb2.GetRuntimeEnvsInfoReply,
        )  # fmt: skip


def info_reply(snapshot: Snapshot) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """A snapshot as the info reply, capped by size under a default client's 4 MiB: envs fill
    up to ``_INFO_ENV_BYTES``, URIs what is left of ``_INFO_BYTES``; ``total_envs`` and
    ``total_uris`` say how many there are, listed or not."""
    envs = _fill((_env_info(e) for e in snapshot.envs), _INFO_ENV_BYTES)
    used = sum(e.ByteSize() for e in envs)
    uris = _fill((_uri_info(u) for u in snapshot.uris), _INFO_BYTES - used)
    c, r = snapshot.cache, snapshot.recovery
    cache = agent_pb2.CacheStats(
        used_bytes=c.used_bytes, unused_bytes=c.unused_bytes, budget_bytes=c.budget_bytes,
        downloads=c.downloads, extractions=c.extractions, evictions=c.evictions, hits=c.hits,
    )  # fmt: skip
    recovery = agent_pb2.RecoverySummary(
        rows_kept=r.rows_kept, rows_dropped=r.rows_dropped, orphans_deleted=r.orphans_deleted,
        bytes_freed=r.bytes_freed, envs_forgotten=r.envs_forgotten, seconds=r.seconds,
    )  # fmt: skip
    return agent_pb2.GetRuntimeEnvsInfoReply(
        envs=envs, uris=uris, cache=cache, total_envs=snapshot.total_envs,
        total_uris=snapshot.total_uris, recovery=recovery,
    )  # fmt: skip


M = TypeVar("M", agent_pb2.RuntimeEnvInfo, agent_pb2.UriInfo)


def _fill(items: Iterable[M], budget: int) -> list[M]:
    """The items, in order, while their encoded size stays within ``budget``."""
    out: list[M] = []
    for item in items:
        budget -= item.ByteSize() + 8  # the field's tag and length
        if budget < 0:
            break
        out.append(item)
    return out


def _uri_info(uri: UriView) -> agent_pb2.UriInfo:
    return agent_pb2.UriInfo(
        uri=uri.uri,
        kind=uri.kind,
        references=uri.references,
        state=uri.state.value,
        size_bytes=uri.size_bytes,
        last_used_ms=uri.last_used_ms,
        local_path=uri.local_path,
    )


def _env_info(env: EnvView) -> agent_pb2.RuntimeEnvInfo:
    return agent_pb2.RuntimeEnvInfo(
        runtime_env_id=env.env_id,
        serialized_runtime_env=env.canonical,
        references=env.references,
        uris=env.uris,
        state=env.state.value,
        error=env.error,
        creation_time_ms=env.created_ms,
        job_ids=env.job_ids,
        eager_install=env.eager_install,
    )
