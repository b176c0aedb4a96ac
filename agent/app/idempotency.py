"""Idempotent retries: a request id is answered again, not counted again.

A client that did not hear an answer (a dropped connection, a deadline) retries with the same
``request_id``. If the first attempt is still running, the retry waits for it and gets its answer;
if it succeeded, the retry gets the remembered answer. Failed or cancelled attempts are forgotten
(they changed nothing), so a retry after one runs afresh. The same id with a different request is
refused. Memory is bounded: an id is at most ``MAX_REQUEST_ID_BYTES`` (longer ones are refused,
not remembered), at most ``capacity`` answered ids are kept (the oldest forgotten first), and the
answers kept are small values (the caller rebuilds large replies from them), each kept without
its future once answered.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agent.core.errors import InvalidArgument, RequestIdReused, echo

T = TypeVar("T")
MAX_REQUEST_ID_BYTES = 128
_MAX_JOINS = 8  # a retry joins at most this many cancelled attempts before running itself


@dataclass(slots=True)
class _Attempt:
    fingerprint: str
    # while it runs: its future (retries wait on it); once answered: None, and ``result`` kept
    future: asyncio.Future[Any] | None
    result: Any = None


class RequestLog:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._attempts: OrderedDict[tuple[str, str], _Attempt] = OrderedDict()

    def __len__(self) -> int:
        return len(self._attempts)

    async def run(
        self, rpc: str, request_id: str, fingerprint: str, op: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``op`` once per (rpc, request_id); ``fingerprint`` identifies the request."""
        if not request_id:
            return await op()
        check_request_id(request_id)
        fingerprint = _bounded(fingerprint)
        key = (rpc, request_id)
        for _ in range(_MAX_JOINS):
            attempt = self._attempts.get(key)
            if attempt is None:
                break
            if attempt.fingerprint != fingerprint:
                raise RequestIdReused(
                    f"request_id {echo(request_id)} was already used for a different {rpc} "
                    "request; use a fresh id for a new request and the same id only to retry"
                )
            future = attempt.future
            if future is None:
                return cast(T, attempt.result)
            try:
                return cast(T, await asyncio.shield(future))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not future.cancelled() or (task is not None and task.cancelling()):
                    raise  # this retry itself was cancelled
                # the attempt it joined was cancelled: look again, and run it if nobody does
        return await self._first(key, fingerprint, op)

    async def _first(
        self, key: tuple[str, str], fingerprint: str, op: Callable[[], Awaitable[T]]
    ) -> T:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        attempt = _Attempt(fingerprint, future)
        self._attempts[key] = attempt
        try:
            result = await op()
        except BaseException as exc:
            if self._attempts.get(key) is attempt:
                del self._attempts[key]
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: nobody may be waiting
            raise
        future.set_result(result)
        attempt.future, attempt.result = None, result  # retries waiting have the future
        self._attempts.move_to_end(key)
        self._forget_oldest()
        return result

    def _forget_oldest(self) -> None:
        """Forget answered attempts, oldest first, down to the capacity. An attempt still in
        flight is never forgotten: a retry of it must wait for it, not run it again."""
        excess = len(self._attempts) - self._capacity
        if excess <= 0:
            return
        done: list[tuple[str, str]] = []
        for key, attempt in self._attempts.items():  # the in-flight ones aside, the oldest
            if attempt.future is None:
                done.append(key)
                if len(done) == excess:
                    break
        for key in done:
            del self._attempts[key]


def _bounded(fingerprint: str) -> str:
    """What is remembered of a fingerprint: itself if short, else its digest."""
    if len(fingerprint) <= 64:
        return fingerprint
    return hashlib.sha256(fingerprint.encode("utf-8", "surrogatepass")).hexdigest()


def check_request_id(request_id: str) -> None:
    """Refuse an id longer than ``MAX_REQUEST_ID_BYTES``: ids are remembered, so their size
    is bounded like their number."""
    size = len(request_id.encode("utf-8", "surrogatepass"))
    if size > MAX_REQUEST_ID_BYTES:
        raise InvalidArgument(
            f"request_id is {size} bytes; the limit is {MAX_REQUEST_ID_BYTES} "
            "(a UUID or a counter fits)"
        )
