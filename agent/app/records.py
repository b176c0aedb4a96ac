"""What the service keeps of each env it holds (its record), of each recent failure, and what
such values weigh in memory.

A live env's record is small on purpose: an agent may hold 100,000 envs. It keeps the env's
canonical JSON (its identity, shown by info; the env id is the key it is kept under), its state,
when it was created and the job ids and ``eager_install`` its creates said. Everything else is
elsewhere or derived: its URI keys are the reference tables' (``RefTables.env``), its parsed
value is in the parse cache (bounded) or in the hands of the create that has it, and its worker
context is a pure function of the parsed env, built when a door asks (the doors keep their
replies in caches of their own, bounded).

A create's ``job_id`` (the scheduler's job that asked) is kept for info: the latest
``MAX_JOB_IDS`` distinct ones, newest last (an env shared by jobs one after another shows who uses
it now), each at most ``MAX_JOB_ID_BYTES`` (longer ones are refused, not cut: a client chooses what
it sends). Equal tuples of job ids are shared between records through a bounded pool (``JobIds``):
many envs of one job keep one tuple, and a tuple evicted from the pool is only shared less.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from agent.app.snapshot import EnvState
from agent.core.bounded import BoundedCache
from agent.core.errors import InvalidArgument, echo
from agent.core.packages import Package
from agent.core.runtime_env import RuntimeEnv

MAX_JOB_ID_BYTES = 128  # Ray's job ids are 8 hex digits; a submission id is about 30 characters
MAX_JOB_IDS = 4  # job ids kept per env: the latest distinct ones
_SHARED_JOB_TUPLES = 1024  # distinct tuples of job ids in the pool


@dataclass(slots=True)
class EnvRecord:
    """A live env (it holds references): its canonical JSON, its state, and what its creates
    said. Kept under its env id (``env_id_of(canonical)``)."""

    canonical: str
    state: EnvState
    created_ms: int
    # the latest distinct job ids of its creates, newest last: at most MAX_JOB_IDS, each at most
    # MAX_JOB_ID_BYTES (checked in ``create``)
    job_ids: tuple[str, ...] = ()
    eager_install: bool = False  # the latest create asked for it (the service says why no more)
    # a package of the env its first create that planned it derived (held with the env's own
    # keys: ``RefTables.derive``): a uv run env's project venv, a venv whose requirements its
    # working dir holds, or the venv of a set naming files of the node, keyed by their bytes;
    # placed on the worker as its kind's row says, as every package of the env
    derived: Package | None = None

    def note_job(self, job_id: str, eager_install: bool, pool: JobIds) -> None:
        """One more create of this env, by ``job_id`` ("" = none said)."""
        self.eager_install = eager_install
        ids = self.job_ids
        if job_id and (not ids or ids[-1] != job_id):  # the same job again: nothing to do
            self.job_ids = pool.share((*(i for i in ids if i != job_id), job_id)[-MAX_JOB_IDS:])


@dataclass(frozen=True, slots=True)
class FailedEnv:
    """A recent failure, kept for info (bounded by the service): the parsed env, what its
    creates said and the error. It holds no references and no worker context."""

    env: RuntimeEnv
    failed_ms: int
    job_ids: tuple[str, ...]
    eager_install: bool
    error: str


class JobIds:
    """Equal tuples of job ids, shared: at most ``_SHARED_JOB_TUPLES`` kept, the least
    recently shared forgotten first (a forgotten tuple stays valid where it is kept)."""

    def __init__(self) -> None:
        self._pool: BoundedCache[tuple[str, ...], tuple[str, ...]] = BoundedCache(
            _SHARED_JOB_TUPLES, _SHARED_JOB_TUPLES * (MAX_JOB_IDS * MAX_JOB_ID_BYTES + 100)
        )

    def share(self, ids: tuple[str, ...]) -> tuple[str, ...]:
        shared = self._pool.get(ids)
        if shared is None:
            self._pool.put(ids, ids, sum(map(len, ids)) + 100)
            shared = ids
        return shared


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


def failure_weight(failed: FailedEnv) -> int:
    return env_weight(failed.env) + len(failed.error) + sum(map(len, failed.job_ids))
