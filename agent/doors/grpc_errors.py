"""The one place errors become gRPC statuses: ``answer`` runs an RPC, maps its error's kind to
a status code through ``STATUS`` (the one table from kinds to codes), counts it and logs it.

While it runs, the RPC's name and request id are bound to every log line the request writes
(``agent.core.logfields``); the service adds the env id once it knows it, so the failure line
written here carries it too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from agent.core import logfields
from agent.core.errors import AgentError, ErrorKind, cap_message, stray_cancellation
from agent.doors.metrics import BUG, CANCELLED, OK, Metrics, Outcome

log = logging.getLogger(__name__)

T = TypeVar("T")

# Every kind has its code (a test checks the table is whole). The codes are what clients have
# always seen: a change here changes the wire.
STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.REFUSED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.MISCONFIGURED: grpc.StatusCode.FAILED_PRECONDITION,  # met at start, not sent
}


def status_of(kind: ErrorKind) -> grpc.StatusCode:
    """The gRPC status code a client sees for an error of this kind."""
    return STATUS[kind]


async def answer(
    rpc: str,
    context: grpc.aio.ServicerContext[object, object],
    request_id: str,
    call: Callable[[], Awaitable[T]],
    metrics: Metrics | None,
    failed: Callable[[], T],
) -> T:
    """Run one RPC; map its error to a status, count it and log it. The one place errors become
    statuses.

    Expected errors (``AgentError``) are answered with their kind's code and their message, and
    logged as one line with the env id and request id; anything else is a bug: logged with its
    traceback and answered INTERNAL. Cancellation passes through untouched (the client has
    gone), unless it is stray (``stray_cancellation``): a bug, answered INTERNAL.

    Every message is capped (``cap_message``) before it is sent or logged, and the ids logged
    are cut with their length said: whatever a client sent, the trailer and the log line stay
    short.
    """
    logged_id = logfields.cut(request_id)
    with logfields.bind(rpc=rpc, request_id=logged_id):
        outcome: Outcome = OK
        try:
            return await call()
        except AgentError as exc:
            outcome, code = exc.kind, status_of(exc.kind)
            message = cap_message(exc.message)
            env_id = str(logfields.bound().get("env_id", ""))[: logfields.CUT_CHARS]  # a client's?
            log.warning(
                "%s failed (env_id=%s request_id=%r): %s: %s",
                rpc,
                env_id or "-",
                logged_id,
                code.name,
                message,
                extra={"code": code.name, "kind": exc.kind.value},
            )
        except asyncio.CancelledError as exc:
            if not stray_cancellation():  # the client went away (or the server stops)
                outcome = CANCELLED
                raise
            outcome, code = BUG, grpc.StatusCode.INTERNAL  # answered, not left hanging
            log.error(
                "%s failed with a bug: a cancellation nobody asked for (request_id=%r)",
                rpc,
                logged_id,
                exc_info=exc,
                extra={"code": grpc.StatusCode.INTERNAL.name, "kind": BUG},
            )
            message = f"internal error in {rpc}: an operation was cancelled unexpectedly"
        except Exception as exc:
            outcome, code = BUG, grpc.StatusCode.INTERNAL
            log.exception(
                "%s failed with a bug (request_id=%r)",
                rpc,
                logged_id,
                extra={"code": grpc.StatusCode.INTERNAL.name, "kind": BUG},
            )
            message = cap_message(f"internal error in {rpc}: {type(exc).__name__}: {exc}")
        finally:
            if metrics is not None:
                metrics.count_request(rpc, outcome)
    # The status is set, not raised with context.abort: grpc keeps the abort's exception, whose
    # traceback holds this frame and so the request, in a cycle only the garbage collector
    # frees (120 refused 3 MiB requests in a row held 280 MiB until it ran). The client sees
    # the status; the empty reply is not delivered as an answer.
    context.set_code(code)
    context.set_details(message)
    return failed()
