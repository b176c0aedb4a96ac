"""What the service keeps of each env it holds (its record: the parsed env, its worker context,
its state, the jobs that created it), and what such values weigh in memory.

A create's ``job_id`` (the scheduler's job that asked) is kept for info: the latest
``MAX_JOB_IDS`` distinct ones, newest last (an env shared by jobs one after another shows who uses
it now), each at most ``MAX_JOB_ID_BYTES`` (longer ones are refused, not cut: a client chooses what
it sends).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from agent.app.snapshot import EnvState
from agent.core.context import WorkerContext
from agent.core.errors import InvalidArgument, echo
from agent.core.runtime_env import RuntimeEnv

MAX_JOB_ID_BYTES = 128  # Ray's job ids are 8 hex digits; a submission id is about 30 characters
MAX_JOB_IDS = 4  # job ids kept per env: the latest distinct ones


@dataclass(slots=True)
class EnvRecord:
    env: RuntimeEnv
    context: WorkerContext
    state: EnvState
    created_ms: int
    # the latest distinct job ids of its creates, newest last: at most MAX_JOB_IDS, each at most
    # MAX_JOB_ID_BYTES (checked in ``create``)
    job_ids: tuple[str, ...] = ()
    eager_install: bool = False  # the latest create asked for it (the service says why no more)
    error: str = ""

    def note_job(self, job_id: str, eager_install: bool) -> None:
        """One more create of this env, by ``job_id`` ("" = none said)."""
        self.eager_install = eager_install
        ids = self.job_ids
        if job_id and (not ids or ids[-1] != job_id):  # the same job again: nothing to do
            self.job_ids = (*(i for i in ids if i != job_id), job_id)[-MAX_JOB_IDS:]


def check_job_id(job_id: str) -> None:
    """Refuse a job id over ``MAX_JOB_ID_BYTES``: it is kept and shown, so its size is bounded
    (quoted cut in the message, as every client input is)."""
    if len(job_id) * 4 <= MAX_JOB_ID_BYTES:  # 4 bytes a character at most: no need to count
        return
    size = len(job_id.encode("utf-8", "surrogatepass"))
    if size > MAX_JOB_ID_BYTES:
        raise InvalidArgument(
            f"job_id {echo(job_id, 40)} is {size} bytes; the limit is {MAX_JOB_ID_BYTES} "
            "(Ray's job ids are 8 hex digits)"
        )


def env_weight(env: RuntimeEnv) -> int:
    """About the bytes a parsed env holds: its canonical text, its variables and URIs again
    (a copy each, shared strings aside), each package's recipe (a URI's fetch URL and path are
    copies of its text too), and the objects around them."""
    uri_bytes = sum(len(key.uri) for key in env.uri_keys)
    return (
        2 * sys.getsizeof(env.canonical)
        + 2 * uri_bytes
        + 300 * (len(env.env_vars) + len(env.uri_keys))
        + 1024
    )


def failure_weight(record: EnvRecord) -> int:
    return env_weight(record.env) + len(record.error) + sum(map(len, record.job_ids))
