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

A closed stdout (``raylet-sim demo | head``) ends the run as SIGPIPE ends a program that leaves it
be: ``QuietOnClose`` stops the run the same way, with no line, and exit 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import FrameType
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupt:
    def __init__(self, signals: Sequence[signal.Signals] = (signal.SIGINT,)) -> None:
        """``signals``: those that stop the run (default Ctrl-C alone; ``STOP_SIGNALS``: Ctrl-C,
        SIGTERM and SIGHUP)."""
        self.signals = tuple(signals)
        self.signal: signal.Signals | None = None  # the one that stopped the run
        self._hooks: list[Callable[[], None]] = []
        self._task: asyncio.Future[Any] | None = None  # the run, while ``run`` runs it
        # what the stopped run says of what it leaves, after its stop line's "the node stopped"
        self.aftermath = ""

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

    def stop(self, sig: signal.Signals) -> None:
        """Stop the run as ``sig`` does: run the hooks, then cancel the run, once (a later stop
        is ignored). Outside ``run`` the signal is only recorded."""
        if self.fired:
            return
        self.signal = sig
        if self._task is None:
            return
        for hook in self._hooks:
            hook()
        self._task.cancel()

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
        self._task = task
        before = {sig: signal.getsignal(sig) for sig in self.signals}
        for sig in self.signals:
            loop.add_signal_handler(sig, self.stop, sig)
        try:
            return await task
        except asyncio.CancelledError:
            if not self.fired:
                raise
            return None
        finally:
            self._task = None
            for sig, handler in before.items():
                loop.remove_signal_handler(sig)  # leaves SIG_DFL (SIGINT: Python's own)
                if handler is not None:
                    signal.signal(sig, handler)


class QuietOnClose:
    """``stream`` (stdout) for a run: once its reader has gone (EPIPE), the run stops as SIGPIPE
    would stop it (``interrupt.stop``), and the stream's file becomes /dev/null, so that neither a
    later line nor the interpreter's last flush fails on it again."""

    def __init__(self, stream: TextIO, interrupt: Interrupt) -> None:
        self._stream = stream
        self._interrupt = interrupt

    def write(self, text: str, /) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        self._interrupt.stop(signal.SIGPIPE)
