"""One worker process, as the pool drives it: spawned with an env's context, its ready line, and
the task protocol on its pipes (one JSON line in, one JSON line out; see ``raylet_sim.worker``).

Nothing here keeps a table or counts anything: the pool (``raylet_sim.pool``) owns the workers,
their idle lists and their lifecycle; the env slots (``raylet_sim.slots``) own the contexts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from raylet_sim.tasks import (
    ARGUMENT_LIST_TOO_LONG,
    SPAWN_FAILED,
    TASK_ERROR,
    WORKER_DIED,
    WORKER_START_FAILED,
    TaskFailed,
    TaskSpec,
)
from raylet_sim.watch import ENV_VAR as WATCH_ENV_VAR
from rtenv.v1 import agent_pb2

READY_TIMEOUT_S = 30.0
# A worker may run on an env's own venv python, which does not have raylet_sim installed: the
# worker module (stdlib only) is found by appending its folder to sys.path, after the env's own.
_BOOTSTRAP = (
    f"import sys; sys.path.append({str(Path(__file__).resolve().parent.parent)!r}); "
    "from raylet_sim.worker import main; main()"
)


class WorkerState(Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"  # asked to exit (stdin closed or signalled): never handed out again
    EXITED = "exited"


@dataclass
class Worker:
    worker_id: int
    env_key: str
    process: asyncio.subprocess.Process
    state: WorkerState = WorkerState.STARTING
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)  # idle or stop
    unread: bool = False  # no task reads its stdout (idle, or stopped from idle): the reaper does

    @property
    def pid(self) -> int:
        return self.process.pid


async def spawn(
    context: agent_pb2.RuntimeEnvContext,
    *,
    stderr: IO[bytes] | int | None = None,
    watch_interval_s: float | None = None,
) -> asyncio.subprocess.Process:
    """A worker process with the context applied: its command (``py_executable``, shell words:
    a python, or a program and its arguments, the worker's appended), variables and cwd, in a
    session (a process group) of its own. Fails with ARGUMENT_LIST_TOO_LONG or SPAWN_FAILED."""
    python = context.py_executable or shlex.quote(sys.executable)  # shell words, as sent
    try:
        command = shlex.split(python)
    except ValueError as exc:
        raise TaskFailed(
            SPAWN_FAILED, f"cannot start a worker with {python!r}: not shell words: {exc}"
        ) from exc
    if not command:
        raise TaskFailed(SPAWN_FAILED, f"cannot start a worker with {python!r}: no command")
    env = {**os.environ, **context.env_vars}
    if watch_interval_s is not None:
        env[WATCH_ENV_VAR] = str(watch_interval_s)
    try:
        return await asyncio.create_subprocess_exec(
            *command, "-c", _BOOTSTRAP,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=stderr, cwd=context.cwd or None, env=env, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            size = environ_bytes(env)
            raise TaskFailed(
                ARGUMENT_LIST_TOO_LONG,
                f"argument list too long: the worker's environment is {size} bytes "
                f"({len(context.env_vars)} variables from the runtime env), more than the "
                "kernel accepts for a new process (E2BIG); shrink the env's env_vars",
            ) from exc
        raise TaskFailed(
            SPAWN_FAILED,
            f"cannot start a worker with {python!r} in {context.cwd or os.getcwd()!r}: "
            f"{exc.strerror or exc}",
        ) from exc


async def wait_ready(worker: Worker, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Read the worker's ready line; WORKER_START_FAILED if it does not come in time."""
    stdout = worker.process.stdout
    assert stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            line = await stdout.readline()
    except TimeoutError:
        why = f"did not report ready within {timeout_s:g}s"
    else:
        if _ready(line):
            return
        # EOF: it exited (or closed its stdout) first; else it wrote something else first
        why = "exited before reporting ready" if not line else f"wrote {line[:80]!r}, not ready"
    raise TaskFailed(WORKER_START_FAILED, f"worker {worker.pid} {why}", pid=worker.pid)


def _ready(line: bytes) -> bool:
    try:
        return bool(json.loads(line).get("ready"))
    except (ValueError, AttributeError):
        return False


async def call(worker: Worker, task: TaskSpec, task_id: str, violations: list[str]) -> Any:
    """Send one task to a busy worker and read its reply: the result, or TASK_ERROR (the task
    raised) or WORKER_DIED (the pipe broke, or the worker exited before answering). The
    violations the worker reports are appended to ``violations``."""
    proc = worker.process
    assert proc.stdin is not None
    assert proc.stdout is not None
    request = {"task_id": task_id, "call": task.call, "args": list(task.args)}
    try:
        proc.stdin.write((json.dumps(request) + "\n").encode())
        await proc.stdin.drain()
        line = await proc.stdout.readline()
    except (ConnectionError, BrokenPipeError) as exc:
        raise TaskFailed(
            WORKER_DIED, f"worker {worker.pid} is gone: {exc}", pid=worker.pid
        ) from exc
    reply = json.loads(line) if line else {}
    violations += reply.get("violations", [])
    if "ok" not in reply:  # EOF, or the last report a worker writes as it exits
        code = await proc.wait()
        raise TaskFailed(
            WORKER_DIED, f"worker {worker.pid} exited with {code} mid-task", pid=worker.pid
        )
    if not reply["ok"]:
        raise TaskFailed(TASK_ERROR, reply["error"])
    return reply["result"]


async def read_last_report(worker: Worker, violations: list[str]) -> None:
    """After an unread worker's exit (idle, or stopped from idle): its last report is on its
    stdout, which nobody else reads; append its violations."""
    if not worker.unread or worker.process.stdout is None:
        return
    with contextlib.suppress(TimeoutError, ValueError):
        async with asyncio.timeout(5):
            for line in (await worker.process.stdout.read()).splitlines():
                violations += json.loads(line).get("violations", [])


def environ_bytes(env: dict[str, str]) -> int:
    """Bytes an environment takes in execve: each "KEY=value\\0" and its pointer."""
    return sum(len(k.encode()) + len(v.encode()) + 2 + 8 for k, v in env.items())
