"""The creates waiting on builds: which env each create in flight is of, for which jobs, and so
which jobs a build's progress line is for; and how long a create waits (``setup_wait``).

A create enters when its installs begin and leaves when they end (done, failed, timed out or
cancelled). A build's line (``UriStore.builds``) goes to ``sink`` once for each job whose create
waits on the build's package (its own, or the venv it derived): under Ray, the Ray door's sink
writes it into that job's setup log (``agent.doors.ray_setup_log``). Info lists, for each build in
flight, the envs and jobs waiting on it (``in_flight``).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.app.config import Settings
from agent.app.snapshot import BuildView
from agent.core.errors import InvalidRuntimeEnv
from agent.core.runtime_env import RuntimeEnv
from agent.core.uris import UriKey
from agent.state.builds import Builds

log = logging.getLogger(__name__)

Sink = Callable[[str, str], None]  # (job id, line)
MAX_BUILDS_LISTED = 1000  # in info: as many as there are install slots run, the rest queue


@dataclass
class _Create:
    keys_now: Callable[[], tuple[UriKey, ...]]  # the env's packages and its derived venv, as now
    jobs: Counter[str] = field(default_factory=Counter)  # of its creates in flight ("" none)


class Waiting:
    def __init__(self, builds: Builds) -> None:
        self._builds = builds
        self._creates: dict[str, _Create] = {}  # env id -> its creates in flight
        self.sink: Sink | None = None
        builds.emit = self._emit

    def enter(self, env_id: str, job_id: str, keys: Callable[[], tuple[UriKey, ...]]) -> None:
        create = self._creates.setdefault(env_id, _Create(keys))
        create.jobs[job_id] += 1

    def leave(self, env_id: str, job_id: str) -> None:
        create = self._creates.get(env_id)
        if create is None:
            return
        create.jobs[job_id] -= 1
        if create.jobs[job_id] <= 0:
            del create.jobs[job_id]
        if not create.jobs:
            del self._creates[env_id]

    def waiting_on(self, key: UriKey) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The envs and the jobs (named ones) whose creates wait on ``key`` now."""
        envs: list[str] = []
        jobs: dict[str, None] = {}
        for env_id, create in self._creates.items():
            if key in create.keys_now():
                envs.append(env_id)
                jobs.update((job, None) for job in create.jobs if job)
        return tuple(envs), tuple(jobs)

    def in_flight(self, limit: int = MAX_BUILDS_LISTED) -> tuple[BuildView, ...]:
        """The builds in flight (at most ``limit``), with who waits on each (no I/O)."""
        views = []
        for entry, progress in itertools.islice(self._builds.in_flight(), limit):
            envs, jobs = self.waiting_on(entry.key)
            views.append(
                BuildView(
                    uri=entry.key.uri,
                    kind=progress.kind,
                    elapsed_s=progress.elapsed_s,
                    bytes_so_far=progress.bytes_so_far,
                    queued=progress.queued,
                    kept=entry.kept,
                    env_ids=envs,
                    job_ids=jobs,
                )
            )
        return tuple(views)

    def _emit(self, key: UriKey, line: str) -> None:
        if self.sink is None:
            return
        for job in self.waiting_on(key)[1]:
            try:
                self.sink(job, line)
            except Exception:  # a setup log not written is no create's failure
                log.exception(
                    "a progress line for job %s was not written", job, extra={"job_id": job}
                )


def setup_wait(settings: Settings, env: RuntimeEnv, requested: int) -> float:
    """A create's whole wait: the timeout asked for (0: the env's, else the default; -1 and
    above the limit: the limit), once per attempt (``Settings.setup_attempts``)."""
    if requested < -1:
        raise InvalidRuntimeEnv(
            f"config.setup_timeout_seconds must be positive or -1, got {requested}"
        )
    chosen: float | None = requested or env.setup_timeout_seconds
    limit = settings.max_setup_timeout_s
    if not chosen:
        each = settings.default_setup_timeout_s
    elif chosen == -1:
        each = limit
    else:
        each = limit if chosen > limit else float(chosen)  # compared before float(): 10**400
    return each * settings.setup_attempts


def timeout_message(
    env_id: str, timeout_s: float, kept: tuple[UriKey, ...], attempts: int = 1
) -> str:
    """A create's setup timeout, in Ray's words' spirit: what to raise, and what goes on.
    ``timeout_s``: the whole wait, ``attempts`` times the setup timeout."""
    goes_on = (
        f"; {len(kept)} build(s) go on ({', '.join(k.label for k in kept[:3])}"
        f"{', ...' if len(kept) > 3 else ''}): a create of it again joins them, and "
        "`rtenv-agent info` shows them in flight"
        if kept
        else ""
    )
    return (
        f"runtime env {env_id} was not set up within {timeout_s:g}s "
        f"({_timeouts(timeout_s, attempts)})"
        f"{goes_on}. Consider increasing the timeout in the runtime_env config, for example "
        'runtime_env={"config": {"setup_timeout_seconds": 1800}, ...}'
    )


def _timeouts(timeout_s: float, attempts: int) -> str:
    if attempts == 1:
        return "setup_timeout_seconds"
    return f"{attempts} attempts of setup_timeout_seconds, {timeout_s / attempts:g}s each"
