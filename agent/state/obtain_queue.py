"""The index's obtain queue: the obtains asked for while a transaction of them is in flight
run together, in the next one.

A transaction of a root's index waits for the other agents' writers (``BEGIN IMMEDIATE``): one
wait for many, as when eight agents create the same envs at once on one root. Each obtain is
``index.obtain`` (R1, R3), in the order asked (``StateDB`` runs them, in one transaction, given
the ones queued); a failed transaction fails each of its obtains, and a cancelled caller's
obtain runs all the same (what it set aside is handed to ``leftovers``). ``ObtainQueue`` is a
part of ``StateDB``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agent.install.disk.staging import through
from agent.state.index import Obtained, RowKey
from agent.state.reaping import Reaped


@dataclass
class Wanted:
    """One ``obtain`` queued: what it asks, and where its answer goes."""

    key: RowKey
    dir_name: str
    take_ref: bool
    done: asyncio.Future[Obtained]


class ObtainQueue:
    """``obtain``, queued: one transaction for the obtains asked for meanwhile. ``run_all``:
    the obtains queued, in one transaction, answered in order; ``taken``: told of each
    reference taken again, before it is queued; ``leftovers``: what a cancelled caller's obtain
    set aside."""

    def __init__(
        self,
        run_all: Callable[[list[Wanted]], Awaitable[list[Obtained]]],
        *,
        taken: Callable[[RowKey], None],
        leftovers: Callable[[list[Path]], None],
    ) -> None:
        self._run_all = run_all
        self._taken = taken
        self._leftovers = leftovers
        # obtains asked for while one transaction of them is in flight: the next one runs them all
        self._obtains: list[Wanted] = []
        self._obtaining: asyncio.Task[None] | None = None

    async def obtain(self, key: RowKey, dir_name: str, *, take_ref: bool) -> Obtained:
        """R1, R3 (``index.obtain``): take this holder's reference and find the package ready,
        claimed for this holder, or installed by a live peer now."""

        if take_ref:  # dropped then taken again is taken: the reference is (re)inserted here
            self._taken(key)
        want = Wanted(key, dir_name, take_ref, asyncio.get_running_loop().create_future())
        self._obtains.append(want)
        if self._obtaining is None:
            self._obtaining = asyncio.create_task(self._obtain_queued(), name="state-db obtain")
        try:
            return await through(want.done)
        except asyncio.CancelledError:  # it ran all the same: what it set aside is deleted
            done = want.done
            if not done.cancelled() and done.exception() is None:
                self._leftovers(done.result().reaped.aside)
            raise

    async def _obtain_queued(self) -> None:
        """The obtains queued, all in one transaction (in the order asked), then those queued
        meanwhile, until none is left. A failed transaction fails each of its obtains."""
        batch: list[Wanted] = []
        try:
            while self._obtains:
                batch, self._obtains = self._obtains, []
                try:
                    results = await self._run_all(batch)
                except Exception as exc:
                    for w in batch:
                        if not w.done.done():
                            w.done.set_exception(exc)
                    continue
                for i, (w, got) in enumerate(zip(batch, results, strict=True)):
                    if i:  # what the transaction reaped is told once, with the first
                        got.reaped = Reaped()
                    if not w.done.done():
                        w.done.set_result(got)
        finally:
            self._obtaining = None
            for w in [*batch, *self._obtains]:  # cancelled (a close): nobody is left waiting
                if not w.done.done():
                    w.done.cancel()
            self._obtains = []
