"""Which event loop runs the agent: uvloop when it is installed (the extra ``fast``), else
asyncio's own; ``RTENV_EVENT_LOOP`` chooses one by name.

The variable is read by every door that runs the agent (``serve``, ``ray-agent``, and so the
Ray launcher's raylets and the simulated scheduler's sidecar, which inherit it):

- ``auto`` (or unset, or empty): uvloop if it can be imported, else asyncio;
- ``asyncio``: asyncio's loop even where uvloop is installed (an operator's way around a uvloop
  problem, and the tests' way to run both loops from one environment);
- ``uvloop``: uvloop, and a refusal, not a silent fallback, where it is not installed.

A value not in that list is refused by name. Pure but for the one import it tries.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Mapping
from enum import Enum

from agent.core.errors import echo

ENV = "RTENV_EVENT_LOOP"
_ECHO_CHARS = 40  # of a mistaken value, echoed back


class LoopChoice(Enum):
    """What ``RTENV_EVENT_LOOP`` may say."""

    AUTO = "auto"
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class LoopUnavailable(ValueError):
    """``RTENV_EVENT_LOOP`` names no loop, or one that is not installed: a usage mistake."""


LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def choice(environ: Mapping[str, str] = os.environ) -> LoopChoice:
    """The choice ``environ`` makes; ``LoopUnavailable`` for a value not in ``LoopChoice``."""
    value = environ.get(ENV, "").strip().lower()
    if not value:
        return LoopChoice.AUTO
    try:
        return LoopChoice(value)
    except ValueError:
        names = ", ".join(c.value for c in LoopChoice)
        raise LoopUnavailable(
            f"{ENV}={echo(environ[ENV], _ECHO_CHARS)} names no event loop (one of: {names})"
        ) from None


def loop_factory(environ: Mapping[str, str] = os.environ) -> LoopFactory | None:
    """The factory of the loop ``environ`` chooses, for ``asyncio.Runner(loop_factory=...)``:
    None for asyncio's own (the Runner then makes it exactly as ``asyncio.run`` does)."""
    chosen = choice(environ)
    if chosen is LoopChoice.ASYNCIO:
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if chosen is LoopChoice.UVLOOP:
            raise LoopUnavailable(
                f"{ENV}=uvloop, but uvloop is not installed in this Python "
                "(pip install 'runtime-env-agent[fast]', or unset it)"
            ) from exc
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory
