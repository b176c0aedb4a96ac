"""Ray 2.60's request semantics over the service: what the Ray door answers, as plain values.

Ray's raylet counts references per *serialized string*, as it sends it: the same env arrives
with different spacing (a job's env and a task's env serialised by different code), and each
string is deleted by itself. So this front keeps a count per string (``_held``), and each count
is one reference on the service (one env id, shared with the gRPC door: the service's count is
the sum of both doors' references). A delete of a string this front holds no count for is
FAILED and changes nothing. ``source_process == "client_server"`` (Ray Client's server, which
never deletes) installs but is not counted: its create gives its reference back at once, its
delete does nothing.

Failures are replies, not exceptions: status FAILED with this agent's message, prefixed with
which agent and node answered (Ray shows it to the user in ``RuntimeEnvSetupError``). An
unexpected exception is a bug: logged with its traceback, answered FAILED saying so.

Info lists one state per string: each held string (its count, success, the time its first
create took), then the recent failures of strings not held (bounded in number and bytes).
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

from agent.app.service import AgentService
from agent.core.bounded import BoundedCache
from agent.core.errors import AgentError, ErrorKind, cap_message, echo
from agent.core.ray_context import build_ray_context

log = logging.getLogger(__name__)

CLIENT_SERVER = "client_server"  # Ray's source_process that is never counted
_MAX_FAILED = 100  # recent failures kept for info, per string
_FAILED_BYTES = 4 * 1024 * 1024  # their strings and messages
_CONTEXTS_KEPT = 4096  # serialized contexts remembered by env id
_CONTEXT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RayReply:
    """A create's or a delete's answer: ``ok``, else ``error`` (this agent's message)."""

    ok: bool
    error: str = ""
    context: str = ""  # a create's serialized RuntimeEnvContext (JSON)
    kind: ErrorKind | None = None  # a failure's kind; None when ok, or for a bug


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
class _Held:
    count: int  # >= 1: this front's references on the service for this string
    creation_time_ms: int


@dataclass(frozen=True, slots=True)
class _Failed:
    error: str
    creation_time_ms: int

    def weight(self, serialized: str) -> int:
        return len(serialized) + len(self.error) + 200


class RayFront:
    def __init__(
        self,
        service: AgentService,
        *,
        node: str = "",
        node_pythonpath: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.service = service
        self.prefix = f"[rtenv-agent on node {node}] " if node else "[rtenv-agent] "
        self._node_pythonpath = node_pythonpath
        self._clock = clock
        # Invariant: every count >= 1; their sum is this front's references on the service.
        self._held: dict[str, _Held] = {}
        # Recent failures of strings not held, oldest first: at most _MAX_FAILED entries and
        # _FAILED_BYTES of their weight (``_failed_bytes``).
        self._failed: OrderedDict[str, _Failed] = OrderedDict()
        self._failed_bytes = 0
        self._contexts: BoundedCache[str, str] = BoundedCache(_CONTEXTS_KEPT, _CONTEXT_BYTES)

    # -- create ----------------------------------------------------------------------------
    async def get_or_create(
        self,
        serialized: str,
        *,
        setup_timeout_seconds: int = 0,
        job_id: bytes = b"",
        source_process: str = "",
        eager_install: bool = False,
    ) -> RayReply:
        """One more count on ``serialized`` (none for ``client_server``), installing first
        what is missing. ``setup_timeout_seconds``: 0 = the agent's default, -1 = its max.
        ``job_id`` (Ray's binary job id) and ``eager_install`` are kept for the service's info,
        the job id as hex."""
        started = self._clock()
        try:
            created = await self.service.create(
                serialized,
                setup_timeout_seconds,
                "",
                job_id=job_id.hex(),
                eager_install=eager_install,
            )
        except AgentError as exc:
            elapsed = self._elapsed_ms(started)
            if source_process != CLIENT_SERVER and serialized not in self._held:
                self._remember_failure(serialized, exc.message, elapsed)
            return RayReply(False, self._message(exc.message), kind=exc.kind)
        except Exception:
            log.exception("ray door: create failed unexpectedly")
            return RayReply(False, self._message("internal error in the agent (see its log)"))
        # No await from here on: the service holds the reference just taken, so the record
        # is there; the count is taken (or, for client_server, given back) in this same step.
        context = self._context(created.env_id)
        if source_process == CLIENT_SERVER:
            await self.service.delete(created.env_id, "", "")
            return RayReply(True, context=context)
        held = self._held.get(serialized)
        if held is None:
            self._held[serialized] = _Held(1, self._elapsed_ms(started))
            self._forget_failure(serialized)
        else:
            held.count += 1
        return RayReply(True, context=context)

    def _context(self, env_id: str) -> str:
        context = self._contexts.get(env_id)
        if context is None:
            env = self.service.records[env_id].env
            settings = self.service.settings
            context = json.dumps(
                build_ray_context(
                    env, self.service.store.path_for, py_executable=settings.py_executable,
                    node_pythonpath=self._node_pythonpath,
                    python_version=(sys.version_info.major, sys.version_info.minor),
                )
            )  # fmt: skip
            self._contexts.put(env_id, context, 2 * len(context) + 100)
        return context

    # -- delete ----------------------------------------------------------------------------
    async def delete(self, serialized: str, *, source_process: str = "") -> RayReply:
        """Give back one count of ``serialized``; FAILED, changing nothing, if none is held."""
        if source_process == CLIENT_SERVER:
            return RayReply(True)
        held = self._held.get(serialized)
        if held is None:
            return RayReply(
                False,
                self._message(
                    f"cannot delete runtime env {echo(serialized)}: it has no reference on this "
                    "agent (never created here, or each create of this exact string was already "
                    "deleted; references are counted per serialized string)"
                ),
                kind=ErrorKind.NOT_FOUND,
            )
        held.count -= 1
        if held.count == 0:
            del self._held[serialized]
        try:
            await self.service.delete("", serialized, "")
        except BaseException:
            # The service changed nothing: the count is given back as it was.
            restored = self._held.setdefault(serialized, _Held(0, held.creation_time_ms))
            restored.count += 1
            raise
        return RayReply(True)

    # -- info ------------------------------------------------------------------------------
    def info(self, limit: int | None = None) -> RayInfo:
        """One state per string: the held ones, then recent failures (newest first); at most
        ``limit`` (None: all), never more than the ``max_info_envs`` setting."""
        cap = self.service.settings.max_info_envs
        most = cap if limit is None or limit < 0 else min(limit, cap)
        states: list[RayEnvState] = []
        for text, held in self._held.items():
            if len(states) >= most:
                break
            states.append(RayEnvState(text, held.count, True, None, held.creation_time_ms))
        for text, failed in reversed(self._failed.items()):
            if len(states) >= most:
                break
            states.append(RayEnvState(text, 0, False, failed.error, failed.creation_time_ms))
        return RayInfo(tuple(states), len(self._held) + len(self._failed))

    def references(self) -> int:
        """This front's references on the service (the sum of its counts)."""
        return sum(held.count for held in self._held.values())

    def check_invariants(self) -> None:
        for text, held in self._held.items():
            assert held.count >= 1, f"string {echo(text)} held with count {held.count}"
            assert text not in self._failed, f"string {echo(text)} held and failed"
        weight = sum(f.weight(t) for t, f in self._failed.items())
        assert weight == self._failed_bytes, f"failures weigh {weight}, noted {self._failed_bytes}"
        assert len(self._failed) <= _MAX_FAILED, f"{len(self._failed)} failures kept"
        assert weight <= _FAILED_BYTES, f"failures weigh {weight}"

    # -- helpers ---------------------------------------------------------------------------
    def _message(self, message: str) -> str:
        return cap_message(self.prefix + message)

    def _elapsed_ms(self, started: float) -> int:
        return max(0, round((self._clock() - started) * 1000))

    def _remember_failure(self, serialized: str, error: str, elapsed_ms: int) -> None:
        self._forget_failure(serialized)
        failed = _Failed(self._message(error), elapsed_ms)
        weight = failed.weight(serialized)
        if weight > _FAILED_BYTES:
            return
        self._failed[serialized] = failed
        self._failed_bytes += weight
        while len(self._failed) > _MAX_FAILED or self._failed_bytes > _FAILED_BYTES:
            text, dropped = self._failed.popitem(last=False)
            self._failed_bytes -= dropped.weight(text)

    def _forget_failure(self, serialized: str) -> None:
        failed = self._failed.pop(serialized, None)
        if failed is not None:
            self._failed_bytes -= failed.weight(serialized)
