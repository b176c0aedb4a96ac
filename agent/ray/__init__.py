"""The launcher: Ray nodes started from this process run this agent instead of Ray's own.

``install()`` wraps ``ray._private.services.start_ray_process`` in this process, so that a raylet
started from here (``ray.init()`` starting a local cluster, ``ray.cluster_utils.Cluster``, or Ray's
CLI run by ``rtenv-agent ray start ...``) gets ``--runtime_env_agent_command=`` naming
``<this python> -u -I -m agent ray-agent <Ray's flags>`` instead of Ray's ``agent/main.py``.
Ray's installed files are not changed; ``uninstall()`` restores Ray's function (Ray's own agent for
the raylets started next), ``installed()`` tells. A raylet command with no agent command this
swap knows (a later Ray's, say) is started as it is, with a warning naming what it holds;
``install(on_swap)`` is told each raylet command it swapped, before that raylet starts.

This package may import ``ray`` (lazily: ``swap_agent_command`` is pure and needs no ray); the
agent's server never imports this package (tests/test_layers.py).
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agent.core.errors import echo

__all__ = [
    "AGENT_FLAG",
    "agent_command_problem",
    "install",
    "installed",
    "swap_agent_command",
    "uninstall",
]

AGENT_FLAG = "--runtime_env_agent_command="  # the raylet's flag naming its agent's command
RAY_AGENT_SCRIPT = ("runtime_env", "agent", "main.py")  # ray/_private/runtime_env/agent/main.py
# -I (isolated): neither the raylet's working directory nor PYTHONPATH (which the raylet passes
# on, and may hold a user's own "agent" package) nor the user site is on sys.path, so nothing of
# the user's can stand in for this package. The agent still reads os.environ["PYTHONPATH"]: the
# node's path that workers' contexts carry.
OUR_AGENT = ("-I", "-m", "agent", "ray-agent")
PROCESS_TYPE_RAYLET = "raylet"  # ray_constants.PROCESS_TYPE_RAYLET

log = logging.getLogger(__name__)
_lock = threading.Lock()
# The function install() replaced, while installed; None otherwise.
_original: Callable[..., Any] | None = None
# install()'s on_swap, told each raylet command swapped while installed.
_on_swap: Callable[[list[str]], None] | None = None


def _agent_flags(command: Sequence[str]) -> list[str] | None:
    """Ray's flags to its agent: what follows Ray's main.py (after the python and any profiler
    Ray puts first); None for a command without Ray's agent (this agent's, say: the swap is
    then idempotent)."""
    for i, word in enumerate(command):
        if tuple(word.replace("\\", "/").split("/")[-3:]) == RAY_AGENT_SCRIPT:
            return list(command[i + 1 :])
    return None


def _ours(command: Sequence[str]) -> bool:
    """Whether an agent command is already this agent's (the swap's own output)."""
    return any(tuple(command[i : i + len(OUR_AGENT)]) == OUR_AGENT for i in range(len(command)))


def agent_command_problem(raylet_argv: Sequence[str]) -> str | None:
    """Why the swap cannot put this agent in a raylet's command (None: it can, or already did):
    no ``--runtime_env_agent_command=``, or one naming neither Ray's main.py nor this agent."""
    found = [a for a in raylet_argv if a.startswith(AGENT_FLAG)]
    if not found:
        return f"the raylet's command has no {AGENT_FLAG} flag"
    for arg in found:
        try:
            command = shlex.split(arg.removeprefix(AGENT_FLAG))
        except ValueError:
            continue
        if _agent_flags(command) is not None or _ours(command):
            return None
    return (
        f"the raylet's {AGENT_FLAG} names neither Ray's {'/'.join(RAY_AGENT_SCRIPT)} nor this "
        f"agent: {echo(found[0], 500)}"
    )


def swap_agent_command(raylet_argv: Sequence[str]) -> list[str]:
    """The raylet's command with its runtime env agent replaced by this agent (Ray's flags to the
    agent unchanged); everything else, and a command with no agent of Ray's, left as it is.
    Idempotent. The agent's command is one argument, written as Ray writes it
    (``subprocess.list2cmdline``), which the raylet splits back."""
    out = list(raylet_argv)
    for i, arg in enumerate(out):
        if not arg.startswith(AGENT_FLAG):
            continue
        flags = _agent_flags(shlex.split(arg.removeprefix(AGENT_FLAG)))
        if flags is not None:
            ours = [sys.executable, "-u", *OUR_AGENT, *flags]
            out[i] = AGENT_FLAG + subprocess.list2cmdline(ours)
    return out


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

        def start_ray_process(command: list[str], process_type: str, *a: Any, **kw: Any) -> Any:
            if process_type == PROCESS_TYPE_RAYLET:
                if (problem := agent_command_problem(command)) is not None:
                    log.warning(
                        "agent.ray: this raylet runs its own runtime env agent, not this one: "
                        "%s (a Ray this launcher does not know?)", problem,
                        extra={"problem": problem},
                    )  # fmt: skip
                swapped = swap_agent_command(command)
                if problem is None and _on_swap is not None:
                    _on_swap(swapped)
                command = swapped
            return original(command, process_type, *a, **kw)

        start_ray_process.__wrapped__ = original  # type: ignore[attr-defined]
        services.start_ray_process = start_ray_process
        _original = original


def uninstall() -> None:
    """Restore Ray's own ``start_ray_process``: raylets started next run Ray's agent."""
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
