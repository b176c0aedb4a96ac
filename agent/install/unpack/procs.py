"""The unpack pool's worker processes, seen from the agent: how one is started (its command
line, niced from its first instruction, the agent's signals blocked), how its answer becomes its
task's outcome (``settle``), and how its end is awaited (``reap``, a kill past a grace) and worded
(``how_it_ended``). The worker's own side is ``worker``; the pool (``pool``) decides
which worker runs what.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import agent
from agent.core.errors import AgentError, FailedPrecondition, UnsafeArchive
from agent.install.unpack import inflate
from agent.install.unpack.stop import Stopped
from agent.install.unpack.worker import AGENTS_SIGNALS

log = logging.getLogger(__name__)

NICE = 5  # workers' niceness above the agent's: the event loop preempts them when it wakes
CLOSE_GRACE_S = 5.0  # a worker told to stop that has not exited by then is killed
_NICE_CMD = shutil.which("nice")  # coreutils' nice: it execs the worker, same PID
_ISAL_ROOT = inflate.root()  # where ISA-L's decoder lives, if installed: the workers' -S skips it
_ERRORS: dict[str, type[AgentError]] = {
    cls.__name__: cls for cls in (UnsafeArchive, FailedPrecondition)
}


class WorkerDied(Exception):
    """The worker running a task died before it answered."""

    def __init__(self, pid: int, how: str) -> None:
        super().__init__(f"pid {pid} {how}")
        self.pid = pid
        self.how = how


def popen_worker(sock_fd: int, stops_fd: int, index: int, nice: int) -> subprocess.Popen[bytes]:
    """Start worker ``index`` (``python -S -m agent.install.unpack.worker``, exec'd, never a
    fork) on its end of a socket pair, with the pool's stop flags. Blocking: a thread hop."""
    package_root = str(Path(agent.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, _ISAL_ROOT, env.get("PYTHONPATH", "")) if p
    )
    # niced from its first instruction when `nice` is at hand (its imports never slow the
    # agent's own start); else it lowers itself once its imports are done
    niced = [_NICE_CMD, "-n", str(nice)] if _NICE_CMD else []
    argv = [
        *niced,
        sys.executable,
        "-S",
        "-m",
        "agent.install.unpack.worker",
        str(sock_fd),
        str(stops_fd),
        str(index),
        str(os.getpid()),
        "0" if niced else str(nice),
    ]
    # blocked in this (spawning) thread alone, so the worker starts with them blocked
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, AGENTS_SIGNALS)
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, pass_fds=(sock_fd, stops_fd), env=env
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def settle(future: asyncio.Future[int], answer: tuple[Any, ...]) -> None:
    """A worker's answer as its task's outcome: the bytes written, ``Stopped``, the worker's
    expected error (same class and message; an ``OSError`` with its errno), or a bug."""
    match answer:
        case ("ok", int(written)):
            future.set_result(written)
        case ("stopped",):
            future.set_exception(Stopped())
        case ("error", "OSError", str(message), code, filename):
            future.set_exception(OSError(code or errno.EIO, message, filename))
        case ("error", str(name), str(message), _, str(detail)) if name in _ERRORS:
            future.set_exception(_ERRORS[name](message))
        case ("error", str(name), str(message), _, str(detail)):
            log.error(
                "unpack worker raised %s: %s\n%s",
                name,
                message,
                detail,
                extra={"error": name},
            )
            future.set_exception(RuntimeError(f"the unpack worker raised {name}: {message}"))
        case _:
            future.set_exception(RuntimeError(f"the unpack worker answered {answer!r:.200}"))


def how_it_ended(status: int) -> str:
    """A worker's exit status as a message words it: "was killed by SIGKILL"."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def reap(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a worker told to end (or dead); kill it by its PID past the grace; return its
    exit status. Blocking."""
    try:
        return proc.wait(timeout=CLOSE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
