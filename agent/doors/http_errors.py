"""The one place errors become HTTP responses, for the HTTP doors of the agent's own
(``/metrics``; the Ray door answers as Ray's protocol does, through ``ray_errors``):
``STATUS`` maps each error kind to its status code, as ``grpc_errors.STATUS`` does for gRPC,
and ``error_response`` answers with the capped message.
"""

from __future__ import annotations

from aiohttp import web

from agent.core.errors import AgentError, ErrorKind, cap_message

# Every kind has its status (a test checks the table is whole).
STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.REFUSED: 422,
    ErrorKind.CONFLICT: 409,
    ErrorKind.DENIED: 403,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.EXHAUSTED: 507,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.MISCONFIGURED: 500,  # met at start, not sent
}


def error_response(exc: AgentError) -> web.Response:
    """The response for an expected error: its kind's status and its message (capped) as text;
    a refusal for want of a token says how to send one (``WWW-Authenticate: Bearer``)."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.kind is ErrorKind.UNAUTHENTICATED else {}
    return web.Response(
        status=STATUS[exc.kind], text=cap_message(exc.message) + "\n", headers=headers
    )
