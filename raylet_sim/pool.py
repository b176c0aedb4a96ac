"""The worker pool: counts runtime-env ids, never URIs.

Two maps, as a scheduler's pool keeps them:

    worker id -> Worker (its env key, process, state)
    env key   -> EnvSlot (count, runtime_env_id, context)

The env key is the serialized runtime env exactly as the task gave it; the pool never parses it.
The first start of a key calls CreateRuntimeEnv once (concurrent starts wait on that one call);
every worker start counts one on its key; every worker exit (reaped, whatever the cause) uncounts
one; when a key's count reaches 0 the pool calls DeleteRuntimeEnv. So the pool holds exactly one
agent reference per active key, however many workers share it.

Invariants (``check_invariants``):
  P0. a worker in the idle lists is IDLE: a worker being stopped (STOPPING) is taken out of them
      at once, so it is never handed out again.
  P1. a slot's count = its live workers + starts in flight; a slot at 0 is removed at once,
      or, with ``env_keepalive_s``, when its keep-alive expires unless a start reuses it first.
  P2. a slot with a runtime_env_id holds one agent reference; it is deleted exactly once, when
      the slot is removed, or, for a create that finishes after its slot was removed, then.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

import grpc

from raylet_sim.client import AgentClient
from raylet_sim.watch import ENV_VAR as WATCH_ENV_VAR
from rtenv.v1 import agent_pb2

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 30.0
# A worker may run on an env's own venv python, which does not have raylet_sim installed: the
# worker module (stdlib only) is found by appending its folder to sys.path, after the env's own.
_BOOTSTRAP = (
    f"import sys; sys.path.append({str(Path(__file__).resolve().parent.parent)!r}); "
    "from raylet_sim.worker import main; main()"
)
_STOP_GRACE_S = 3.0


class WorkerState(Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"  # asked to exit (stdin closed or signalled): never handed out again
    EXITED = "exited"


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


@dataclass(frozen=True)
class TaskSpec:
    env_key: str  # the serialized runtime env, as given
    call: str  # "module:function"
    args: tuple[Any, ...] = ()


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


@dataclass
class EnvSlot:
    count: int = 0  # live workers of this key plus starts in flight
    runtime_env_id: str = ""
    context: agent_pb2.RuntimeEnvContext | None = None
    creating: asyncio.Task[agent_pb2.RuntimeEnvContext] | None = None
    expiry: asyncio.TimerHandle | None = None  # at count 0, kept until this fires (keep-alive)


@dataclass
class PoolStats:
    workers_started: int = 0
    workers_exited: int = 0
    creates: int = 0
    deletes: int = 0
    create_latencies_s: list[float] = field(default_factory=list)


class WorkerPool:
    def __init__(
        self,
        client: AgentClient,
        *,
        idle_timeout_s: float = 5.0,
        worker_stderr: IO[bytes] | int | None = None,
        on_worker_exit: Callable[[Worker, int], None] | None = None,
        watch_interval_s: float | None = None,
        env_keepalive_s: float = 0.0,
    ) -> None:
        self._client = client
        self._idle_timeout_s = idle_timeout_s
        self._stderr = worker_stderr
        self._on_worker_exit = on_worker_exit
        self._watch_interval_s = watch_interval_s
        self._env_keepalive_s = env_keepalive_s  # 0: the last worker's exit deletes at once
        self.violations: list[str] = []  # files of a live worker's env that vanished or changed
        self.slots: dict[str, EnvSlot] = {}
        self.workers: dict[int, Worker] = {}
        self._idle: dict[str, list[Worker]] = {}
        self._reapers: set[asyncio.Task[None]] = set()
        self._deletes: set[asyncio.Task[None]] = set()
        self._creates: set[asyncio.Task[agent_pb2.RuntimeEnvContext]] = set()
        self._next_id = 0
        self._closing = False
        self._agent_gone = False
        self.stats = PoolStats()

    # -- tasks -----------------------------------------------------------------------------
    async def run(self, task: TaskSpec, *, task_id: str = "") -> Any:
        """Run one task on a worker of its env; reuse an idle one when there is one."""
        worker = await self.pop_worker(task.env_key)
        try:
            return await self._call(worker, task, task_id)
        except BaseException as exc:
            if not (isinstance(exc, TaskFailed) and exc.status == TASK_ERROR):
                # dying or dead (never to be handed out again while its exit is on the way),
                # or cancelled with its reply still to come (it must not answer the next task)
                self._terminate(worker)
            raise
        finally:
            self.push_worker(worker)  # back to idle, unless it is stopping or gone

    async def _call(self, worker: Worker, task: TaskSpec, task_id: str) -> Any:
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
        self.violations += reply.get("violations", [])
        if "ok" not in reply:  # EOF, or the last report a worker writes as it exits
            code = await proc.wait()
            raise TaskFailed(
                WORKER_DIED, f"worker {worker.pid} exited with {code} mid-task", pid=worker.pid
            )
        if not reply["ok"]:
            raise TaskFailed(TASK_ERROR, reply["error"])
        return reply["result"]

    # -- workers ---------------------------------------------------------------------------
    async def pop_worker(self, env_key: str) -> Worker:
        """A worker for this env: an idle one, or a new one (counting one on the key)."""
        if self._closing:
            raise TaskFailed(SPAWN_FAILED, "the pool is shutting down")
        idle = self._idle.get(env_key)
        while idle:
            worker = idle.pop()
            if worker.state is WorkerState.IDLE and worker.process.returncode is None:
                self._cancel_timer(worker)
                worker.state = WorkerState.BUSY
                worker.unread = False
                return worker
        slot = self.slots.setdefault(env_key, EnvSlot())
        if slot.expiry is not None:  # kept alive at count 0: reused, no create
            slot.expiry.cancel()
            slot.expiry = None
        slot.count += 1  # this start counts one; its worker's exit, or its failure, uncounts it
        try:
            context = await self._ensure_env(env_key, slot)
            process = await self._spawn(env_key, context)
        except BaseException:
            self._uncount(env_key, slot)
            raise
        worker = self._adopt(env_key, process)  # from here the worker's reaper owns the count
        await self._wait_ready(worker)
        worker.state = WorkerState.BUSY
        return worker

    def push_worker(self, worker: Worker) -> None:
        """Return a worker after a task: idle until reused or until its idle time runs out."""
        if worker.state is not WorkerState.BUSY or worker.process.returncode is not None:
            return  # it died meanwhile; its reaper uncounts it
        if self._closing:
            worker.unread = True  # its task is over: the reaper reads its last report
            self._terminate(worker)
            return
        worker.state = WorkerState.IDLE
        worker.unread = True
        self._idle.setdefault(worker.env_key, []).append(worker)
        worker.timer = asyncio.get_running_loop().call_later(
            self._idle_timeout_s, self._terminate, worker
        )

    async def _ensure_env(self, env_key: str, slot: EnvSlot) -> agent_pb2.RuntimeEnvContext:
        if slot.context is not None:
            return slot.context
        if slot.creating is None:
            slot.creating = asyncio.create_task(self._create(env_key, slot))
            self._creates.add(slot.creating)
            slot.creating.add_done_callback(self._creates.discard)
            slot.creating.add_done_callback(_retrieved)  # its waiters may all have gone
        return await asyncio.shield(slot.creating)

    async def _create(self, env_key: str, slot: EnvSlot) -> agent_pb2.RuntimeEnvContext:
        started = time.monotonic()
        try:
            reply = await self._client.create(env_key)
        except grpc.aio.AioRpcError as exc:
            slot.creating = None  # the next start of this key tries again
            raise TaskFailed(
                ENV_SETUP_FAILED, f"the agent answered {exc.code().name}: {exc.details()}"
            ) from exc
        self.stats.creates += 1
        self.stats.create_latencies_s.append(time.monotonic() - started)
        if self.slots.get(env_key) is not slot:
            # every start that wanted it went away meanwhile: give the reference back
            self._schedule_delete(reply.runtime_env_id)
        else:
            slot.runtime_env_id = reply.runtime_env_id
            slot.context = reply.context
        return reply.context

    async def _spawn(
        self, env_key: str, context: agent_pb2.RuntimeEnvContext
    ) -> asyncio.subprocess.Process:
        python = context.py_executable or sys.executable
        env = {**os.environ, **context.env_vars}
        if self._watch_interval_s is not None:
            env[WATCH_ENV_VAR] = str(self._watch_interval_s)
        try:
            return await asyncio.create_subprocess_exec(
                python, "-c", _BOOTSTRAP,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=self._stderr, cwd=context.cwd or None, env=env, start_new_session=True,
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

    def _adopt(self, env_key: str, process: asyncio.subprocess.Process) -> Worker:
        self._next_id += 1
        worker = Worker(self._next_id, env_key, process)
        self.workers[worker.worker_id] = worker
        self.stats.workers_started += 1
        reaper = asyncio.create_task(self._reap(worker), name=f"reap worker {worker.pid}")
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return worker

    async def _wait_ready(self, worker: Worker) -> None:
        stdout = worker.process.stdout
        assert stdout is not None
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                line = await stdout.readline()
        except TimeoutError:
            line = b""
        except BaseException:
            self._terminate(worker)
            raise
        if not line or not json.loads(line).get("ready"):
            self._terminate(worker)
            raise TaskFailed(
                WORKER_START_FAILED,
                f"worker {worker.pid} did not report ready within {_READY_TIMEOUT_S:g}s",
                pid=worker.pid,
            )

    async def _reap(self, worker: Worker) -> None:
        code = await worker.process.wait()
        if worker.unread and worker.process.stdout is not None:
            # nobody else reads an idle worker's stdout: its last report is there
            with contextlib.suppress(TimeoutError, ValueError):
                async with asyncio.timeout(5):
                    for line in (await worker.process.stdout.read()).splitlines():
                        self.violations += json.loads(line).get("violations", [])
        self._cancel_timer(worker)
        self._unidle(worker)
        worker.state = WorkerState.EXITED
        del self.workers[worker.worker_id]
        self.stats.workers_exited += 1
        if self._on_worker_exit is not None:
            self._on_worker_exit(worker, code)
        self._uncount(worker.env_key, self.slots[worker.env_key])

    def _uncount(self, env_key: str, slot: EnvSlot) -> None:
        slot.count -= 1
        if slot.count > 0:
            return
        if self._env_keepalive_s > 0 and slot.context is not None and not self._closing:
            # keep the env (and its agent reference) a while for the next start of this key
            slot.expiry = asyncio.get_running_loop().call_later(
                self._env_keepalive_s, self._expire, env_key, slot
            )
            return
        self._drop_slot(env_key, slot)

    def _expire(self, env_key: str, slot: EnvSlot) -> None:
        slot.expiry = None
        if self.slots.get(env_key) is slot and slot.count == 0:
            self._drop_slot(env_key, slot)

    def _drop_slot(self, env_key: str, slot: EnvSlot) -> None:
        del self.slots[env_key]
        self._idle.pop(env_key, None)
        if slot.runtime_env_id:
            self._schedule_delete(slot.runtime_env_id)
        # a create still in flight sees its slot gone and deletes what it created

    def abandon_agent(self) -> None:
        """The agent died: its references died with it, so nothing is deleted any more."""
        self._agent_gone = True

    def _schedule_delete(self, runtime_env_id: str) -> None:
        if self._agent_gone:
            return
        task = asyncio.create_task(self._delete(runtime_env_id), name=f"delete {runtime_env_id}")
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete(self, runtime_env_id: str) -> None:
        try:
            await self._client.delete(runtime_env_id)
            self.stats.deletes += 1
        except grpc.aio.AioRpcError as exc:
            log.error(
                "DeleteRuntimeEnv %s failed: %s %s", runtime_env_id, exc.code(), exc.details()
            )
        except grpc.aio.UsageError as exc:  # the node closed its channel: the agent is going too
            # after the agent's death its references died with it: nothing was lost
            level = logging.DEBUG if self._agent_gone else logging.WARNING
            log.log(level, "DeleteRuntimeEnv %s not sent: %s", runtime_env_id, exc)

    # -- stopping --------------------------------------------------------------------------
    def _terminate(self, worker: Worker, *, polite: bool = True) -> None:
        """Ask a worker to exit: close its stdin (it exits at EOF, after its last report), and
        SIGTERM its group if it is still there after a grace period (``polite``) or at once."""
        self._cancel_timer(worker)
        if worker.state is WorkerState.EXITED:
            return
        self._unidle(worker)  # before anything else: a pop must never find it again
        worker.state = WorkerState.STOPPING
        stdin = worker.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        if polite:
            worker.timer = asyncio.get_running_loop().call_later(
                _STOP_GRACE_S, _signal_group, worker, signal.SIGTERM
            )
        else:
            _signal_group(worker, signal.SIGTERM)

    def _unidle(self, worker: Worker) -> None:
        idle = self._idle.get(worker.env_key)
        if idle and worker in idle:
            idle.remove(worker)

    def _cancel_timer(self, worker: Worker) -> None:
        if worker.timer is not None:
            worker.timer.cancel()
            worker.timer = None

    async def kill_all(self, grace_s: float = _STOP_GRACE_S, *, polite: bool = False) -> None:
        """Stop every worker: SIGTERM its process group (or, ``polite``, first close its stdin
        and wait for it to exit), wait up to ``grace_s`` more, then SIGKILL what is left."""
        self._closing = True
        for worker in list(self.workers.values()):
            self._terminate(worker, polite=polite)
        if self._reapers:
            timeout = 2 * grace_s if polite else grace_s
            _, pending = await asyncio.wait(set(self._reapers), timeout=timeout)
            for worker in list(self.workers.values()):
                _signal_group(worker, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending, timeout=grace_s)

    async def close(self) -> None:
        """Stop every worker and give every env reference back to the agent."""
        await self.kill_all(polite=True)
        if self._reapers:  # SIGKILLed: reaped at once; their exits schedule the last deletes
            await asyncio.wait(set(self._reapers), timeout=10)
        for key, slot in list(self.slots.items()):  # envs kept alive: given back now
            if slot.count == 0 and slot.expiry is not None:
                slot.expiry.cancel()
                self._expire(key, slot)
        await self.quiesce()  # creates still in flight end in deletes too

    async def quiesce(self, max_rounds: int = 100) -> None:
        """Wait until no create or delete is in flight (a create may end in a delete)."""
        for _ in range(max_rounds):
            pending: set[asyncio.Future[Any]] = {*self._creates, *self._deletes}
            if not pending:
                return
            await asyncio.wait(pending)
        raise RuntimeError(f"creates and deletes still in flight after {max_rounds} rounds")

    def active_keys_by_env(self) -> dict[str, int]:
        """runtime_env_id -> the pool's active keys holding it: the agent's count must match."""
        counts: dict[str, int] = {}
        for slot in self.slots.values():
            if slot.runtime_env_id:
                counts[slot.runtime_env_id] = counts.get(slot.runtime_env_id, 0) + 1
        return counts

    def check_invariants(self) -> None:
        for key, idle in self._idle.items():
            for worker in idle:
                assert worker.state is WorkerState.IDLE, (
                    f"P0: worker {worker.pid} of {key!r} is {worker.state.value} in the idle list"
                )
                assert self.workers.get(worker.worker_id) is worker, (
                    f"P0: worker {worker.pid} of {key!r} is idle but not in the pool's table"
                )
        live: dict[str, int] = {}
        for worker in self.workers.values():
            live[worker.env_key] = live.get(worker.env_key, 0) + 1
        for key, slot in self.slots.items():
            kept = slot.count == 0 and slot.expiry is not None
            assert slot.count >= 1 or kept, f"P1: slot {key!r} kept at count {slot.count}"
            assert slot.count >= live.get(key, 0), f"P1: slot {key!r} under its live workers"
        assert set(live) <= set(self.slots), "P1: a live worker's key has no slot"


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _signal_group(worker: Worker, sig: signal.Signals) -> None:
    if worker.process.returncode is not None:
        return  # reaped: its pid may belong to someone else now
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, sig)


def environ_bytes(env: dict[str, str]) -> int:
    """Bytes an environment takes in execve: each "KEY=value\\0" and its pointer."""
    return sum(len(k.encode()) + len(v.encode()) + 2 + 8 for k, v in env.items())
