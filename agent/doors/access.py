"""Access: with a token, every RPC but the health checks must carry it.

The token is read from a file at start (``--token-file``) and expected in the call's metadata as
``authorization: Bearer <token>``; it is compared in constant time. Health checks stay open, so
a supervisor can probe the agent without the secret.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from agent.core.errors import AgentError

_OPEN_PREFIX = "/grpc.health.v1.Health/"


class TokenError(AgentError):
    code = grpc.StatusCode.FAILED_PRECONDITION


def read_token(path: str) -> bytes:
    """The token in a file: its first line, stripped; refused if empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise TokenError(f"the token file {path} is empty")
    return token.encode()


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: bytes) -> None:
        self._expected = b"Bearer " + token

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
        if given is not None and hmac.compare_digest(given, self._expected):
            return handler
        refusal = MISSING if given is None else WRONG
        if handler.request_streaming or handler.response_streaming:  # reflection
            return grpc.stream_stream_rpc_method_handler(_refuse_stream(refusal))
        return grpc.unary_unary_rpc_method_handler(_refuse(refusal))


MISSING = (
    "this agent wants a token and the call carried none: send metadata "
    "'authorization: Bearer <token>' (the content of its --token-file)"
)
WRONG = (
    "the call's token is not this agent's: send metadata 'authorization: Bearer <token>' with "
    "the content of the agent's --token-file"
)


def _refuse(refusal: str) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]:
    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)

    return refuse


def _refuse_stream(
    refusal: str,
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
    async def refuse(
        requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
        yield  # an async generator, as a streaming handler must be

    return refuse
