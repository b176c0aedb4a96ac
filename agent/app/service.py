"""The agent's operations, free of gRPC: create, delete, and what info reports.

This is where the reference tables and the store meet. Each operation does its bookkeeping in
one synchronous step on the event loop (no await between reading and changing the maps), then
awaits installs. The gRPC servicer (``servicer.py``) only converts messages and errors.

Create: parse (pure) -> build the context and check it could start a process (pure, before
anything is counted) -> take the references (tables, store) -> await the installs under the setup
timeout -> commit. Any failure, timeout or cancellation gives back exactly what was taken.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from agent.app.config import Settings
from agent.app.idempotency import RequestLog
from agent.core.bounded import BoundedCache
from agent.core.context import WorkerContext, build_context
from agent.core.errors import (
    AgentError,
    EnvNotFound,
    InvalidRuntimeEnv,
    SetupTimeout,
    cap_message,
    echo,
)
from agent.core.refs import RefTables
from agent.core.runtime_env import RuntimeEnv, parse_runtime_env
from agent.state.state_db import EnvRow, StateDB
from agent.state.store import UriStore

log = logging.getLogger(__name__)

# What is remembered for speed or for info is bounded in bytes too: a client chooses the size
# of what it sends (an env of 1 MiB of variables, a JSON text padded to 1 MiB).
_MAX_FAILURES_KEPT = 100
_FAILURE_BYTES = 4 * 1024 * 1024  # bodies of recently failed envs kept for info
_PARSED_KEPT = 4096  # parsed envs remembered by the digest of their JSON text
_PARSED_BYTES = 8 * 1024 * 1024
_MAX_ENV_ID_CHARS = 64  # an env id is 32 hex digits; a longer one names no env


class EnvState(Enum):
    CREATING = "creating"  # references taken, installs in flight
    READY = "ready"  # every URI installed; creates of it answer at once
    FAILED = "failed"  # only in the record of recent failures; holds no references


@dataclass
class EnvRecord:
    env: RuntimeEnv
    context: WorkerContext
    state: EnvState
    created_ms: int
    error: str = ""
    persisted: bool = False  # its row is in the index


@dataclass(frozen=True)
class Created:
    env_id: str
    context: WorkerContext
    uris: tuple[str, ...]  # "kind:uri"
    hit: bool  # every package was installed already: no await, no I/O


class AgentService:
    """Invariant: ``_records`` has exactly the envs the reference tables hold (count >= 1)."""

    def __init__(
        self,
        settings: Settings,
        store: UriStore,
        tables: RefTables,
        *,
        db: StateDB | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.tables = tables
        self._db = db
        self._clock = clock
        self.records: dict[str, EnvRecord] = {}
        self.failures: deque[EnvRecord] = deque()  # oldest first; see _remember_failure
        self._failure_bytes = 0
        self._requests = RequestLog(settings.request_log_capacity)
        # digest of a JSON text -> env id -> parsed env: many spellings share one value
        self._spellings: BoundedCache[bytes, str] = BoundedCache(_PARSED_KEPT, _PARSED_KEPT * 128)
        self._parsed: BoundedCache[str, RuntimeEnv] = BoundedCache(_PARSED_KEPT, _PARSED_BYTES)

    # -- create ----------------------------------------------------------------------------
    async def create(self, serialized: str, timeout_s: int, request_id: str) -> Created:
        env = self._parse(serialized)
        try:
            timeout = self._setup_timeout(env, timeout_s)
            hit = await self._requests.run(
                "create", request_id, env.env_id, lambda: self._create(env, timeout)
            )
        except AgentError as exc:
            exc.env_id = env.env_id
            raise
        # The request log remembers only ``hit``: the reply is rebuilt from the env, the same
        # for every create of it, so a retry after a delete gets the answer it missed.
        record = self.records.get(env.env_id)
        if record is None:
            return Created(env.env_id, self._context(env), _uris(env), hit)
        return self._created(record, hit=hit)

    def _context(self, env: RuntimeEnv) -> WorkerContext:
        return build_context(
            env, self.store.path_for, py_executable=self.settings.py_executable,
            limits=self.settings.env,
        )  # fmt: skip

    async def _create(self, env: RuntimeEnv, setup_timeout_s: float) -> bool:
        """Create (or count once more) the env; return whether it was a hit."""
        env_id = env.env_id
        record = self.records.get(env_id)
        if record is None:
            record = EnvRecord(env, self._context(env), EnvState.CREATING, self._now_ms())
        # Bookkeeping, atomically: no await from here to the first install.
        acquired = self.tables.begin_create(env_id, env.uri_keys)
        self.store.acquire(acquired)
        self.records[env_id] = record
        if record.state is EnvState.READY:  # the hot path: no await, no I/O
            self.store.touch(env.uri_keys)
            self.tables.commit_create(env_id)
            self._note(env)
            return True
        try:
            async with asyncio.timeout(setup_timeout_s):
                await asyncio.gather(*(self.store.ensure(p) for p in env.packages))
            if self._db is not None and not record.persisted:
                row = EnvRow(env_id, env.canonical, _pairs(env), record.created_ms)
                await self._db.record_env(row, self.tables.env_count(env_id))
                record.persisted = True
        except BaseException as exc:
            self._abort(env, exc)
            if isinstance(exc, TimeoutError):
                raise SetupTimeout(
                    f"runtime env {env_id} was not set up within {setup_timeout_s:g}s "
                    "(setup_timeout_seconds); installs no other create waits for were cancelled"
                ) from exc
            raise
        record.state = EnvState.READY
        self.tables.commit_create(env_id)
        self._note(env)
        return False

    def _abort(self, env: RuntimeEnv, exc: BaseException) -> None:
        released = self.tables.abort_create(env.env_id)
        record = self.records[env.env_id]
        if self.tables.env(env.env_id) is None:
            del self.records[env.env_id]
        if isinstance(exc, AgentError | TimeoutError):
            error = exc.message if isinstance(exc, AgentError) else "setup timed out"
            self._remember_failure(record.env, error)
        self.store.release(released)
        self._note(env)

    def _remember_failure(self, env: RuntimeEnv, error: str) -> None:
        """Keep the recent failures for info: at most ``_MAX_FAILURES_KEPT`` of them and
        ``_FAILURE_BYTES`` of their bodies, the oldest dropped first; no worker context."""
        error = cap_message(error)
        failed = EnvRecord(env, _NO_CONTEXT, EnvState.FAILED, self._now_ms(), error)
        self.failures.append(failed)
        self._failure_bytes += _failure_weight(failed)
        while len(self.failures) > _MAX_FAILURES_KEPT or self._failure_bytes > _FAILURE_BYTES:
            self._failure_bytes -= _failure_weight(self.failures.popleft())

    def _note(self, env: RuntimeEnv) -> None:
        """Note the env's and its packages' counts for the index, written behind (no I/O)."""
        if self._db is not None:
            self._db.note_env(env.env_id, self.tables.env_count(env.env_id))
            self.store.note(env.uri_keys)

    def _created(self, record: EnvRecord, *, hit: bool) -> Created:
        return Created(
            env_id=record.env.env_id,
            context=record.context,
            uris=_uris(record.env),
            hit=hit,
        )

    def _parse(self, serialized: str) -> RuntimeEnv:
        """Parse, remembering recent good answers: a scheduler sends the same JSON again and
        again, and parsing (JSON, canonical form, hash) is most of a cache-hit create's work.
        The value is immutable and a pure function of the text and the settings.

        Remembered by the digest of the text (never the text: a client may pad it to 1 MiB),
        each distinct env once by its id, within a byte budget."""
        digest = hashlib.sha256(serialized.encode("utf-8", "surrogatepass")).digest()
        env_id = self._spellings.get(digest)
        env = self._parsed.get(env_id) if env_id is not None else None
        if env is None:
            settings = self.settings
            env = parse_runtime_env(serialized, settings.env, file_roots=settings.allow_file_roots)
            self._spellings.put(digest, env.env_id, 128)
            self._parsed.put(env.env_id, env, _env_weight(env))
        return env

    def _setup_timeout(self, env: RuntimeEnv, requested: int) -> float:
        if requested < -1:
            raise InvalidRuntimeEnv(
                f"config.setup_timeout_seconds must be positive or -1, got {requested}"
            )
        chosen: float | None = requested or env.setup_timeout_seconds
        limit = self.settings.max_setup_timeout_s
        if not chosen:
            return self.settings.default_setup_timeout_s
        if chosen == -1:
            return limit
        return limit if chosen > limit else float(chosen)  # compared before float(): 10**400

    # -- delete ----------------------------------------------------------------------------
    async def delete(self, env_id: str, serialized: str, request_id: str) -> int:
        """Drop one reference of the env named by id or by its JSON; return what is left."""
        if serialized:
            env_id = self._parse(serialized).env_id
        if not env_id:
            raise InvalidRuntimeEnv("name the env: set runtime_env_id or serialized_runtime_env")
        if len(env_id) > _MAX_ENV_ID_CHARS:
            raise EnvNotFound(
                f"runtime env {echo(env_id)} is unknown: an env id is 32 hex digits, "
                "as CreateRuntimeEnv returned it"
            )

        async def op() -> int:
            return self._delete(env_id)

        try:
            return await self._requests.run("delete", request_id, env_id, op)
        except AgentError as exc:
            exc.env_id = env_id
            raise

    def _delete(self, env_id: str) -> int:
        env = self.records[env_id].env if env_id in self.records else None
        remaining, released = self.tables.delete(env_id)
        if remaining == 0:
            del self.records[env_id]
        self.store.release(released)
        if env is not None:
            self._note(env)
        return remaining

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.tables.check_invariants()
        self.store.check_invariants()
        live = {env_id for env_id, _ in self.tables.envs()}
        assert live == set(self.records), f"records {set(self.records)} != tables {live}"
        for env_id, refs in self.tables.envs():
            for key in refs.keys:
                entry = self.store.entry(key)
                if self.records[env_id].state is EnvState.READY:
                    assert entry is not None, f"ready env {env_id} lost {key}"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


_NO_CONTEXT = WorkerContext(env_vars={}, cwd="", py_executable="")


def _uris(env: RuntimeEnv) -> tuple[str, ...]:
    return tuple(str(key) for key in env.uri_keys)


def _env_weight(env: RuntimeEnv) -> int:
    """About the bytes a parsed env holds: its canonical text, its variables and URIs again
    (a copy each, shared strings aside), and the objects around them."""
    return 2 * sys.getsizeof(env.canonical) + 100 * (len(env.env_vars) + len(env.uri_keys)) + 1024


def _failure_weight(record: EnvRecord) -> int:
    return _env_weight(record.env) + len(record.error)


def _pairs(env: RuntimeEnv) -> tuple[tuple[str, str], ...]:
    return tuple((key.kind.value, key.uri) for key in env.uri_keys)
