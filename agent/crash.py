"""Crash points for tests: ``RTENV_CRASH_AT=<point>[,<point>...]`` makes the agent SIGKILL itself
when it reaches one, to prove that its state survives ``kill -9`` at that instant.

Points: after_download, mid_extract (an unpack writes a zip's second file: some are written, not
all), after_extract, before_rename, after_rename_before_commit, during_trash_deletion,
mid_count_batch, mid_ray_link (a tree of Ray's folders has its first hard link, not yet renamed
into place) and mid_venv_build (the venv folder exists and an installer was started in it).
Unset in production, a check costs one set lookup.

A point reached in a helper process of the agent (an unpack worker: ``kills_agent``) kills the
agent first, then that helper: the agent dies there as if it had run that step itself.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "RTENV_CRASH_AT"
POINTS = frozenset(
    {
        "after_download",
        "mid_extract",
        "after_extract",
        "before_rename",
        "after_rename_before_commit",
        "during_trash_deletion",
        "mid_count_batch",
        "mid_ray_link",
        "mid_venv_build",
    }
)


def named_in(env_var: str, known: frozenset[str], what: str) -> frozenset[str]:
    """The comma-separated names in ``env_var``; a name not in ``known`` is a ValueError."""
    names = frozenset(p.strip() for p in os.environ.get(env_var, "").split(",") if p.strip())
    unknown = names - known
    if unknown:
        raise ValueError(
            f"{env_var} names unknown {what} {sorted(unknown)}; known: {sorted(known)}"
        )
    return names


_ARMED = named_in(ENV_VAR, POINTS, "crash points")
_agent: int | None = None  # in a helper process: the agent's pid (``kills_agent``)


def kills_agent(pid: int) -> None:
    """This process is a helper of the agent ``pid`` (chosen once, at its start): a crash point
    reached here kills the agent, then this process."""
    global _agent
    _agent = pid


def armed(name: str) -> bool:
    """Whether ``name`` is armed (for a point whose place costs a look before it is known)."""
    assert name in POINTS, name
    return name in _ARMED


def crash_point(name: str) -> None:
    """Die here, at once and without cleanup, if this point is armed."""
    assert name in POINTS, name
    if name in _ARMED:
        if _agent is not None:
            os.kill(_agent, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
