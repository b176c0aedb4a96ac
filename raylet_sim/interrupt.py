"""Ctrl-C for the command-line runs (the demo, the chaos runner): one line, a clean stop, 130.

A terminal sends SIGINT to the whole foreground process group: the run and its agent sidecar
(workers have sessions of their own). The handler runs the hooks (a node marks its agent as
stopping, so its exit is not reported as a death), then cancels the run once: its ``finally``
blocks stop the node and remove what it made. A second Ctrl-C during that is ignored; the stop
is bounded.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


class Interrupt:
    def __init__(self) -> None:
        self.fired = False
        self._hooks: list[Callable[[], None]] = []

    def on_interrupt(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` at once (in the signal handler, before the run is cancelled)."""
        self._hooks.append(hook)

    async def run(self, main: Coroutine[Any, Any, T]) -> T | None:
        """Run ``main``; on SIGINT cancel it once, wait for its cleanup, and return None."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main)

        def handle() -> None:
            if self.fired:
                return
            self.fired = True
            for hook in self._hooks:
                hook()
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, handle)
        try:
            return await task
        except asyncio.CancelledError:
            if not self.fired:
                raise
            return None
        finally:
            loop.remove_signal_handler(signal.SIGINT)
