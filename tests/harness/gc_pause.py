"""A pytest plugin: no garbage collection during an AST parse (``ast.parse``) in the test process.

Before CPython 3.11.8 (gh-106905) the AST constructor keeps its recursion depth in the
interpreter's shared state, so a parse that runs inside another parse ends the outer one with
``SystemError: AST constructor recursion depth mismatch``. One does whenever a parse's
allocations start a collection that frees an asyncio task or future whose exception was never
retrieved (a failing test leaves one when it stops before awaiting its tasks): its finalizer
logs the exception with its traceback, and 3.11's traceback module parses each of its lines to
place the carets. pytest parses the test's file to report a failure, and each module it
rewrites as it is imported (also after the tests: hypothesis's summary imports its own): there
it stops with an INTERNALERROR, that failure never reported and the tests after it never run.

With the collector paused while a parse runs, no finalizer runs inside one (nor can another
thread's parse, as this one keeps the GIL); what became garbage is collected afterwards.
"""

from __future__ import annotations

import ast
import functools
import gc
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import pytest

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.RLock()  # reentrant: a finalizer run by a collection in here may parse
_parsing = 0  # parses under way (the outermost one pauses and resumes the collector)
_resume = False  # whether the collector was enabled when the outermost one began


def _pause() -> None:
    global _parsing, _resume
    with _lock:
        if _parsing == 0:
            _resume = gc.isenabled()
            gc.disable()
        _parsing += 1


def _resume_after() -> None:
    global _parsing
    with _lock:
        _parsing -= 1
        if _parsing == 0 and _resume:
            gc.enable()


def paused(parse: Callable[P, R]) -> Callable[P, R]:
    """``parse`` run with the collector paused (left as it was: a test may have paused it)."""

    @functools.wraps(parse)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        _pause()
        try:
            return parse(*args, **kwargs)
        finally:
            _resume_after()

    return run


_ORIGINAL = ast.parse
_PAUSED = paused(ast.parse)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if ast.parse is _ORIGINAL:
        ast.parse = _PAUSED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if ast.parse is _PAUSED:
        ast.parse = _ORIGINAL
