"""Waiting on a peer's install: while this agent's obtains wait for packages other agents of the
root are installing, one read of the index every ``PEER_TICK_S`` for all of them wakes each
waiter whose peer's install ended (ready: used at once; gone: obtained again). A waiter's own
poll (doubling, capped) remains, for finding a dead peer's claim (an obtain reaps it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agent.core.errors import AgentError
from agent.state.index import RowKey
from agent.state.state_db import StateDB, UriRow

log = logging.getLogger(__name__)

PEER_TICK_S = 0.01


class PeerWatch:
    """The peers' installs this agent waits on. Invariant: a reader task runs while, and only
    while, some waiter is registered (``_waiting``); one waiter per key (the store's obtains are
    single-flight)."""

    def __init__(self, db: StateDB, sleep: Callable[[float], Awaitable[None]]) -> None:
        self._db = db
        self._sleep = sleep
        # packages a peer installs, this agent's obtain waiting on each: woken (the future
        # done) by the reader when the index no longer shows the install in flight
        self._waiting: dict[RowKey, asyncio.Future[UriRow | None]] = {}
        self._reader: asyncio.Task[None] | None = None  # while there are any

    async def wait(self, row_key: RowKey, delay: float) -> UriRow | None:
        """Sleep ``delay``, or less: until the reader sees that the peer's install of the
        package ended. Its row if it was read ready, else None (obtain again: ready, or claim
        it)."""
        ended: asyncio.Future[UriRow | None] = asyncio.get_running_loop().create_future()
        self._waiting[row_key] = ended
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="peer installs")
        sleep: asyncio.Future[None] = asyncio.ensure_future(self._sleep(delay))
        try:
            either: list[asyncio.Future[Any]] = [sleep, ended]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleep.cancel()
            if self._waiting.get(row_key) is ended:
                del self._waiting[row_key]
        return ended.result() if ended.done() else None

    async def _read(self) -> None:
        """Every ``PEER_TICK_S``, one read of the index for every install waited on; a failed
        read wakes nobody (their own polls go on)."""
        try:
            while self._waiting:
                await asyncio.sleep(PEER_TICK_S)
                waited = [key for key, ended in self._waiting.items() if not ended.done()]
                if not waited:
                    continue
                try:
                    rows = await self._db.installs_ended(waited)
                except (AgentError, OSError) as exc:
                    log.debug(
                        "reading the peers' installs failed: %s", exc, extra={"error": str(exc)}
                    )
                    continue
                for key, row in rows.items():
                    ended = self._waiting.get(key)
                    if ended is not None and not ended.done():
                        ended.set_result(row)
        finally:
            self._reader = None

    def task(self) -> asyncio.Task[None] | None:
        """The reader, while it runs (the store's close cancels it)."""
        return self._reader
