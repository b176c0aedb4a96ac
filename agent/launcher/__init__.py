"""The launcher: Ray nodes started from this process run this agent instead of Ray's own.

``install()`` wraps ``ray._private.services.start_ray_process`` in this process, so that a raylet
started from here (``ray.init()`` starting a local cluster, ``ray.cluster_utils.Cluster``, or Ray's
CLI run by ``rtenv-agent ray start ...``) gets ``--runtime_env_agent_command=`` naming
``<this python> -u -I -m agent ray-agent <Ray's flags>`` instead of Ray's ``agent/main.py``.
Ray's installed files are not changed; ``uninstall()`` restores Ray's function (Ray's own agent for
the raylets started next), ``installed()`` tells. Where the switch (``rtenv-agent ray enable``) is
on in this python, ``install()`` keeps its agent python and root. A raylet command with no agent
command this swap knows (a later Ray's, say) is started as it is, with a warning naming what it
holds; ``install(on_swap)`` is told each raylet command it swapped, before that raylet starts.

The swap itself is ``agent.ops.ray_swap`` (standard library only: ``rtenv-agent ray enable`` copies
it into a Python environment, ``agent.launcher.switch``). This package may import ``ray`` (lazily:
``swap_agent_command`` is pure and needs no ray); the agent's server never imports this package
(tests/test_layers.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent.ops.ray_swap import (
    AGENT_FLAG,
    OUR_AGENT,
    PROCESS_TYPE_RAYLET,
    RAY_AGENT_SCRIPT,
    agent_command_problem,
    swap_agent_command,
    swapping,
)

__all__ = [
    "AGENT_FLAG",
    "OUR_AGENT",
    "PROCESS_TYPE_RAYLET",
    "RAY_AGENT_SCRIPT",
    "agent_command_problem",
    "install",
    "installed",
    "swap_agent_command",
    "uninstall",
]

_lock = threading.Lock()
# The function install() replaced, while installed; None otherwise.
_original: Callable[..., Any] | None = None
# install()'s on_swap, told each raylet command swapped while installed.
_on_swap: Callable[[list[str]], None] | None = None


def _told(swapped: list[str]) -> None:
    if _on_swap is not None:
        _on_swap(swapped)


def install(on_swap: Callable[[list[str]], None] | None = None) -> None:
    """Make raylets started from this process run this agent. Idempotent; needs ray.
    ``on_swap`` (if given: the latest call's) is called with each raylet command whose agent
    was swapped for this one, before that raylet starts."""
    global _original, _on_swap
    from ray._private import services  # the launcher's one way into Ray

    with _lock:
        if on_swap is not None:
            _on_swap = on_swap
        if _original is not None:
            return
        original = services.start_ray_process
        # A switch's wrapper (rtenv-agent ray enable in this python): its agent python and
        # root are kept, Ray's own function is wrapped once.
        python = getattr(original, "agent_python", None)
        root = getattr(original, "agent_root", None)
        ray_own = getattr(original, "__wrapped__", original) if python else original
        services.start_ray_process = swapping(ray_own, python, root, on_swap=_told)
        _original = original


def uninstall() -> None:
    """Restore the ``start_ray_process`` install() replaced: Ray's own (raylets started next run
    Ray's agent), or the switch's where ``rtenv-agent ray enable`` armed one in this python."""
    global _original, _on_swap
    with _lock:
        _on_swap = None
        if _original is None:
            return
        from ray._private import services

        services.start_ray_process = _original
        _original = None


def installed() -> bool:
    """Whether raylets started from this process now run this agent."""
    return _original is not None
