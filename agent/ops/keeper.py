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
"""

from __future__ import annotations

import contextlib
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
