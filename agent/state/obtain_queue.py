"""The index's obtain queue: the obtains asked for while a transaction of them is in flight
run together, in the next one.

A transaction of a root's index waits for the other agents' writers (``BEGIN IMMEDIATE``): one
wait for many, as when eight agents create the same envs at once on one root. Each obtain is
``index.obtain`` (R1, R3), in the order asked; a failed transaction fails each of its obtains,
and a cancelled caller's obtain runs all the same (what it set aside is handed to
``on_leftovers``). ``ObtainQueue`` is a part of ``StateDB`` (its base).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent.install.disk.staging import through
from agent.state import index
from agent.state.index import Obtained, RowKey
from agent.state.index_file import now_ms
from agent.state.reaping import Reaped

T = TypeVar("T")


@dataclass
class _Wanted:
    """One ``obtain`` queued: what it asks, and where its answer goes."""

    key: RowKey
    dir_name: str
    take_ref: bool
    done: asyncio.Future[Obtained]


class ObtainQueue:
    """``obtain``, queued: one transaction for the obtains asked for meanwhile."""

    if TYPE_CHECKING:  # what the StateDB it is a part of gives it
        root: Path
        on_leftovers: Callable[[list[Path]], None] | None

        @property
        def holder_id(self) -> str: ...

        @property
        def trash(self) -> Path: ...

        def _taken(self, key: RowKey) -> None: ...

        async def _transact(
            self,
            fn: Callable[[sqlite3.Connection, Reaped], T],
            leftovers: Callable[[T], list[Path]] = ...,
            *,
            refs: bool = True,
        ) -> T: ...

    def _init_obtain_queue(self) -> None:
        # obtains asked for while one transaction of them is in flight: the next one runs them all
        self._obtains: list[_Wanted] = []
        self._obtaining: asyncio.Task[None] | None = None

    async def obtain(self, key: RowKey, dir_name: str, *, take_ref: bool) -> Obtained:
        """R1, R3 (``index.obtain``): take this holder's reference and find the package ready,
        claimed for this holder, or installed by a live peer now."""

        if take_ref:  # dropped then taken again is taken: the reference is (re)inserted here
            self._taken(key)
        want = _Wanted(key, dir_name, take_ref, asyncio.get_running_loop().create_future())
        self._obtains.append(want)
        if self._obtaining is None:
            self._obtaining = asyncio.create_task(self._obtain_queued(), name="state-db obtain")
        try:
            return await through(want.done)
        except asyncio.CancelledError:  # it ran all the same: what it set aside is deleted
            done = want.done
            if not done.cancelled() and done.exception() is None and self.on_leftovers:
                self.on_leftovers(done.result().reaped.aside)
            raise

    def _obtain_all(
        self, batch: list[_Wanted], conn: sqlite3.Connection, reaped: Reaped
    ) -> list[Obtained]:
        """``index.obtain`` for each of ``batch``, in order, in the transaction open. On the
        thread."""
        return [
            index.obtain(
                conn,
                self.root,
                self.holder_id,
                w.key,
                w.dir_name,
                now_ms(),
                self.trash,
                reaped,
                take_ref=w.take_ref,
            )
            for w in batch
        ]

    async def _obtain_queued(self) -> None:
        """The obtains queued, all in one transaction (in the order asked), then those queued
        meanwhile, until none is left. A failed transaction fails each of its obtains."""
        batch: list[_Wanted] = []
        try:
            while self._obtains:
                batch, self._obtains = self._obtains, []

                run = functools.partial(self._obtain_all, batch)
                try:
                    results = await self._transact(
                        run, lambda got: got[0].reaped.aside if got else [], refs=False
                    )
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
