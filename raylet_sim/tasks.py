"""What the pool runs and how a task fails: the task spec, and ``TaskFailed`` with its statuses.

Shared by the env slots (a create the agent refused) and the worker processes (a spawn, a start
or a task that failed); it depends on neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskSpec:
    env_key: str  # the serialized runtime env, as given
    call: str  # "module:function"
    args: tuple[Any, ...] = ()
    job_id: str = ""  # the job the task belongs to ("": none); passed on to a create it causes


class TaskFailed(Exception):
    """A task could not run. ``status`` says why, as a scheduler would report it; ``pid`` is the
    worker's, when a worker was involved (a death or a failed start)."""

    def __init__(self, status: str, message: str, *, pid: int | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.pid = pid


# Statuses of TaskFailed
ARGUMENT_LIST_TOO_LONG = "ARGUMENT_LIST_TOO_LONG"  # E2BIG: the env's variables are too large
SPAWN_FAILED = "SPAWN_FAILED"  # the worker process could not be started
WORKER_START_FAILED = "WORKER_START_FAILED"  # it started but never reported ready
ENV_SETUP_FAILED = "ENV_SETUP_FAILED"  # the agent refused or failed the env
WORKER_DIED = "WORKER_DIED"  # it died while running the task
TASK_ERROR = "TASK_ERROR"  # the task raised
