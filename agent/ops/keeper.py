"""The Ray agent's keeper: why ``rtenv-agent ray-agent`` runs as two processes.

Ray's raylet ends its runtime env agent with SIGKILL when its node stops (``ray.shutdown()``
after a bare ``ray.init()``, ``ray stop``): an agent so killed cannot remove its socket, its
link and folder, or its holder from a root that outlives the node (``RTENV_ROOT``). So the
process the raylet starts forks at once, before anything else: the child is the agent, and the
parent, the *keeper*, only waits for it. The keeper

- exits as the agent did (its exit code, or 128 + the signal that ended it), so the raylet's
  fate sharing sees the agent's end as before;
- passes SIGTERM, SIGINT and SIGHUP on to the agent (each a graceful stop there).

The agent runs in a process group of its own (a terminal's Ctrl-C reaches the keeper, which
passes it on once), watches the raylet as before (its death ends the agent) and the keeper
too (``entry.serve``'s ``keeper_pid``): when the raylet kills the keeper, the agent stops
gracefully, and what it made in the root goes with it. Should both be killed, whoever reaps the
agent's holder removes its socket (``agent.state.sockets``).

The keeper does nothing else: no thread, no file, no socket; it forks before the agent's start
has made any of those.

How the agent words the end of what it watches (``end_line``): the raylet kills its agent (here,
the keeper) with SIGKILL only as it stops, in its agent manager's destructor, once its node is
shutting down (``ray.shutdown()``, ``ray stop``: Ray 2.60's ``agent_manager.cc``, "Killing agent
runtime_env_agent"). So the keeper's end is the node's normal end: INFO. So is the raylet's end
seen after the keeper's (both watches may wake at once). The raylet gone while the keeper lives
is not: a raylet that stops kills its agent first, so it was killed (``ray stop --force``, the
OOM killer) or crashed: WARNING. A keeper killed by someone else (the raylet then fate-shares
and stops too: gone 0.1 s later, measured) cannot be told from the normal end by the agent: in
both the keeper dies by SIGKILL and the raylet stops right after; the raylet itself logs that
case as an ERROR ("The raylet exited immediately because one Ray agent failed", shown in the
driver's output), so the agent logs it at INFO as a normal end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import types

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def split() -> int:
    """Fork: 0 in the agent (go on starting it), the agent's pid in the keeper (``keep`` it)."""
    pid = os.fork()
    if pid == 0:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    return pid


def keep(agent: int) -> int:
    """Wait for the agent, passing the stopping signals on; return the exit code the keeper's
    process should exit with: the agent's."""

    def forward(signum: int, _: types.FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    _, status = os.waitpid(agent, 0)  # a signal handled here is passed on, and the wait goes on
    return _exit_code(status)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def end_line(who: str, pid: int, keeper: int | None, parent_now: int) -> tuple[int, str]:
    """The log level and line for the end of process ``pid`` the agent watched (``who``:
    "keeper", or "parent": the raylet, or ``serve --parent-pid``'s); ``keeper`` the agent's
    keeper (None without one) and ``parent_now`` the agent's parent now (``os.getppid()``: no
    longer the keeper once the keeper has died)."""
    if who == "keeper" or (keeper is not None and parent_now != keeper):
        said = "the raylet ends its agent so when its node stops"
        return logging.INFO, f"{who} {pid} exited ({said}); shutting down"
    if keeper is not None:
        return logging.WARNING, (
            f"{who} {pid} exited without ending its agent first (killed, or crashed); shutting down"
        )
    return logging.WARNING, f"{who} {pid} exited; shutting down"
