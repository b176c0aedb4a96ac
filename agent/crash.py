"""Crash points for tests: ``RTENV_CRASH_AT=<point>[,<point>...]`` makes the agent SIGKILL itself
when it reaches one, to prove that its state survives ``kill -9`` at that instant.

Points: after_download, after_extract, before_rename, after_rename_before_commit,
during_trash_deletion, mid_count_batch. Unset in production, a check costs one set lookup.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RTENV_CRASH_AT"
POINTS = frozenset(
    {
        "after_download",
        "after_extract",
        "before_rename",
        "after_rename_before_commit",
        "during_trash_deletion",
        "mid_count_batch",
    }
)


def _armed() -> frozenset[str]:
    names = frozenset(p.strip() for p in os.environ.get(ENV_VAR, "").split(",") if p.strip())
    unknown = names - POINTS
    if unknown:
        raise ValueError(
            f"{ENV_VAR} names unknown crash points {sorted(unknown)}; known: {sorted(POINTS)}"
        )
    return names


_ARMED = _armed()


def crash_point(name: str) -> None:
    """Die here, at once and without cleanup, if this point is armed."""
    assert name in POINTS, name
    if name in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
