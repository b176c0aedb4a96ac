"""The staging folder's blocking steps around an install, each one thread hop for the store.

``prepare_staging``: the private (0700) folder an install builds in. ``place_package``: a
leftover at the package's final path that no record claims (a crash between steps) moved to
trash, then the one rename of the complete package into ``uris/``. ``through``: await such a
step so that a cancelled install still lets it end, and what it made is there to clean up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.crash import crash_point
from agent.install.disk.root import move_to_trash, remove_tree

_T = TypeVar("_T")


async def through(step: asyncio.Future[_T], on_cancel: Callable[[], None] | None = None) -> _T:
    """Await ``step`` (a blocking call in a thread). If the caller is cancelled meanwhile, the
    step still ends before the cancellation goes on: the caller may then look at ``step`` to
    undo what it did, and nothing writes in a folder being removed. A long step is told to
    stop by ``on_cancel`` (called once, at the cancellation) and ends at its next check."""
    try:
        return await asyncio.shield(step)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while not step.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([step])
        if not step.cancelled():
            step.exception()  # retrieved: the cancellation is what goes on
        raise


def prepare_staging(staging: Path, prepare: Callable[[Path], None]) -> None:
    """Make the install's staging folder (private: nobody else may touch a package being built),
    then let its installer ``prepare`` in it. Blocking: one thread hop."""
    staging.mkdir(mode=0o700)
    prepare(staging)


def place_package(trash: Path, unpacked: Path, final: Path) -> Path | None:
    """Rename ``unpacked`` to ``final``; return the leftover moved out of the way (into
    ``trash``, to be deleted), if there was one. Blocking: one thread hop."""
    leftover = move_to_trash(trash, final) if final.exists() else None
    crash_point("before_rename")
    try:
        os.rename(unpacked, final)
    except BaseException:
        if leftover is not None:  # nobody else knows where it went
            remove_tree(leftover)
        raise
    return leftover
