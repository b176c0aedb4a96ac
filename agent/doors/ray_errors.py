"""The one place the Ray door's failures become what a Ray client sees: ``REPLY`` (the one table)
maps every error kind, and each of the door's own refusals (``Refusal``), to its ``RayAnswer``:
an HTTP status and its words; ``answer`` (the funnel every request of the door passes through)
runs a request, answers its failure through the table, counts it and logs it.

As Ray's own agent answers them, a request's failures are replies: HTTP 200 and Ray's reply
message with status FAILED, whose ``error_message`` is the error's message prefixed with which
agent and node answered (``RayFront.prefix``). Only what is not a request gets an HTTP error
with one line of text: a body that is not the message (400), a body over the limit (413), no
token or a wrong one (401, 403: Ray's token auth), an agent not serving yet (503). A bug
(anything else) is logged with its traceback and answered FAILED saying so; a cancellation
passes through (the client went away), unless it is stray (``stray_cancellation``): a bug.

While a request runs, its rpc (``ray:<path>``) is bound to every log line it writes
(``agent.core.logfields``); the front notes the job id and the source process, the service the
env id once it knows it. An expected failure is logged once, here, with ``code`` (FAILED, or
the HTTP status) and ``kind`` (the ``ErrorKind`` value, or the refusal's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent.core import logfields
from agent.core.errors import AgentError, ErrorKind, cap_message, stray_cancellation
from agent.doors.metrics import BUG, Metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refusal(Enum):
    """The door's own refusals of what is not a request it can pass on. The value is the name
    logs use (their ``kind``)."""

    NOT_A_MESSAGE = "not_a_message"  # the body is not the request's protobuf message
    TOO_LARGE = "too_large"  # the body is over the door's limit (aiohttp stops reading there)
    NO_TOKEN = "no_token"  # neither Authorization nor X-Ray-Authorization
    WRONG_TOKEN = "wrong_token"  # not "Bearer <this agent's token>"
    STARTING = "starting"  # the agent did not serve within the door's wait
    START_FAILED = "start_failed"  # the agent's start failed: it is going away


@dataclass(frozen=True, slots=True)
class RayAnswer:
    """What a Ray client gets: HTTP ``status`` and ``words`` (a template of the failure's
    fields); with ``failed``, the words are the ``error_message`` of Ray's reply with status
    FAILED (HTTP 200), else the response's text."""

    status: int
    words: str
    failed: bool = False

    def text(self, **fields: object) -> str:
        """The words with the failure's fields, capped (``cap_message``)."""
        return cap_message(self.words.format(**fields))


_FAILED = RayAnswer(200, "{prefix}{message}", failed=True)
BUG_ANSWER = RayAnswer(200, "{prefix}internal error in the agent (see its log)", failed=True)

# Every kind and every refusal has its answer (a test checks the table is whole). The statuses
# and words are what Ray clients have always seen: a change here changes the wire.
REPLY: dict[ErrorKind | Refusal, RayAnswer] = {
    ErrorKind.INVALID: _FAILED,
    ErrorKind.NOT_FOUND: _FAILED,
    ErrorKind.REFUSED: _FAILED,
    ErrorKind.CONFLICT: _FAILED,
    ErrorKind.DENIED: _FAILED,
    ErrorKind.UNAUTHENTICATED: _FAILED,
    ErrorKind.UNAVAILABLE: _FAILED,
    ErrorKind.EXHAUSTED: _FAILED,
    ErrorKind.TIMEOUT: _FAILED,
    ErrorKind.MISCONFIGURED: _FAILED,  # met at start, not sent
    Refusal.NOT_A_MESSAGE: RayAnswer(
        400, "the body ({size} bytes) is not a {name} protobuf message\n"
    ),
    Refusal.TOO_LARGE: RayAnswer(413, "Maximum request body size {limit} exceeded."),  # aiohttp's
    Refusal.NO_TOKEN: RayAnswer(
        401, "Unauthorized: this agent wants Ray's token: send 'Authorization: Bearer <token>'\n"
    ),
    Refusal.WRONG_TOKEN: RayAnswer(403, "Forbidden: the token is not this agent's\n"),
    Refusal.STARTING: RayAnswer(
        503, "the agent is still starting after {seconds:g}s; retry later\n"
    ),
    Refusal.START_FAILED: RayAnswer(503, "the agent failed to start\n"),
}


class Refused(Exception):
    """The door's own refusal, raised where it is met and answered by ``answer`` through
    ``REPLY[refusal]`` with ``fields`` in its words."""

    def __init__(self, refusal: Refusal, **fields: object) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal
        self.fields = fields


@dataclass(frozen=True, slots=True)
class Route:
    """A path of the door as ``funnel`` answers it: its ``rpc`` (``ray:<path>``, the log
    field and the metrics' label), ``failed`` (Ray's reply with status FAILED and the given
    ``error_message``, serialised; None: the reply has no status, a failure propagates and
    aiohttp answers 500) and whether its failures are ``counted`` in the metrics."""

    rpc: str
    failed: Callable[[str], bytes] | None
    counted: bool


@dataclass(frozen=True, slots=True)
class Door:
    """What ``funnel`` needs of the door: its ``routes`` by path, ``guard`` (the token check:
    raises ``Refused``; None without a token), ``prefix`` (the front's, once there is one), the
    body limit (the 413's words) and ``metrics``."""

    routes: Mapping[str, Route]
    guard: Callable[[web.Request], None] | None
    prefix: Callable[[], str]
    body_limit: int
    metrics: Metrics | None


def funnel(door: Door) -> Middleware:
    """The middleware every request of the door passes through (``answer``)."""

    @web.middleware
    async def ray_door(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = door.routes.get(request.path)
        if route is None:  # not a path of the door: aiohttp's 404 or 405, behind the token
            route = Route("ray:" + logfields.cut(request.path.lstrip("/")), None, False)
        return await answer(door, route, request, handler)

    return ray_door


async def answer(
    door: Door, route: Route, request: web.Request, serve: Handler
) -> web.StreamResponse:
    """Run one request of the Ray door (``serve``); answer its failure through ``REPLY``,
    count it and log it. The one place the door's failures become answers."""
    rpc, failed = route.rpc, route.failed
    with logfields.bind(rpc=rpc):
        try:
            if door.guard is not None:
                door.guard(request)
            return await serve(request)
        except Refused as exc:
            key: ErrorKind | Refusal = exc.refusal
            fields = exc.fields
        except web.HTTPRequestEntityTooLarge:  # aiohttp's, reading the body
            key, fields = Refusal.TOO_LARGE, {"limit": door.body_limit}
        except AgentError as exc:
            if failed is None:
                raise
            key, fields = exc.kind, {"prefix": door.prefix(), "message": exc.message}
            if route.counted and door.metrics is not None:
                door.metrics.count_request(rpc, exc.kind)
        except web.HTTPException:  # aiohttp's own answer (a path or method not the door's)
            raise
        except asyncio.CancelledError as exc:
            if not stray_cancellation() or failed is None:  # the client went away
                raise
            log.error(
                "%s failed with a bug: a cancellation nobody asked for",
                rpc,
                exc_info=exc,
                extra={"code": "FAILED"},
            )
            return _bug(door, route, failed)
        except Exception:
            if failed is None:
                raise
            log.exception("%s failed with a bug", rpc, extra={"code": "FAILED"})
            return _bug(door, route, failed)
        reply = REPLY[key]
        text = reply.text(**fields)
        code = "FAILED" if reply.failed else str(reply.status)
        bound = logfields.bound()
        log.warning(
            "%s failed (env_id=%s job_id=%s): %s: %s",
            rpc,
            bound.get("env_id") or "-",
            bound.get("job_id") or "-",
            code,
            text.rstrip("\n"),
            extra={"code": code, "kind": key.value},
        )
    if reply.failed:
        assert failed is not None, "a FAILED answer for an rpc with no status"
        return reply_bytes(failed(text))
    return web.Response(status=reply.status, text=text)


def reply_bytes(body: bytes) -> web.Response:
    """A protobuf reply of the Ray protocol."""
    return web.Response(body=body, content_type="application/octet-stream")


def _bug(door: Door, route: Route, failed: Callable[[str], bytes]) -> web.Response:
    if route.counted and door.metrics is not None:
        door.metrics.count_request(route.rpc, BUG)
    return reply_bytes(failed(BUG_ANSWER.text(prefix=door.prefix())))
