"""How a zip extraction is told to stop: its install was cancelled, or another share of it
failed. Every step of an extraction (``write``, ``finish``), the reader of an archive
still being downloaded (``growing``) and the unpack pool share this one signal.
"""

from __future__ import annotations

from collections.abc import Callable

Halted = Callable[[], bool]  # true once the extraction must stop (its install was cancelled)


class Stopped(Exception):
    """The extraction was told to stop (its install was cancelled): not an error of the
    archive; whoever stopped it has gone on with its own cancellation."""


def stop_if_halted(halted: Halted) -> None:
    """Raise ``Stopped`` once ``halted`` says so: called before every entry and chunk."""
    if halted():
        raise Stopped
