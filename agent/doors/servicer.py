"""The gRPC servicer: protocol messages in and out; each call runs through ``answer``
(``grpc_errors.py``), which turns its error into a status. Glue only: info is the service's
snapshot converted (it reads neither the store nor the tables).

Served by method handlers that take the request's bytes and give the reply's (no grpc
(de)serializers; registered by method as generated code registers a servicer's: see
``handlers``): each handler parses its request itself (a body that is not the message is
INVALID_ARGUMENT, answered and counted like any bad input) and a create answers the reply
prepared once per env (its bytes kept, within a byte budget). The hot path, a create or a
delete with no request id, is one synchronous step of the service (``create_hit``,
``delete_now``) with metrics children bound once; anything else, and any error the hot path
meets, goes through ``answer`` (an error is met again there, before anything is counted, and
answered and logged with the request's fields). ``grpc-routes`` in ``scripts/bench.py``
measures this route against the generated servicer and the sync server.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from agent.app.created import Created, HitKey
from agent.app.service import AgentService
from agent.app.snapshot import BuildView, EnvView, Snapshot, UriView
from agent.core.bounded import BoundedCache
from agent.core.errors import AgentError, InvalidArgument
from agent.core.runtime_env import env_var_bytes
from agent.doors.grpc_errors import answer
from agent.doors.metrics import OK, Metrics
from rtenv.v1 import agent_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")
V = TypeVar("V")
R = TypeVar("R", bound=Message)
Context = grpc.aio.ServicerContext[Any, Any]
SERVICE = agent_pb2.DESCRIPTOR.services_by_name["RuntimeEnvAgent"].full_name
_CREATE, _DELETE, _INFO = "CreateRuntimeEnv", "DeleteRuntimeEnv", "GetRuntimeEnvsInfo"
HOT_METHODS = (_CREATE, _DELETE)  # registered by method (``add_services``)
_REPLIES_KEPT = 4096
_REPLIES_BYTES = 8 * 1024 * 1024  # a reply holds the env's variables: up to 1 MiB of them
# GetRuntimeEnvsInfo stays under a default client's 4 MiB receive limit: envs fill up to the
# first figure, URIs up to the second (one env is at most ~2 MiB: its JSON and its URIs again).
_INFO_ENV_BYTES = 5 * 1024 * 1024 // 2
_INFO_BYTES = 7 * 1024 * 1024 // 2
_HOT_KEPT = 1024  # requests remembered by their bytes (see ``_hot_creates``)
_HOT_BYTES = 2 * 1024 * 1024
_HOT_REQUEST_BYTES = 4096  # larger requests are parsed every time
# A delete's reply for the counts a delete usually leaves, serialised once.
_DELETE_REPLIES_KEPT = 64
_DELETE_REPLIES = tuple(
    agent_pb2.DeleteRuntimeEnvReply(remaining_references=n).SerializeToString()
    for n in range(_DELETE_REPLIES_KEPT)
)


class RuntimeEnvAgentServicer:
    def __init__(self, service: AgentService, metrics: Metrics | None = None) -> None:
        self._service = service
        self._metrics = metrics
        # env id -> its create reply's bytes: the same for every create of the env.
        self._replies: BoundedCache[str, bytes] = BoundedCache(_REPLIES_KEPT, _REPLIES_BYTES)
        # The bytes of requests (no request id) that were answered by the hot path, small
        # ones only: a create's checked key and reply, a delete's env id. The same bytes are
        # the same request, and its checks are a pure function of it.
        # Plain dicts, read with one C call per request (``_HotRequests``).
        self._hot_creates: _HotRequests[_Hot] = _HotRequests(_HOT_KEPT, _HOT_BYTES)
        self._hot_deletes: _HotRequests[str] = _HotRequests(_HOT_KEPT, _HOT_BYTES // 4)
        self._create_hit = service.create_hit
        self._delete_now = service.delete_now
        self._hit_ok: Any = None  # the hot path's metrics children, bound once
        self._hit_latency: Any = None
        self._delete_ok: Any = None
        if metrics is not None:
            self._hit_ok = metrics.request_counter(_CREATE, OK)
            self._hit_latency = metrics.create_latency(True)
            self._delete_ok = metrics.request_counter(_DELETE, OK)

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """The service's method handlers, bytes in and out (no (de)serializers): for
        ``add_registered_method_handlers`` (grpc finds them by method in C; a generic
        handler's lookup runs Python on every call)."""
        return {
            _CREATE: grpc.unary_unary_rpc_method_handler(_Handler(self.create)),
            _DELETE: grpc.unary_unary_rpc_method_handler(_Handler(self.delete)),
            _INFO: grpc.unary_unary_rpc_method_handler(_Handler(self.info)),
        }

    async def create(self, raw: bytes, context: Context) -> bytes:
        hot = self._hot_creates.get(raw)
        if hot is not None:  # this very request was a hit before: checked then (a pure check)
            started = perf_counter()
            if self._create_hit(hot.key):
                if self._hit_ok is not None:
                    self._hit_latency.observe(perf_counter() - started)
                    self._hit_ok.inc()
                return hot.reply
        request = _decode(agent_pb2.CreateRuntimeEnvRequest, raw)
        if request is None:
            return await self._undecodable(_CREATE, agent_pb2.CreateRuntimeEnvRequest, raw, context)
        if not request.request_id:  # the hot path: a hit is answered in one step
            started = perf_counter()
            config = request.config
            try:
                key = self._service.check_create(
                    request.serialized_runtime_env,
                    config.setup_timeout_seconds,
                    job_id=request.job_id,
                    eager_install=config.eager_install,
                )
            except AgentError:  # met again below, before anything is counted
                key = None
            except Exception as exc:  # a bug: answered and logged as one
                return await answer(_CREATE, context, "", _raising(exc), self._metrics, bytes)
            if key is not None and self._service.create_hit(key):
                env_id = key.env.env_id
                reply = self._replies.get(env_id) or self._prepare(self._service.created(key.env))
                if len(raw) <= _HOT_REQUEST_BYTES:
                    weight = 2 * len(raw) + len(reply) + 512  # the key's env may be its own
                    self._hot_creates.remember(raw, _Hot(key, reply), weight)
                self._count_hit(started)
                return reply

        async def call() -> bytes:
            started = perf_counter()
            created = await self._service.create(
                request.serialized_runtime_env,
                request.config.setup_timeout_seconds,
                request.request_id,
                job_id=request.job_id,
                eager_install=request.config.eager_install,
            )
            if self._metrics is not None:
                self._metrics.observe_create(created.hit, perf_counter() - started)
            return self._replies.get(created.env_id) or self._prepare(created)

        return await answer(_CREATE, context, request.request_id, call, self._metrics, bytes)

    def _count_hit(self, started: float) -> None:
        if self._hit_ok is not None:
            self._hit_latency.observe(perf_counter() - started)
            self._hit_ok.inc()

    def _prepare(self, created: Created) -> bytes:
        """The reply of a create: the same for every create of an env, so serialised once and
        kept, within a byte budget."""
        reply = agent_pb2.CreateRuntimeEnvReply(
            runtime_env_id=created.env_id,
            context=agent_pb2.RuntimeEnvContext(
                env_vars=created.context.env_vars,
                cwd=created.context.cwd,
                py_executable=created.context.py_executable,
                java_jars=created.context.java_jars,
            ),
            uris=created.uris,
        ).SerializeToString()
        jars = sum(len(jar) + 100 for jar in created.context.java_jars)
        weight = env_var_bytes(created.context.env_vars) + 100 * len(created.uris) + 1024 + jars
        if not created.env.derives_venv:  # a venv its create derived (from a project's lock,
            # or files a later create may find otherwise): its reply is built each time
            self._replies.put(created.env_id, reply, weight + sum(map(len, created.uris)))
        return reply

    async def delete(self, raw: bytes, context: Context) -> bytes:
        env_id = self._hot_deletes.get(raw)  # a request by id seen before: no parse
        request = None
        if env_id is None:
            request = _decode(agent_pb2.DeleteRuntimeEnvRequest, raw)
            if request is None:
                message = agent_pb2.DeleteRuntimeEnvRequest
                return await self._undecodable(_DELETE, message, raw, context)
            if not request.request_id and not request.serialized_runtime_env:
                env_id = request.runtime_env_id
        if env_id is not None:  # the hot path (no request id, by id), in one step
            try:
                remaining = self._delete_now(env_id, "")
            except AgentError:  # met again below, before anything is counted
                pass
            except Exception as exc:  # a bug: answered and logged as one
                return await answer(_DELETE, context, "", _raising(exc), self._metrics, bytes)
            else:
                if request is not None and len(raw) <= _HOT_REQUEST_BYTES:
                    self._hot_deletes.remember(raw, env_id, 2 * len(raw) + 200)
                if self._delete_ok is not None:
                    self._delete_ok.inc()
                if 0 <= remaining < _DELETE_REPLIES_KEPT:
                    return _DELETE_REPLIES[remaining]
                return _delete_reply(remaining)
        if request is None:
            request = agent_pb2.DeleteRuntimeEnvRequest.FromString(raw)

        async def call() -> bytes:
            remaining = await self._service.delete(
                request.runtime_env_id, request.serialized_runtime_env, request.request_id
            )
            return _delete_reply(remaining)

        return await answer(_DELETE, context, request.request_id, call, self._metrics, bytes)

    async def info(self, raw: bytes, context: Context) -> bytes:
        request = _decode(agent_pb2.GetRuntimeEnvsInfoRequest, raw)
        if request is None:
            return await self._undecodable(_INFO, agent_pb2.GetRuntimeEnvsInfoRequest, raw, context)
        limit = request.limit

        async def call() -> bytes:
            snapshot = await self._service.current_snapshot(limit)
            return info_reply(snapshot).SerializeToString()

        return await answer(_INFO, context, "", call, self._metrics, bytes)

    async def _undecodable(
        self, rpc: str, message: type[Message], raw: bytes, context: Context
    ) -> bytes:
        """A body that is not the request message: INVALID_ARGUMENT, counted and logged as
        any bad input."""
        name = message.DESCRIPTOR.full_name
        refusal = InvalidArgument(f"the request ({len(raw)} bytes) is not a {name} message")
        return await answer(rpc, context, "", _raising(refusal), self._metrics, bytes)


def add_services(
    server: grpc.aio.Server,
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]],
    health: health_pb2_grpc.HealthServicer,
) -> None:
    """Serve the agent's service (``handlers``), the health checks and reflection on
    ``server``. Only the hot path's methods (``HOT_METHODS``) are registered by method; the
    rest are found through generic handlers. grpc.aio's serving loop keeps one call requested
    per registered method and waits on all of them (``asyncio.wait``) each time a call comes
    in, so every method registered costs every call of every method (callgrind: about 2,500
    instructions per call each, of about 450,000); a method found through a generic handler
    costs only its own calls a lookup in Python (the agent's generic handler is the first)."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, {m: handlers[m] for m in HOT_METHODS})
    generic = cast(grpc.aio.Server, _GenericOnly(server))
    health_pb2_grpc.add_HealthServicer_to_server(health, generic)
    names = [SERVICE, "grpc.health.v1.Health", reflection.SERVICE_NAME]
    # the service's descriptor is in the default pool (rtenv.v1.agent_pb2): reflection lists it
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(  # type: ignore[no-untyped-call]
        reflection.aio.ReflectionServicer(names), generic
    )


class _GenericOnly:
    """A server as a generated ``add_*Servicer_to_server`` sees it, that keeps its service's
    generic handler and not its registration by method (see ``add_services``)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Nothing: the same handlers came as a generic handler just before."""


class _Handler(functools.partial[Awaitable[bytes]]):
    """A method handler's coroutine function, as grpc.aio recognises it at once. Before every
    call grpc.aio asks whether the handler is async: ``inspect.isawaitable(handler)``, then
    ``inspect.iscoroutinefunction(handler)``, eight Python calls for a bound method (callgrind:
    about 4,500 instructions of the ~450,000 a call costs at c64). This one is a partial of
    the method with ``__await__``, so the first question answers yes; calling it calls the
    method with no Python frame of its own. It is never awaited itself; a grpc that asked
    only the second question would still find the coroutine function inside the partial."""

    def __await__(self) -> Generator[Any, None, bytes]:
        raise TypeError("a gRPC method handler: call it, then await what it returns")


class _HotRequests(dict[bytes, V]):
    """Requests the hot path answered, by their bytes: a dict (``get`` is dict's own, one C
    call on every request), bounded in entries and in bytes by ``remember``, which forgets
    the oldest first (first in, first out: a request forgotten is parsed again once)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._weights: dict[bytes, int] = {}
        self.bytes = 0

    def remember(self, raw: bytes, value: V, weight: int) -> None:
        if self.pop(raw, None) is not None:  # remembered again: as a new entry, the newest
            self.bytes -= self._weights.pop(raw)
        if weight > self._max_bytes:  # heavier than the whole budget: not kept
            return
        self[raw] = value
        self._weights[raw] = weight
        self.bytes += weight
        while len(self) > self._max_entries or self.bytes > self._max_bytes:
            oldest = next(iter(self))
            del self[oldest]
            self.bytes -= self._weights.pop(oldest)


@dataclass(frozen=True, slots=True)
class _Hot:
    """A create request answered by the hot path: its checked key and its reply."""

    key: HitKey
    reply: bytes


def _decode(message: type[R], raw: bytes) -> R | None:
    try:
        return message.FromString(raw)
    except (DecodeError, ValueError):
        return None


def _raising(exc: Exception) -> Callable[[], Awaitable[bytes]]:
    """A call that raises ``exc`` (met before ``answer``), for ``answer`` to answer."""

    async def call() -> bytes:
        raise exc

    return call


def _delete_reply(remaining: int) -> bytes:
    if 0 <= remaining < _DELETE_REPLIES_KEPT:
        return _DELETE_REPLIES[remaining]
    return agent_pb2.DeleteRuntimeEnvReply(remaining_references=remaining).SerializeToString()


def info_reply(snapshot: Snapshot) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """A snapshot as the info reply, capped by size under a default client's 4 MiB: envs fill
    up to ``_INFO_ENV_BYTES``, URIs what is left of ``_INFO_BYTES``; ``total_envs`` and
    ``total_uris`` say how many there are, listed or not."""
    envs = _fill((_env_info(e) for e in snapshot.envs), _INFO_ENV_BYTES)
    used = sum(e.ByteSize() for e in envs)
    uris = _fill((_uri_info(u) for u in snapshot.uris), _INFO_BYTES - used)
    c, r = snapshot.cache, snapshot.recovery
    cache = agent_pb2.CacheStats(
        used_bytes=c.used_bytes,
        unused_bytes=c.unused_bytes,
        budget_bytes=c.budget_bytes,
        downloads=c.downloads,
        extractions=c.extractions,
        evictions=c.evictions,
        hits=c.hits,
    )
    recovery = agent_pb2.RecoverySummary(
        rows_kept=r.rows_kept,
        rows_dropped=r.rows_dropped,
        orphans_deleted=r.orphans_deleted,
        bytes_freed=r.bytes_freed,
        envs_forgotten=r.envs_forgotten,
        seconds=r.seconds,
    )
    return agent_pb2.GetRuntimeEnvsInfoReply(
        envs=envs,
        uris=uris,
        cache=cache,
        total_envs=snapshot.total_envs,
        total_uris=snapshot.total_uris,
        recovery=recovery,
        builds=[_build_info(b) for b in snapshot.builds],
    )


def _build_info(build: BuildView) -> agent_pb2.BuildInfo:
    return agent_pb2.BuildInfo(
        uri=build.uri,
        kind=build.kind,
        elapsed_seconds=build.elapsed_s,
        bytes_so_far=build.bytes_so_far,
        env_ids=build.env_ids,
        job_ids=build.job_ids,
        kept=build.kept,
        queued=build.queued,
    )


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
