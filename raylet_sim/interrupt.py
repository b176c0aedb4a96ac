"""Stop signals for the command-line runs (the demo, the chaos runner): one line, a clean stop,
and the exit code a shell gives a process the signal ended, 128 + its number (130 for Ctrl-C).

A terminal sends SIGINT (Ctrl-C) to its whole foreground process group, and SIGHUP as it closes;
``kill`` and ``timeout`` send SIGTERM, to the run alone or to its group. The run and its agent
sidecar share that group (workers have sessions of their own). The handler runs the hooks (a
node marks its agent as stopping, so its exit is not reported as a death), then cancels the run
once: its ``finally`` blocks stop the node and remove what it made. Another stop signal during
that is ignored; the stop is bounded. Outside the event loop (before the run begins, or as asyncio
shuts down after it) ``raising`` turns each of the signals into a KeyboardInterrupt, as Python
does SIGINT, so that a caller handles them all in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupt:
    def __init__(self, signals: Sequence[signal.Signals] = (signal.SIGINT,)) -> None:
        """``signals``: those that stop the run (default Ctrl-C alone; ``STOP_SIGNALS``: Ctrl-C,
        SIGTERM and SIGHUP)."""
        self.signals = tuple(signals)
        self.signal: signal.Signals | None = None  # the one that stopped the run
        self._hooks: list[Callable[[], None]] = []

    @property
    def fired(self) -> bool:
        return self.signal is not None

    @property
    def exit_code(self) -> int:
        """128 + the signal's number (a KeyboardInterrupt nobody recorded is Ctrl-C's: 130)."""
        return 128 + (self.signal or signal.SIGINT)

    @property
    def said(self) -> str:
        """How the stop is told: "interrupted", or "interrupted by SIGTERM" (SIGHUP)."""
        if self.signal in (None, signal.SIGINT):
            return "interrupted"
        assert self.signal is not None
        return f"interrupted by {self.signal.name}"

    def on_interrupt(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` at once (in the signal handler, before the run is cancelled)."""
        self._hooks.append(hook)

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Within: each of the signals, outside ``run``, records itself and raises
        KeyboardInterrupt; the handlers before are restored after."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.signal is None:
                self.signal = signal.Signals(signum)
            raise KeyboardInterrupt

        before = {sig: signal.signal(sig, handle) for sig in self.signals}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    async def run(self, main: Coroutine[Any, Any, T]) -> T | None:
        """Run ``main``; on one of the signals cancel it once, wait for its cleanup, and return
        None."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main)

        def handle(sig: signal.Signals) -> None:
            if self.fired:
                return
            self.signal = sig
            for hook in self._hooks:
                hook()
            task.cancel()

        before = {sig: signal.getsignal(sig) for sig in self.signals}
        for sig in self.signals:
            loop.add_signal_handler(sig, handle, sig)
        try:
            return await task
        except asyncio.CancelledError:
            if not self.fired:
                raise
            return None
        finally:
            for sig, handler in before.items():
                loop.remove_signal_handler(sig)  # leaves SIG_DFL (SIGINT: Python's own)
                if handler is not None:
                    signal.signal(sig, handler)
