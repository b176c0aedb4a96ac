"""What a create is asked and answers, as values: ``HitKey`` (a create request checked, what
the hot path needs) and ``Created`` (its answer: the env, whether it was a hit, and on demand
its worker context and its URIs).

Pure values: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.app.records import EnvRecord
from agent.core.context import WorkerContext
from agent.core.runtime_env import RuntimeEnv
from agent.core.uris import UriKey


@dataclass(frozen=True, slots=True)
class HitKey:
    """A create request checked (``AgentService.check_create``): its env, job and eagerness."""

    env: RuntimeEnv
    job_id: str
    eager: bool


_NO_RECORDS: Mapping[str, EnvRecord] = {}


class Created:
    """A create's answer: the env (parsed), whether it was a hit, and on demand its worker
    context and its URIs ("kind:uri"), each built once when first asked (a door that kept its
    reply for the env asks for neither)."""

    __slots__ = ("_build", "_context", "_records", "_uris", "env", "hit")

    def __init__(
        self,
        env: RuntimeEnv,
        hit: bool,
        build: Callable[[RuntimeEnv], WorkerContext],
        records: Mapping[str, EnvRecord] = _NO_RECORDS,
    ) -> None:
        """``records``: the service's, whose record of the env keeps the venv its create
        derived, if it did (named last among the URIs)."""
        self.env = env
        self.hit = hit  # every package was installed already: no await, no I/O
        self._build = build
        self._records = records
        self._context: WorkerContext | None = None
        self._uris: tuple[str, ...] | None = None

    @property
    def env_id(self) -> str:
        return self.env.env_id

    @property
    def context(self) -> WorkerContext:
        if self._context is None:
            self._context = self._build(self.env)
        return self._context

    @property
    def uris(self) -> tuple[str, ...]:
        if self._uris is None:
            record = self._records.get(self.env_id) if self.env.derives_venv else None
            derived = None if record is None else record.derived
            keys = self.env.uri_keys if derived is None else (*self.env.uri_keys, derived.key)
            self._uris = uris_of(keys)
        return self._uris


def uris_of(keys: tuple[UriKey, ...]) -> tuple[str, ...]:
    """The keys as a reply names them: "kind:uri"."""
    return tuple(str(key) for key in keys)
