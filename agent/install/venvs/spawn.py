"""Child processes the agent starts and waits for on its event loop, whichever loop that is.

The installers (pip, uv, ``python -m venv``) and uv's version check and cache clean are spawned
by ``subprocess.Popen`` in a thread, not by the loop's ``create_subprocess_exec``:

- CPython's ``fork_exec`` runs no Python code in the child between fork and exec (no
  ``preexec_fn`` is ever given), so a child of a process serving gRPC from several threads is
  safe. uvloop's spawn runs the interpreter's after-fork hooks in the child before exec
  (``threading``'s and every ``os.register_at_fork`` handler): under the agent's load that child
  crashed now and then with SIGSEGV, and an install failed for nothing. uvloop also refuses
  asyncio's ``umask=`` keyword.
- The exit is awaited through a pidfd the loop watches (``add_reader``), on either loop, so no
  thread sits blocked for the length of an install (the default executor's few threads serve
  the unzips and hashes); the child is then reaped at once.

``spawn`` starts one; a cancellation while it starts still lets the start end, then kills what
started. ``run`` runs a short command to its end within a deadline, its output kept in memory
(a memfd: no pipe to fill and stall it) and the last of it returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from agent.install.disk.staging import through

_Redirect = int | IO[bytes] | None
OUTPUT_TAIL_BYTES = 64 * 1024  # of a ``run`` command's output, returned


@dataclass(eq=False)
class Child:
    """A started process: awaited on the loop through its pidfd."""

    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        """Wait for the exit without a thread (the loop watches a pidfd); the exit status, as
        ``Popen.returncode`` says it (negative: killed by that signal)."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        pidfd = os.pidfd_open(self.popen.pid)
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self.popen.wait()  # it has exited: the reap does not block

    def kill(self, *, group: bool = False) -> None:
        """SIGKILL the child, or its whole process group (it leads its own session); nothing if
        it is gone."""
        if self.popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.popen.pid, signal.SIGKILL)
            else:
                self.popen.kill()


async def spawn(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: _Redirect = None,
    stderr: _Redirect = None,
    cwd: Path | None = None,
    start_new_session: bool = False,
) -> Child:
    """Start ``args`` (standard input the null device) with a thread hop for the fork. Cancelled
    meanwhile: the start ends, the child is killed (its group too when it leads one) and
    reaped, then the cancellation goes on."""
    starting = asyncio.to_thread(
        subprocess.Popen,
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=dict(env),
        cwd=cwd,
        start_new_session=start_new_session,
    )
    step = asyncio.ensure_future(starting)
    try:
        popen = await through(step)
    except asyncio.CancelledError:
        if not step.cancelled() and step.exception() is None:
            child = Child(step.result())
            child.kill(group=start_new_session)
            await asyncio.shield(asyncio.to_thread(child.popen.wait))
        raise
    return Child(popen)


@dataclass(frozen=True)
class Finished:
    """How a ``run`` command ended: its exit status and the last of its output."""

    code: int
    output: bytes  # stdout and stderr as written, at most OUTPUT_TAIL_BYTES of the end


async def run(args: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Finished:
    """Run a short command to its end: its standard output and error together in a memfd,
    bounded in time (past ``timeout_s``, or cancelled, it is killed and reaped, and the error
    goes on: ``TimeoutError`` for the deadline)."""
    out = os.memfd_create("rtenv-command-output", os.MFD_CLOEXEC)
    try:
        child = await spawn(args, env=env, stdout=out, stderr=out)
        try:
            code = await asyncio.wait_for(child.wait(), timeout_s)
        except BaseException:
            child.kill()
            await asyncio.shield(child.wait())
            raise
        output = await asyncio.to_thread(_tail, out)
    finally:
        os.close(out)
    return Finished(code, output)


def _tail(fd: int) -> bytes:
    """The last ``OUTPUT_TAIL_BYTES`` of what was written to ``fd``. Blocking (a memory read)."""
    size = os.fstat(fd).st_size
    start = max(0, size - OUTPUT_TAIL_BYTES)
    return os.pread(fd, size - start, start)
