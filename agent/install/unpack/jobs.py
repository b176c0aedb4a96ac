"""One extraction in the unpack pool, as the pool tracks it: its ``Task``s (a whole archive, or
one share of it, or its finish, each sent to one worker) and the ``Gate`` of its disk
reservation, which every share waits at once its plan passed: made once, from the first share's
plan (every share's plan is the same), then each share told ``go``, or ``halt`` if it failed or
the job is stopping. The pool (``pool``) queues the tasks and answers the workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Reserve = Callable[[int], Awaitable[None]]  # room on the disk for this many bytes


@dataclass(eq=False)
class Task:
    message: tuple[Any, ...]
    future: asyncio.Future[int]
    affinity: int | None = None  # the worker to prefer (it holds the job's plan)
    streaming: bool = False  # it reads an archive still being downloaded (mostly waits)
    worker: int | None = None  # the worker it was sent to
    gate: Gate | None = None
    waiting: bool = False  # its worker planned and waits for go or halt


Reply = Callable[[Task, tuple[str]], None]  # answer a worker waiting after its plan (once)


class Gate:
    """One job's reservation: made once, from the first share's plan (every share's plan is
    the same); each share writes only after it (``go``), or ends (``halt``) if it failed.
    ``reply`` answers a share's worker; ``closed`` says the pool is closing (no share goes on)."""

    def __init__(self, reserve: Reserve, reply: Reply, closed: Callable[[], bool]) -> None:
        self.reserve = reserve
        self._reply = reply
        self._closed = closed
        self.step: asyncio.Future[None] | None = None
        self.failed: BaseException | None = None  # the reservation's error: the job's
        self.halted = False  # the job stops: no share goes on
        self.waiting: list[Task] = []

    def planned(self, task: Task, declared: int) -> None:
        """A share's plan passed: it writes once the job's reservation is made (the first
        share's plan starts it), or ends if that failed or the job is stopping."""
        if self.halted or self.failed is not None or self._closed():
            self._reply(task, ("halt",))
        elif self.step is not None and self.step.done():
            # done, but its callback (``_reserved``) may not have run yet: its outcome is read
            # here, never taken for a success (a refused reservation must stop every share)
            self._reply(task, ("go",) if self._may_go(self.step) else ("halt",))
        else:
            self.waiting.append(task)
            if self.step is None:
                self.step = asyncio.ensure_future(self.reserve(declared))
                self.step.add_done_callback(self._reserved)

    def _may_go(self, step: asyncio.Future[None]) -> bool:
        """Whether the job's shares may write, its reservation ``step`` being done (its error,
        if any, kept as the job's)."""
        if not step.cancelled() and step.exception() is not None and self.failed is None:
            self.failed = step.exception()
        return not (step.cancelled() or self.halted or self.failed is not None or self._closed())

    def _reserved(self, step: asyncio.Future[None]) -> None:
        go = self._may_go(step)
        waiting, self.waiting = self.waiting, []
        for task in waiting:
            self._reply(task, ("go",) if go else ("halt",))
