"""The agent's operations, free of gRPC: create, delete, and what info reports.

This is where the reference tables and the store meet. Each operation does its bookkeeping in
one synchronous step on the event loop (no await between reading and changing the maps), then
awaits installs. The doors only convert: messages (``doors/servicer.py``; ``RayFront`` and
``doors/ray_http.py`` for Ray) and errors, by their kind (``doors/grpc_errors.py``,
``doors/ray_errors.py``). A create's request checked and its answer are values of
``agent.app.created``.

Create: parse (pure) -> build the context and check it could start a process (pure, before
anything is counted) -> take the references (tables, store) -> await the installs under the setup
timeout -> commit. Any failure, timeout or cancellation gives back exactly what was taken; at
the timeout the builds the create started are kept going first (``UriStore.builds``), for the
next create, and the creates waiting on builds are known for their progress lines (``waiting``).

Info: ``snapshot`` takes what the agent holds as frozen values (``agent.app.snapshot``) in one
synchronous step, and decides each package's state there (``agent.app.views``: how each held
thing reads as a value); ``levels`` takes the figures alone for a metrics scrape. The doors only
convert them.

A create's ``job_id`` (the scheduler's job that asked) is kept in the env's record for info: the
latest ``MAX_JOB_IDS`` distinct ones, newest last (an env shared by jobs one after another shows
who uses it now), each at most ``MAX_JOB_ID_BYTES`` (longer ones are refused, not cut: a client
chooses what it sends). ``eager_install`` (in the request's config or the JSON's ``config``) is
Ray's "install at job start rather than at the first worker": a scheduler's choice of *when* to
call create (Ray's raylet creates a job's env when the job starts and holds it until the job
ends). The agent has nothing more to do for it: every create installs every package before it
answers, which is eager already. It is accepted (stock Ray sends it set by default), never
refused, and kept in the env's record for info (the latest create's value).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agent.app.config import Settings
from agent.app.contexts import EnvContexts
from agent.app.created import Created, HitKey
from agent.app.ensures import start_ensures
from agent.app.idempotency import RequestLog
from agent.app.parsing import ParseCache
from agent.app.project_venvs import ProjectVenvs
from agent.app.records import (
    MAX_JOB_IDS,
    EnvRecord,
    FailedEnv,
    JobIds,
    check_job_id,
    failure_weight,
)
from agent.app.snapshot import EnvState, Levels, Snapshot
from agent.app.views import cache_view, env_view, failed_view, recovery_view, uri_view
from agent.app.waiting import Waiting, setup_wait, timeout_message
from agent.core import logfields
from agent.core.dialect import GRPC, Dialect
from agent.core.errors import (
    AgentError,
    Conflict,
    EnvNotFound,
    InvalidRuntimeEnv,
    SetupTimeout,
    cap_message,
    echo,
)
from agent.core.refs import RefTables
from agent.core.runtime_env import RuntimeEnv, env_id_of
from agent.core.uris import UriKey
from agent.state.recovery import RecoverySummary
from agent.state.state_db import StateDB
from agent.state.store import UriStore

log = logging.getLogger(__name__)

# What is remembered for speed or for info is bounded in bytes too: a client chooses the size
# of what it sends (an env of 1 MiB of variables, a JSON text padded to 1 MiB).
_MAX_FAILURES_KEPT = 100
_FAILURE_BYTES = 4 * 1024 * 1024  # bodies of recently failed envs kept for info
_MAX_ENV_ID_CHARS = 64  # an env id is 32 hex digits; a longer one names no env


class AgentService:
    """Invariant: ``_records`` has exactly the envs the reference tables hold (count >= 1)."""

    def __init__(
        self,
        settings: Settings,
        store: UriStore,
        tables: RefTables,
        *,
        db: StateDB | None = None,
        recovery: RecoverySummary | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.tables = tables
        self._db = db
        self._recovery = recovery_view(recovery or RecoverySummary())
        self._clock = clock
        # env id -> record: what the service keeps per live env (small: see ``records.py``)
        self.records: dict[str, EnvRecord] = {}
        self.failures: deque[FailedEnv] = deque()  # oldest first; see _remember_failure
        self._job_ids = JobIds()
        self._failure_bytes = 0
        self._requests = RequestLog(settings.request_log_capacity)
        cache = store.wheel_cache
        self._agent_uv = "" if cache is None else cache.version  # whether a uv_version needs a uv
        self._parses = ParseCache(
            settings.env,
            settings.allow_file_roots,
            node_python=settings.py_executable,
            agent_uv=self._agent_uv,
        )
        self._projects = ProjectVenvs(settings, store, tables, self._note)
        self.waiting = Waiting(store.builds)  # the creates waiting on builds, for their lines
        self.contexts = EnvContexts(settings, store.path_for, self.records)
        # References a holder of its own keeps on an env (the Ray door's, counted per string
        # by ``RayFront``; set by ``keep_held``): a delete by anyone else may not drop the
        # count below them, or that holder's later deletes would find nothing to give back
        # (``delete(holder=True)`` is the holder's own).
        self._held_by_holder: Callable[[str], int] = _none_held

    def accept_plugin_fields(self, fields: frozenset[str]) -> None:
        """Parse the fields of the node's runtime env plugins too (part of an env's identity;
        their hooks run at the Ray door, ``RayFront``)."""
        self._parses = ParseCache(
            self.settings.env,
            self.settings.allow_file_roots,
            fields,
            node_python=self.settings.py_executable,
            agent_uv=self._agent_uv,
        )

    def keep_held(self, held: Callable[[str], int]) -> None:
        """Keep, from now on, the references ``held(env_id)`` counts for the one holder of its
        own (the Ray door's front): only its own deletes (``holder=True``) drop them."""
        self._held_by_holder = held

    # -- create ----------------------------------------------------------------------------
    async def create(
        self,
        serialized: str,
        timeout_s: int,
        request_id: str,
        *,
        job_id: str = "",
        eager_install: bool = False,
        dialect: Dialect = GRPC,
    ) -> Created:
        """Count one reference on the env, installing what is missing first. ``job_id`` and
        ``eager_install`` (the request's; the JSON's ``config.eager_install`` counts too) are
        kept in the env's record for info, nothing more (see the module docstring).
        ``dialect``: how the door reads the text (``agent.core.dialect``)."""
        check_job_id(job_id)
        env = self._parses.parse(serialized, dialect)
        eager = eager_install or env.eager_install is True
        logfields.note(env_id=env.env_id)  # on this request's log lines from here on
        timeout = setup_wait(self.settings, env, timeout_s)
        hit = await self._requests.run(
            "create", request_id, env.env_id, lambda: self._create(env, timeout, job_id, eager)
        )
        # The request log remembers only ``hit``: the reply is built from the env, the same
        # for every create of it, so a retry after a delete gets the answer it missed.
        return Created(env, hit, self.contexts.worker, self.records)

    def check_create(
        self,
        serialized: str,
        timeout_s: int,
        *,
        job_id: str = "",
        eager_install: bool = False,
        dialect: Dialect = GRPC,
    ) -> HitKey:
        """``create``'s checks of its input, in its order and raising its errors, with nothing
        counted: what ``create_hit`` needs. A pure function of the request (and the settings):
        a door may keep the key of a request it sees again."""
        check_job_id(job_id)
        env = self._parses.parse(serialized, dialect)
        setup_wait(self.settings, env, timeout_s)
        return HitKey(env, job_id, eager_install or env.eager_install is True)

    def create_hit(self, key: HitKey) -> bool:
        """``create`` with no request id, in one synchronous step when it is a cache hit: one
        more reference on the env if it is ready here, or False (nothing done) when it is not:
        ``create`` then. The doors' hot path: no coroutine, no request log, no I/O; what is the
        same as the last create's is not noted again (each call here costs about as much as
        the rest of the hit)."""
        env_id = key.env.env_id
        record = self.records.get(env_id)
        if record is None or record.state is not EnvState.READY:
            return False
        if key.job_id or record.eager_install is not key.eager:
            record.note_job(key.job_id, key.eager, self._job_ids)
        keys = self.tables.hit(env_id)
        if keys is None:  # a record is kept exactly while the tables count its env
            raise AssertionError(f"ready env {env_id} has a record and no references")
        # the last use noted for the index; the live envs are as many as before
        self.store.touch(keys, note=self._db is not None)
        return True

    def created(self, env: RuntimeEnv) -> Created:
        """What a create of this live env answers (a door prepares its reply from it once)."""
        return Created(env, True, self.contexts.worker, self.records)

    async def _create(
        self, env: RuntimeEnv, setup_timeout_s: float, job_id: str, eager_install: bool
    ) -> bool:
        """Create (or count once more) the env; return whether it was a hit."""
        if self.create_hit(HitKey(env, job_id, eager_install)):  # ready: the hot path's step
            return True
        env_id = env.env_id
        record = self.records.get(env_id)
        if record is None:
            self.contexts.startable(env)  # a worker could be started with it (E2BIG)
            record = EnvRecord(env.canonical, EnvState.CREATING, self._now_ms())
        record.note_job(job_id, eager_install, self._job_ids)
        # Bookkeeping, atomically: no await from here to the first install.
        # Keys whose count goes 0 -> 1 are taken again in the index by their ensure below.
        self.tables.begin_create(env_id, env.uri_keys)
        self.records[env_id] = record
        self._note(env.uri_keys)  # before the installs: their commits carry it, none of its own
        # Each package's install as a task of this create's: when one fails, the others are
        # cancelled (gather alone would leave them running for nobody); an install another
        # create also waits for goes on for it (``UriStore.ensure``'s waiters).
        # At the setup timeout the builds are kept going (``UriStore.builds``) before their
        # ensures are left: the work is shielded from the timeout, then cancelled past it.
        ensures = start_ensures(env.packages, self.store.ensure)  # a tool first: ``ensures``
        work = asyncio.ensure_future(self._installs(env, record, ensures))
        self.waiting.enter(env_id, job_id, lambda: self._keys_of(env))
        kept: tuple[UriKey, ...] = ()
        try:
            try:
                await asyncio.wait_for(asyncio.shield(work), setup_timeout_s)
            except TimeoutError:
                kept = self.store.builds.keep(self._keys_of(env))
                raise
        except BaseException as exc:
            try:
                await _cancel_all([*ensures, work])
            finally:  # a second cancellation here still gives back what was taken
                self.waiting.leave(env_id, job_id)
                self._abort(env, exc)
            if isinstance(exc, TimeoutError):
                raise SetupTimeout(
                    timeout_message(env_id, setup_timeout_s, kept, self.settings.setup_attempts)
                ) from exc
            raise
        self.waiting.leave(env_id, job_id)
        record.state = EnvState.READY
        self.tables.commit_create(env_id)
        self._note(env.uri_keys)
        return False

    async def _installs(
        self, env: RuntimeEnv, record: EnvRecord, ensures: Sequence[asyncio.Future[Path]]
    ) -> None:
        await asyncio.gather(*ensures)
        if env.derives_venv:  # its venv is made from its files: after them
            await self._projects.derive(env, record)

    def _keys_of(self, env: RuntimeEnv) -> tuple[UriKey, ...]:
        """The env's packages and the venv its create derived, if it did yet."""
        refs = self.tables.env(env.env_id)
        return env.uri_keys if refs is None else tuple(refs.keys)

    def _abort(self, env: RuntimeEnv, exc: BaseException) -> None:
        released = self.tables.abort_create(env.env_id)
        record = self.records[env.env_id]
        if self.tables.env(env.env_id) is None:
            del self.records[env.env_id]
        if isinstance(exc, AgentError | TimeoutError):
            error = exc.message if isinstance(exc, AgentError) else "setup timed out"
            self._remember_failure(env, record, error)
        self.store.release(released)
        self._note(env.uri_keys)

    def _remember_failure(self, env: RuntimeEnv, record: EnvRecord, error: str) -> None:
        """Keep the recent failures for info: at most ``_MAX_FAILURES_KEPT`` of them and
        ``_FAILURE_BYTES`` of their bodies, the oldest dropped first; no worker context."""
        failed = FailedEnv(
            env, self._now_ms(), record.job_ids, record.eager_install, cap_message(error)
        )
        self.failures.append(failed)
        self._failure_bytes += failure_weight(failed)
        while len(self.failures) > _MAX_FAILURES_KEPT or self._failure_bytes > _FAILURE_BYTES:
            self._failure_bytes -= failure_weight(self.failures.popleft())

    def _note(self, keys: tuple[UriKey, ...]) -> None:
        """Note the live envs and an env's packages' last use for the index, written behind
        (no I/O)."""
        if self._db is not None:
            self._db.notes.note_live_envs(len(self.records))
            self.store.note(keys)

    # -- delete ----------------------------------------------------------------------------
    async def delete(
        self, env_id: str, serialized: str, request_id: str, *, holder: bool = False
    ) -> int:
        """Drop one reference of the env named by id or by its JSON; return what is left.
        Only the holder (``holder=True``) drops the references it holds (``keep_held``)."""
        env_id = self._named(env_id, serialized)

        async def op() -> int:
            return self._delete_one(env_id, holder)

        logfields.note(env_id=env_id)  # on this request's log lines from here on
        return await self._requests.run("delete", request_id, env_id, op)

    def delete_now(self, env_id: str, serialized: str, *, holder: bool = False) -> int:
        """``delete`` with no request id, in one synchronous step (the doors' hot path): the
        same checks, errors and change."""
        if serialized or not env_id or len(env_id) > _MAX_ENV_ID_CHARS:
            env_id = self._named(env_id, serialized)  # by its JSON, or refused there
        if holder or self._held_by_holder is _none_held:  # no holder's references to keep
            return self._delete(env_id)
        return self._delete_one(env_id, holder)

    def _named(self, env_id: str, serialized: str) -> str:
        """The env id a delete names, by id or by its JSON."""
        if serialized:
            env_id = self._parses.parse(serialized).env_id
        if not env_id:
            raise InvalidRuntimeEnv("name the env: set runtime_env_id or serialized_runtime_env")
        if len(env_id) > _MAX_ENV_ID_CHARS:
            raise EnvNotFound(
                f"runtime env {echo(env_id)} is unknown: an env id is 32 hex digits, "
                "as CreateRuntimeEnv returned it"
            )
        return env_id

    def _delete_one(self, env_id: str, holder: bool) -> int:
        held = 0 if holder else self._held_by_holder(env_id)
        if held and self.tables.env_count(env_id) <= held:
            raise Conflict(
                f"runtime env {env_id}'s {held} remaining reference(s) are held by Ray's "
                "raylet through the Ray door; it deletes them itself as its workers exit"
            )
        return self._delete(env_id)

    def _delete(self, env_id: str) -> int:
        refs = self.tables.env(env_id)
        remaining, released = self.tables.delete(env_id)
        if remaining == 0:
            del self.records[env_id]
        if released:
            self.store.release(released)
        if refs is not None and remaining == 0:  # else nothing to note: the live envs and
            self._note(refs.keys)  # the packages' last use are as the create noted them
        return remaining

    # -- info ------------------------------------------------------------------------------
    def snapshot(self, limit: int) -> Snapshot:
        """What the agent holds, in one synchronous step (no await: the maps cannot change
        under it). Envs: the live ones, then the recent failures of envs not live (newest
        first), at most ``limit`` (<= 0: the ``max_info_envs`` setting; never more than it).
        Every package, whatever the count: a door caps what it sends by its own measure."""
        cap = self.settings.max_info_envs
        limit = cap if limit <= 0 else min(limit, cap)
        tables, store = self.tables, self.store
        live = (env_view(env_id, r, tables) for env_id, r in self.records.items())
        failed = (
            failed_view(f) for f in reversed(self.failures) if f.env.env_id not in self.records
        )
        envs = tuple(itertools.islice(itertools.chain(live, failed), limit))
        uris = tuple(uri_view(entry, store, tables) for entry in store.entries())
        cache = cache_view(store.stats())
        builds = self.waiting.in_flight()
        return Snapshot(envs, uris, cache, len(self.records), len(uris), self._recovery, builds)

    async def caught_up(self) -> None:
        """Wait (bounded) until the root's figures count every change made before the call (a
        create's package is in ``used_bytes`` when its reply is followed by an info)."""
        await self.store.caught_up()

    async def current_snapshot(self, limit: int) -> Snapshot:
        """``snapshot`` once ``caught_up``."""
        await self.caught_up()
        return self.snapshot(limit)

    def levels(self) -> Levels:
        """The figures a metrics scrape reads, without the lists of ``snapshot``."""
        stats = self.store.stats()
        cache = self.store.wheel_cache
        return Levels(
            used_bytes=stats.used_bytes,
            unused_bytes=stats.unused_bytes,
            budget_bytes=stats.budget_bytes,
            installs_in_flight=self.store.installs_in_flight(),
            live_envs=len(self.records),
            evictions=stats.evictions,
            hits=stats.hits,
            wheel_cache_bytes=0 if cache is None else cache.own_bytes,
            wheel_cache_clears=0 if cache is None else cache.clears,
        )

    @property
    def root(self) -> Path:
        """The agent's root (where packages, the index and the socket live)."""
        return self.store.root

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.tables.check_invariants()
        self.store.check_invariants()
        live = {env_id for env_id, _ in self.tables.envs()}
        assert live == set(self.records), f"records {set(self.records)} != tables {live}"
        for env_id, refs in self.tables.envs():
            record = self.records[env_id]
            assert env_id_of(record.canonical) == env_id, f"record of {env_id}: another env"
            assert record.state is not EnvState.FAILED, f"live env {env_id} recorded failed"
            for key in refs.keys:
                entry = self.store.entry(key)
                if record.state is EnvState.READY:
                    assert entry is not None, f"ready env {env_id} lost {key}"
        kept: Iterable[EnvRecord | FailedEnv] = self.records.values()
        for ids in (k.job_ids for k in itertools.chain(kept, self.failures)):
            assert len(ids) <= MAX_JOB_IDS, f"job ids {ids}: more than {MAX_JOB_IDS}"
            assert len(set(ids)) == len(ids), f"job ids {ids}: one twice"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _none_held(env_id: str) -> int:
    return 0


async def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the tasks not done and wait until each has finished (its ``finally`` run)."""
    for task in tasks:
        task.cancel()
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending)
    for task in tasks:  # retrieved: a sibling's own failure is not logged as never retrieved
        if not task.cancelled():
            task.exception()
