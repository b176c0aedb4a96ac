"""The Ray door: Ray 2.60's runtime env agent protocol over HTTP, on the same service as the
gRPC door (through ``RayFront``, which holds Ray's request semantics).

POST ``/get_or_create_runtime_env``, ``/delete_runtime_env_if_possible`` and
``/get_runtime_envs_info``, each with a protobuf body in Ray's message schema (``rtenv.ray.v1``,
wire-compatible with Ray's) and an ``application/octet-stream`` reply. Every request passes
through one funnel (``ray_errors.funnel``), which answers each failure through one table
(``ray_errors.REPLY``) and logs it: failures of the request itself are replies with status
FAILED (as Ray's agent answers them); only what is not a request gets an HTTP error: a body
that is not the message is a 400 with one line, a body over ``max_body_bytes`` a 413 (bounded
by what is read: aiohttp stops reading there).

The hot path is short: a create's OK reply is serialised once per env (kept by its context,
within a byte budget), a delete's OK reply once for all, the metrics' children are bound once,
and once the front is there a request reaches it without a call (a hit is then one synchronous
step of the front and the service: ``RayFront``).

With a token (Ray's token auth), as Ray's middleware: a request with neither ``Authorization``
nor ``X-Ray-Authorization`` is a 401, a wrong one a 403; the value is ``Bearer <token>``,
compared in constant time.

The door may be bound before the agent serves (Ray gives up on an agent whose port file has not
appeared within about 15 s, and recovery of a large cache takes longer): ``front`` is then a
future, and each request waits for it (at most ``ready_timeout_s``, by default READY_WAIT_S;
then a 503 saying so); ``waiting(app)`` is how many wait now. Once the front is there, a request
goes straight on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web
from google.protobuf.message import DecodeError, Message

from agent.app.token import Token
from agent.core.bounded import BoundedCache
from agent.core.errors import Unauthenticated
from agent.doors.metrics import OK, Metrics
from agent.doors.ray_errors import Door, Refusal, Refused, Route, funnel, reply_bytes
from agent.doors.ray_front import RayFront
from rtenv.ray.v1 import runtime_env_agent_pb2 as pb

M = TypeVar("M", bound=Message)
_HEADERS = ("Authorization", "X-Ray-Authorization")  # Ray's middleware reads them in this order
READY_WAIT_S = 30.0  # a request's wait for the agent to serve (Ray's client retries after it)
_CREATE = "ray:get_or_create_runtime_env"  # the rpc label of the metrics and the logs
_DELETE = "ray:delete_runtime_env_if_possible"
_INFO = "ray:get_runtime_envs_info"
_REPLIES_KEPT = 4096  # create replies kept by their context
_REPLIES_BYTES = 16 * 1024 * 1024
_DELETED = pb.DeleteRuntimeEnvIfPossibleReply(status=pb.AGENT_RPC_STATUS_OK).SerializeToString()


class _Readiness:
    """The front, or the future of it, and how many requests wait for it."""

    def __init__(self, front: RayFront | asyncio.Future[RayFront], timeout_s: float) -> None:
        self.front = front
        self.timeout_s = timeout_s
        self.waiting = 0

    async def ready(self) -> RayFront:
        front = self.front
        if isinstance(front, RayFront):
            return front
        if front.done() and not front.cancelled() and front.exception() is None:
            self.front = front.result()  # from now on, requests find it without a call
            return self.front
        self.waiting += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(front)
        except TimeoutError as exc:
            raise Refused(Refusal.STARTING, seconds=self.timeout_s) from exc
        except Exception as exc:  # the start failed: the agent is going away
            raise Refused(Refusal.START_FAILED) from exc
        finally:
            self.waiting -= 1

    def prefix(self) -> str:
        """The prefix of the front's failures (none before there is a front)."""
        front = self.front
        if isinstance(front, RayFront):
            return front.prefix
        if front.done() and not front.cancelled() and front.exception() is None:
            return front.result().prefix
        return ""


_READINESS = web.AppKey("readiness", _Readiness)


def waiting(app: web.Application) -> int:
    """Requests at the Ray door ``app`` waiting for the agent to serve."""
    return app[_READINESS].waiting


def ray_app(
    front: RayFront | asyncio.Future[RayFront],
    *,
    token: str | bytes | None,
    max_body_bytes: int = 4 * 1024 * 1024,
    ready_timeout_s: float | None = None,
    metrics: Metrics | None = None,
) -> web.Application:
    """The Ray door's application (see the module docstring); with ``metrics``, each create and
    delete is counted by its outcome (rpc ``ray:<path>``)."""
    secret = token.encode() if isinstance(token, str) else token
    readiness = _Readiness(front, READY_WAIT_S if ready_timeout_s is None else ready_timeout_s)
    routes = {
        "/get_or_create_runtime_env": Route(_CREATE, _failed_create, counted=True),
        "/delete_runtime_env_if_possible": Route(_DELETE, _failed_delete, counted=True),
        "/get_runtime_envs_info": Route(_INFO, None, counted=False),
    }
    guard = None if secret is None else _guard(Token(secret))
    door = Door(routes, guard, readiness.prefix, max_body_bytes, metrics)
    app = web.Application(middlewares=[funnel(door)], client_max_size=max_body_bytes)
    app[_READINESS] = readiness
    ready = readiness.ready

    create_ok = None if metrics is None else metrics.request_counter(_CREATE, OK)
    delete_ok = None if metrics is None else metrics.request_counter(_DELETE, OK)
    # A create's OK reply is the same for every create of an env: its bytes, by its context
    # (the front's string for the env, the same object every time), within a byte budget.
    created: BoundedCache[str, bytes] = BoundedCache(_REPLIES_KEPT, _REPLIES_BYTES)

    async def get_or_create(request: web.Request) -> web.Response:
        msg = await _read(request, pb.GetOrCreateRuntimeEnvRequest())
        config = msg.runtime_env_config if msg.HasField("runtime_env_config") else None
        front = readiness.front
        if not isinstance(front, RayFront):
            front = await ready()
        context = await front.get_or_create(
            msg.serialized_runtime_env,
            setup_timeout_seconds=config.setup_timeout_seconds if config is not None else 0,
            job_id=msg.job_id,
            source_process=msg.source_process,
            eager_install=config is not None and config.eager_install,
        )
        if create_ok is not None:
            create_ok.inc()
        body = created.get(context)
        if body is None:
            body = pb.GetOrCreateRuntimeEnvReply(
                status=pb.AGENT_RPC_STATUS_OK, serialized_runtime_env_context=context
            ).SerializeToString()
            created.put(context, body, 2 * len(body) + 200)
        return reply_bytes(body)

    async def delete(request: web.Request) -> web.Response:
        msg = await _read(request, pb.DeleteRuntimeEnvIfPossibleRequest())
        front = readiness.front
        if not isinstance(front, RayFront):
            front = await ready()
        await front.delete(msg.serialized_runtime_env, source_process=msg.source_process)
        if delete_ok is not None:
            delete_ok.inc()
        return reply_bytes(_DELETED)

    async def info(request: web.Request) -> web.Response:
        msg = await _read(request, pb.GetRuntimeEnvsInfoRequest())
        got = (await ready()).info(msg.limit if msg.HasField("limit") else None)
        out = pb.GetRuntimeEnvsInfoReply(total=got.total)
        for state in got.states:
            item = out.runtime_env_states.add(
                runtime_env=state.runtime_env,
                ref_cnt=state.ref_cnt,
                success=state.success,
                creation_time_ms=state.creation_time_ms,
            )
            if state.error is not None:
                item.error = state.error
        return reply_bytes(out.SerializeToString())

    for path, handler in zip(routes, (get_or_create, delete, info), strict=True):
        app.router.add_post(path, handler)
    return app


async def _read(request: web.Request, message: M) -> M:
    """The body as ``message``: at most the app's ``client_max_size`` bytes are read (413
    beyond); a body that is not the message is refused (a 400 with one line)."""
    body = await request.read()
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError) as exc:
        raise Refused(Refusal.NOT_A_MESSAGE, size=len(body), name=message.DESCRIPTOR.name) from exc
    return message


def _failed_create(error: str) -> bytes:
    failed = pb.GetOrCreateRuntimeEnvReply(status=pb.AGENT_RPC_STATUS_FAILED, error_message=error)
    return failed.SerializeToString()


def _failed_delete(error: str) -> bytes:
    failed = pb.DeleteRuntimeEnvIfPossibleReply(
        status=pb.AGENT_RPC_STATUS_FAILED, error_message=error
    )
    return failed.SerializeToString()


def _guard(token: Token) -> Callable[[web.Request], None]:
    """Ray's token check, as its middleware: refused without a token, or with a wrong one."""

    def check(request: web.Request) -> None:
        given = next((request.headers[h] for h in _HEADERS if request.headers.get(h)), None)
        if given is None:
            raise Refused(Refusal.NO_TOKEN)
        try:
            token.check(given.encode("utf-8", "surrogateescape"))
        except Unauthenticated as exc:
            raise Refused(Refusal.WRONG_TOKEN) from exc

    return check
