"""Ray 2.60's request semantics over the service: what the Ray door answers, as plain values.

Ray's raylet counts references per *serialized string*, as it sends it: the same env arrives
with different spacing (a job's env and a task's env serialised by different code), and each
string is deleted by itself. So this front keeps, per string (``_strings``), what Ray believes
(``count``: one more when a create *arrives*, one less when a delete arrives), the creates of it
still in flight, and the service references it actually holds (``refs``, all on the env id the
first finished create returned). As Ray's own agent does, a delete is counted at arrival, even
while a create of that string is still installing (the raylet deletes a finished job's envs
whether or not their creates have answered): it is FAILED, changing nothing, only if the count
is 0; it releases a service reference only when ``refs > count``. A finished create adds its
reference and releases at once while ``refs > count``; a failed or cancelled create gives its
count back (never below 0), releasing a reference held beyond what is left, as Ray's agent
decrements on a failed create. ``source_process == "client_server"``
(Ray Client's server, which never deletes) installs but is not counted, and its delete does
nothing; as Ray's agent keeps such a create's URIs in use until a counted holder of them lets
them go, this front holds one reference on the env (``_client_holds``, at most
``MAX_CLIENT_HOLDS`` envs, the oldest given back past that) until a counted create of the same
env takes it over, so a cache of 0 does not delete the folder the client's server starts in.

Bounds (a client chooses what it sends): at most ``MAX_STRINGS_PER_ENV`` spellings of one env id
and ``MAX_HELD_BYTES`` of held strings; a create past either is FAILED saying the limit.

Failures are exceptions, as the service's are: an expected one is an ``AgentError`` (the
front's own refusals too), which the Ray door answers through its one table
(``doors/ray_errors.py``) as status FAILED with the message prefixed by ``prefix`` (which agent
and node answered: Ray shows it to the user in ``RuntimeEnvSetupError``); anything else is a
bug there. A create that fails, whatever the exception, gives back what it took first.

Info lists one state per string: each counted string whose env is set up (its count, the time
its first create took), then the recent failures of strings not held (bounded in number and
bytes); the reply's strings are capped at ``MAX_INFO_BYTES`` (``total`` still counts the rest).
``creation_time_ms`` is, as in Ray's agent, how long the create took.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agent.app.contexts import check_format
from agent.app.parsing import warn_ignored
from agent.app.recent_failures import RecentFailures
from agent.app.records import MAX_JOB_ID_BYTES
from agent.app.service import AgentService
from agent.core import logfields
from agent.core.bounded import BoundedCache
from agent.core.dialect import RAY, ContextFormat
from agent.core.errors import (
    AgentError,
    EnvNotFound,
    InvalidArgument,
    RayStringsFull,
    cap_message,
    echo,
)
from agent.core.runtime_env import RuntimeEnv
from agent.doors.ray_context import build_ray_context
from agent.doors.ray_plugins import PluginRunner, PluginSetups
from agent.doors.ray_setup_log import SetupLogs

log = logging.getLogger(__name__)

CLIENT_SERVER = "client_server"  # Ray's source_process that is never counted
MAX_CLIENT_HOLDS = 64  # envs held for Ray Client's servers until a counted create takes over
MAX_STRINGS_PER_ENV = 16  # spellings of one env id counted at once (the raylet sends 2-3)
MAX_HELD_BYTES = 32 * 1024 * 1024  # the counted strings' text, all together
MAX_INFO_BYTES = 8 * 1024 * 1024  # strings and messages in one info reply
_MAX_FAILED = 100  # recent failures kept for info, per string
_FAILED_BYTES = 4 * 1024 * 1024  # their strings and messages
_CONTEXTS_KEPT = 4096  # serialized contexts remembered by env id
_CONTEXT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RayEnvState:
    runtime_env: str
    ref_cnt: int
    success: bool
    error: str | None
    creation_time_ms: int


@dataclass(frozen=True, slots=True)
class RayInfo:
    states: tuple[RayEnvState, ...]
    total: int  # states there are, whatever the limit


@dataclass(slots=True)
class _String:
    """One serialized string's counts. Invariant: 0 <= refs <= count; count > 0 or in_flight
    > 0 (else the string is forgotten); refs > 0 only once env_id is known."""

    count: int = 0  # what Ray believes: creates arrived minus deletes arrived
    in_flight: int = 0  # creates of this string not answered yet
    refs: int = 0  # service references this front holds for the string, on env_id
    env_id: str | None = None  # from the first finished create (the same for every create)
    creation_time_ms: int = 0  # how long that create took


class RayFront:
    def __init__(
        self,
        service: AgentService,
        *,
        plugins: PluginRunner | None = None,
        node: str = "",
        node_pythonpath: str = "",
        python_version: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
        clock: Callable[[], float] = time.perf_counter,
        setup_logs: SetupLogs | None = None,
    ) -> None:
        """``python_version``: the version of ``settings.py_executable`` (the venvs' python:
        their site-packages path names it). ``setup_logs``: Ray's per-job setup logs, which get
        the progress lines of the builds each job's creates wait on."""
        self.service = service
        self.setup_logs = setup_logs
        if setup_logs is not None:
            service.waiting.sink = setup_logs.write
        # Ray's runtime env plugins, run once per counted string (``ray_plugins.py``)
        self._plugins = None if plugins is None else PluginSetups(plugins)
        if plugins is not None:
            service.accept_plugin_fields(plugins.fields)
        # of every failure's message as answered: Ray's "[Node <ip>] ", then who says it
        self.prefix = f"[Node {node or 'unknown'}] rtenv-agent: "
        self.python_version = python_version
        self._node_pythonpath = node_pythonpath
        self._clock = clock
        # Per string (see _String's invariant). The sum of refs over an env id's strings is at
        # most the service's count for the env (the gRPC door holds the rest); each env id has
        # at most MAX_STRINGS_PER_ENV strings (``_by_env``: exactly the strings whose env_id is
        # known); ``_held_bytes`` is the length of all strings, at most MAX_HELD_BYTES.
        self._strings: dict[str, _String] = {}
        self._by_env: dict[str, set[str]] = {}
        self._held_bytes = 0
        # env ids holding one uncounted reference each for Ray Client's server (client_server
        # creates), oldest first, until a counted create of the env takes over
        self._client_holds: OrderedDict[str, None] = OrderedDict()
        # Recent failures of strings not held
        self._failed = RecentFailures(_MAX_FAILED, _FAILED_BYTES)
        # env id -> its serialized context (a create's answer): built once, kept bounded
        self._answers: BoundedCache[str, str] = BoundedCache(_CONTEXTS_KEPT, _CONTEXT_BYTES)
        service.keep_held(self.refs_on)  # the gRPC door cannot drop what Ray holds

    # -- create ----------------------------------------------------------------------------
    async def get_or_create(
        self,
        serialized: str,
        *,
        setup_timeout_seconds: int = 0,
        job_id: bytes = b"",
        source_process: str = "",
        eager_install: bool = False,
    ) -> str:
        """One more count on ``serialized`` (none for ``client_server``), installing first
        what is missing; the env's serialized context (JSON). ``setup_timeout_seconds``: 0 =
        the agent's default, -1 = its max. ``job_id`` (Ray's job id, ASCII hex text as the
        raylet sends it) and ``eager_install`` are kept for the service's info. A failure
        raises, its count given back."""
        job = _job_text(job_id)
        if job or source_process:  # on this request's log lines from here on
            logfields.note(job_id=job, source_process=logfields.cut(source_process))
        if source_process == CLIENT_SERVER:
            return await self._uncounted(serialized, setup_timeout_seconds, job, eager_install)
        entry = self._strings.get(serialized)
        if entry is None:
            if self._held_bytes + len(serialized) > MAX_HELD_BYTES:
                raise RayStringsFull(
                    f"this agent already counts {self._held_bytes} bytes of runtime env strings "
                    f"from Ray; the limit is {MAX_HELD_BYTES} (delete some first)"
                )
            entry = self._strings[serialized] = _String()
            self._held_bytes += len(serialized)
        entry.count += 1  # at arrival, as Ray's agent counts: a delete may come before the end
        entry.in_flight += 1
        started = self._clock()
        try:
            env_id, answered = await self._take(
                serialized, setup_timeout_seconds, job, eager_install
            )
        except BaseException as exc:  # failed, a bug, or cancelled: its count given back
            await self._give_back(serialized, entry)
            if isinstance(exc, AgentError) and serialized not in self._strings:
                message = self._message(exc.message)
                self._failed.remember(serialized, message, self._elapsed_ms(started))
            raise
        # No await until the releases: the reference just taken is recorded in this step.
        entry.in_flight -= 1
        if entry.env_id is None:
            strings = self._by_env.setdefault(env_id, set())
            if len(strings) >= MAX_STRINGS_PER_ENV:
                entry.count = max(entry.refs, entry.count - 1)
                self._drop_if_idle(serialized, entry)
                await self._release(env_id, 1)
                raise InvalidArgument(
                    f"runtime env {env_id} is already counted under {len(strings)} different "
                    f"serialized strings; the limit is {MAX_STRINGS_PER_ENV} (Ray sends 2-3): "
                    "delete some, or send one of those strings"
                )
            strings.add(serialized)
            entry.env_id = env_id
            entry.creation_time_ms = self._elapsed_ms(started)
            self._failed.forget(serialized)
        entry.refs += 1
        excess = max(0, entry.refs - entry.count)  # deletes that arrived while this ran
        if excess:
            entry.refs -= excess
            self._drop_if_idle(serialized, entry)
        if env_id in self._client_holds:  # a counted create takes the client's hold over
            del self._client_holds[env_id]
            excess += 1
        if excess:
            await self._release(env_id, excess)
        return answered

    async def _uncounted(
        self, serialized: str, setup_timeout_seconds: int, job: str, eager_install: bool
    ) -> str:
        """A create that installs, counted by nobody (``client_server``): its reference is
        held until a counted create of the env takes over, unless a counted string or an
        earlier such create already holds the env (then it is given back at once)."""
        env_id, answered = await self._take(serialized, setup_timeout_seconds, job, eager_install)
        if self._plugins is not None and serialized not in self._strings:
            self._plugins.drop(serialized)  # nobody counts it: its plugin URIs are unused
        if env_id in self._client_holds or self.refs_on(env_id):
            await self._release(env_id, 1)
            return answered
        self._client_holds[env_id] = None
        if len(self._client_holds) > MAX_CLIENT_HOLDS:
            oldest, _ = self._client_holds.popitem(last=False)
            await self._release(oldest, 1)
        return answered

    async def _take(
        self, serialized: str, setup_timeout_seconds: int, job: str, eager_install: bool
    ) -> tuple[str, str]:
        """One service reference on the env and its serialized context; nothing taken when it
        raises (a context that cannot be built gives the reference back)."""
        service = self.service
        key = service.check_create(
            serialized,
            setup_timeout_seconds,
            job_id=job,
            eager_install=eager_install,
            dialect=RAY,
        )
        if service.create_hit(key):  # a hit: counted in this step, no coroutine
            env = key.env
        else:
            created = await service.create(
                serialized,
                setup_timeout_seconds,
                "",
                job_id=job,
                eager_install=eager_install,
                dialect=RAY,
            )
            env = created.env
            warn_ignored(env)  # as Ray's agent warns, on each setup
        env_id = env.env_id
        try:
            answered = self._answers.get(env_id)  # the same for every create of the env
            if answered is None:
                answered = self._context(env)
                if not env.derives_venv and not env.plugins:  # made per create: not kept
                    self._answers.put(env_id, answered, 2 * len(answered) + 200)
            if env.plugins and self._plugins is not None:
                answered = await self._plugins.context(
                    serialized, env.plugins, answered, setup_timeout_seconds
                )
            return env_id, answered
        except BaseException:
            await self._release(env_id, 1)
            raise

    async def _give_back(self, serialized: str, entry: _String) -> None:
        """A create that took no reference: its count back, as Ray's agent gives it back
        (never below 0); a reference held beyond the count that is left (a delete arrived
        while this create ran, and took the count of an earlier create) is released, so
        nothing stays held that Ray no longer counts. The release does not suspend (the
        service's delete has no await), so a cancelled create can give back too."""
        entry.in_flight -= 1
        entry.count = max(0, entry.count - 1)
        excess = entry.refs - entry.count
        env_id = entry.env_id
        if excess > 0:
            entry.refs -= excess
        self._drop_if_idle(serialized, entry)
        if excess > 0 and env_id is not None:
            await self._release(env_id, excess)

    def _context(self, env: RuntimeEnv) -> str:
        """The env's context as Ray's worker reads it (``build_ray_context``), serialized."""
        check_format(env, ContextFormat.RAY)
        service = self.service
        context = build_ray_context(
            env,
            service.store.path_for,
            py_executable=service.settings.py_executable,
            node_pythonpath=self._node_pythonpath,
            python_version=self.python_version,
            derived=service.contexts.derived(env),
        )
        return json.dumps(context)

    # -- delete ----------------------------------------------------------------------------
    async def delete(self, serialized: str, *, source_process: str = "") -> None:
        """Give back one count of ``serialized`` (and a service reference, if it holds more
        than the count left); raises, changing nothing, if the count is 0 or the service
        refuses."""
        if source_process == CLIENT_SERVER:
            return
        entry = self._strings.get(serialized)
        if entry is None or entry.count == 0:
            raise EnvNotFound(
                f"cannot delete runtime env {echo(serialized)}: it has no reference on this "
                "agent (never created here, or each create of this exact string was already "
                "deleted; references are counted per serialized string)"
            )
        if entry.refs == entry.count:  # one reference more than the count will be
            assert entry.env_id is not None, "a reference held with no env id"
            # In one step: the service's delete without a request id does not suspend. When it
            # refuses, it changed nothing; neither does this.
            self.service.delete_now(entry.env_id, "", holder=True)
            entry.refs -= 1
        entry.count -= 1
        self._drop_if_idle(serialized, entry)

    async def _release(self, env_id: str, n: int) -> None:
        """Give ``n`` references on ``env_id`` back to the service (already taken off the
        strings' ``refs``). The service holds them: a refusal is a bug, logged."""
        for _ in range(n):
            try:
                await self.service.delete(env_id, "", "", holder=True)
            except AgentError:
                log.exception(
                    "ray door: giving back a reference on %s failed (a bug)",
                    env_id,
                    extra={"env_id": env_id},
                )

    def _drop_if_idle(self, serialized: str, entry: _String) -> None:
        if entry.count or entry.in_flight:
            return
        assert entry.refs == 0, f"string {echo(serialized)} dropped holding {entry.refs}"
        del self._strings[serialized]
        if self._plugins is not None:
            self._plugins.drop(serialized)
        self._held_bytes -= len(serialized)
        if entry.env_id is not None:
            strings = self._by_env[entry.env_id]
            strings.discard(serialized)
            if not strings:
                del self._by_env[entry.env_id]

    # -- info ------------------------------------------------------------------------------
    def info(self, limit: int | None = None) -> RayInfo:
        """One state per string: the counted ones set up, then recent failures (newest
        first); at most ``limit`` (None: all), never more than the ``max_info_envs`` setting
        nor MAX_INFO_BYTES of strings and messages. ``total`` counts them all."""
        cap = self.service.settings.max_info_envs
        most = cap if limit is None or limit < 0 else min(limit, cap)
        states: list[RayEnvState] = []
        size = total = 0
        for text, entry in self._strings.items():
            if entry.env_id is None or entry.count == 0:
                continue
            total += 1
            if len(states) < most and size + len(text) <= MAX_INFO_BYTES:
                size += len(text)
                states.append(RayEnvState(text, entry.count, True, None, entry.creation_time_ms))
        for text, failed in self._failed.newest_first():
            total += 1
            weight = len(text) + len(failed.error)
            if len(states) < most and size + weight <= MAX_INFO_BYTES:
                size += weight
                states.append(RayEnvState(text, 0, False, failed.error, failed.creation_time_ms))
        return RayInfo(tuple(states), total)

    def refs_on(self, env_id: str) -> int:
        """The service references this front holds on ``env_id`` (asked by every delete at the
        gRPC door: an env the front does not know costs one lookup)."""
        held = 1 if env_id in self._client_holds else 0
        strings = self._by_env.get(env_id)
        if not strings:
            return held
        return held + sum(self._strings[text].refs for text in strings)

    def references(self) -> int:
        """This front's references on the service (its strings' refs and the client holds)."""
        return len(self._client_holds) + sum(entry.refs for entry in self._strings.values())

    def in_flight(self) -> int:
        """Creates not answered yet."""
        return sum(entry.in_flight for entry in self._strings.values())

    def check_invariants(self) -> None:
        per_env: dict[str, int] = {}
        known: dict[str, set[str]] = {}
        for text, entry in self._strings.items():
            shown = echo(text)
            assert 0 <= entry.refs <= entry.count, f"string {shown}: {entry}"
            assert entry.in_flight >= 0, f"string {shown}: {entry}"
            assert entry.count > 0 or entry.in_flight > 0, f"string {shown} kept idle"
            if entry.env_id is None:
                assert entry.refs == 0, f"string {shown} holds references on no env id"
                continue
            assert text not in self._failed, f"string {shown} set up and failed"
            per_env[entry.env_id] = per_env.get(entry.env_id, 0) + entry.refs
            known.setdefault(entry.env_id, set()).add(text)
        assert known == self._by_env, "strings by env id out of step"
        assert len(self._client_holds) <= MAX_CLIENT_HOLDS, "too many client holds"
        for env_id in self._client_holds:
            per_env[env_id] = per_env.get(env_id, 0) + 1
        for env_id, refs in per_env.items():
            held = self.service.tables.env_count(env_id)
            assert refs <= held, f"env {env_id}: {refs} references here, {held} in the service"
            assert len(known.get(env_id, ())) <= MAX_STRINGS_PER_ENV, f"env {env_id}: strings"
        held_bytes = sum(len(text) for text in self._strings)
        assert held_bytes == self._held_bytes, (
            f"strings weigh {held_bytes}, noted {self._held_bytes}"
        )
        assert held_bytes <= MAX_HELD_BYTES, f"strings weigh {held_bytes}"
        self._failed.check_invariants()

    # -- helpers ---------------------------------------------------------------------------
    def _message(self, message: str) -> str:
        return cap_message(self.prefix + message)

    def _elapsed_ms(self, started: float) -> int:
        return max(0, round((self._clock() - started) * 1000))


def _job_text(job_id: bytes) -> str:
    """Ray's job id as text: the raylet sends ASCII hex text; a byte that is not printable
    ASCII is shown as ``\\xNN``. At most MAX_JOB_ID_BYTES + 1 bytes are looked at: a longer id
    is still too long, and the service refuses it saying the limit."""
    head = job_id[: MAX_JOB_ID_BYTES + 1]
    if head.isascii() and head.decode("ascii").isprintable():
        return head.decode("ascii")
    return "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in head)
