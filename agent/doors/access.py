"""Access over gRPC: with a token, every RPC but the health checks must carry it.

The check itself is the door-neutral ``Token.check`` (``agent/app/token.py``); this interceptor
finds the call's ``authorization`` metadata, lets ``Token.check`` judge it, and answers a refusal
with the status the error table gives its kind (UNAUTHENTICATED). Health checks stay open, so a
supervisor can probe the agent without the secret.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from agent.app.token import Token
from agent.core.errors import AgentError
from agent.doors.grpc_errors import status_of

_OPEN_PREFIX = "/grpc.health.v1.Health/"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: bytes) -> None:
        self._token = Token(token)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_OPEN_PREFIX):
            return handler
        given: bytes | None = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
        try:
            self._token.check(given)
        except AgentError as exc:
            code, refusal = status_of(exc.kind), exc.message
        else:
            return handler
        if handler.request_streaming or handler.response_streaming:  # reflection
            return grpc.stream_stream_rpc_method_handler(_refuse_stream(code, refusal))
        return grpc.unary_unary_rpc_method_handler(_refuse(code, refusal))


def _refuse(
    code: grpc.StatusCode, refusal: str
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]:
    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, refusal)

    return refuse


def _refuse_stream(
    code: grpc.StatusCode, refusal: str
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
    async def refuse(
        requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await context.abort(code, refusal)
        yield  # an async generator, as a streaming handler must be

    return refuse
