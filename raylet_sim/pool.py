"""The worker pool: worker processes over env slots; it counts runtime-env ids, never URIs.

Two maps, as a scheduler's pool keeps them:

    worker id -> Worker (its env key, process, state)         here
    env key   -> EnvSlot (count, runtime_env_id, context)     ``raylet_sim.slots``

A worker start counts one on its key's slot (``EnvSlots.acquire``), gets the key's context
(created once by the slots), spawns a process with it (``raylet_sim.workers``) and waits for its
ready line; from then on the worker's reaper owns the count, and uncounts it at the worker's exit
(reaped, whatever the cause). A worker back from a task idles until reused or until its idle time
runs out; with ``max_idle_workers``, one more idle worker than that stops the one idle longest
(Ray's raylet likewise stops idle workers beyond its soft limit), so that the pool's processes
are bounded by the tasks at once plus that many, however many envs the tasks use. Jobs
(``start_job``, ``finish_job``) are the slots' business: an eager job's env is ready before its
first worker.

Invariants (``check_invariants``):
  P0. a worker in the idle lists is IDLE: a worker being stopped (STOPPING) is taken out of them
      at once, so it is never handed out again.
  P1, P2 are the slots' (``raylet_sim.slots``), checked here against the pool's holders of each
      key: its live workers and its starts in flight (``_starting``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from raylet_sim import workers
from raylet_sim.slots import EnvAgent, EnvSlot, EnvSlots, SlotStats
from raylet_sim.tasks import (
    ARGUMENT_LIST_TOO_LONG,
    ENV_SETUP_FAILED,
    SPAWN_FAILED,
    TASK_ERROR,
    WORKER_DIED,
    WORKER_START_FAILED,
    TaskFailed,
    TaskSpec,
)
from raylet_sim.workers import Worker, WorkerState, environ_bytes

__all__ = [  # the pool's API, as its callers import it
    "ARGUMENT_LIST_TOO_LONG",
    "ENV_SETUP_FAILED",
    "SPAWN_FAILED",
    "TASK_ERROR",
    "WORKER_DIED",
    "WORKER_START_FAILED",
    "EnvSlot",
    "PoolStats",
    "TaskFailed",
    "TaskSpec",
    "Worker",
    "WorkerPool",
    "WorkerState",
    "environ_bytes",
]

_STOP_GRACE_S = 3.0


@dataclass
class PoolStats(SlotStats):  # creates, deletes and their latencies are the slots'
    workers_started: int = 0
    workers_exited: int = 0


class WorkerPool:
    def __init__(
        self,
        client: EnvAgent,
        *,
        idle_timeout_s: float = 5.0,
        worker_stderr: IO[bytes] | int | None = None,
        on_worker_exit: Callable[[Worker, int], None] | None = None,
        watch_interval_s: float | None = None,
        env_keepalive_s: float = 0.0,
        max_idle_workers: int | None = None,
    ) -> None:
        self._idle_timeout_s = idle_timeout_s
        self._max_idle = max_idle_workers  # None: no limit
        self._stderr = worker_stderr
        self._on_worker_exit = on_worker_exit
        self._watch_interval_s = watch_interval_s
        self.stats = PoolStats()
        # 0 keep-alive: the last worker's exit deletes its env at once
        self.env_slots = EnvSlots(client, keepalive_s=env_keepalive_s, stats=self.stats)
        self.violations: list[str] = []  # files of a live worker's env that vanished or changed
        self.workers: dict[int, Worker] = {}
        # P0: only IDLE workers, each in self.workers; a worker being stopped leaves at once
        self._idle: dict[str, list[Worker]] = {}
        self._idle_since: dict[int, Worker] = {}  # the same workers, idle longest first
        self._starting: dict[str, int] = {}  # env key -> starts counted but not yet adopted
        self._reapers: set[asyncio.Task[None]] = set()
        self._next_id = 0
        self._closing = False

    @property
    def slots(self) -> dict[str, EnvSlot]:
        """env key -> its slot (the slots' table, read-only by convention)."""
        return self.env_slots.slots

    # -- tasks -----------------------------------------------------------------------------
    async def run(self, task: TaskSpec, *, task_id: str = "") -> Any:
        """Run one task on a worker of its env; reuse an idle one when there is one."""
        worker = await self.pop_worker(task.env_key, job_id=task.job_id)
        try:
            return await workers.call(worker, task, task_id, self.violations)
        except BaseException as exc:
            if not (isinstance(exc, TaskFailed) and exc.status == TASK_ERROR):
                # dying or dead (never to be handed out again while its exit is on the way),
                # or cancelled with its reply still to come (it must not answer the next task)
                self._terminate(worker)
            raise
        finally:
            self.push_worker(worker)  # back to idle, unless it is stopping or gone

    # -- jobs ------------------------------------------------------------------------------
    async def start_job(self, job_id: str, serialized_env: str, eager_install: bool = True) -> None:
        """A job starts; with ``eager_install`` its env is created now and held until
        ``finish_job`` (see ``EnvSlots.start_job``)."""
        if self._closing:
            raise TaskFailed(ENV_SETUP_FAILED, f"job {job_id!r}: the pool is shutting down")
        await self.env_slots.start_job(job_id, serialized_env, eager_install=eager_install)

    def finish_job(self, job_id: str) -> None:
        """A job ends: its hold on its env (if eager) is released; its workers keep theirs."""
        self.env_slots.finish_job(job_id)

    # -- workers ---------------------------------------------------------------------------
    async def pop_worker(self, env_key: str, *, job_id: str = "") -> Worker:
        """A worker for this env: an idle one, or a new one (counting one on the key)."""
        if self._closing:
            raise TaskFailed(SPAWN_FAILED, "the pool is shutting down")
        idle = self._idle.get(env_key)
        while idle:
            worker = idle.pop()
            self._idle_since.pop(worker.worker_id, None)
            if worker.state is WorkerState.IDLE and worker.process.returncode is None:
                self._cancel_timer(worker)
                worker.state = WorkerState.BUSY
                worker.unread = False
                return worker
        self.env_slots.acquire(env_key)  # this start counts one; its worker's exit uncounts it
        self._starting[env_key] = self._starting.get(env_key, 0) + 1
        try:
            context = await self.env_slots.ensure(env_key, job_id=job_id)
            process = await workers.spawn(
                context, stderr=self._stderr, watch_interval_s=self._watch_interval_s
            )
        except BaseException:
            self._started(env_key)
            self.env_slots.release(env_key)
            raise
        self._started(env_key)
        worker = self._adopt(env_key, process)  # from here the worker's reaper owns the count
        try:
            await workers.wait_ready(worker)
        except TaskFailed as exc:
            self._terminate(worker)
            if self._closing:  # close() ended it before its ready line: say why it ended
                raise TaskFailed(SPAWN_FAILED, "the pool is shutting down") from exc
            raise
        except BaseException:
            self._terminate(worker)
            raise
        if self._closing or worker.state is WorkerState.STOPPING:  # the pool closed meanwhile
            self._terminate(worker)
            raise TaskFailed(SPAWN_FAILED, "the pool is shutting down")
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
        self._idle_since[worker.worker_id] = worker
        worker.timer = asyncio.get_running_loop().call_later(
            self._idle_timeout_s, self._terminate, worker
        )
        if self._max_idle is not None and len(self._idle_since) > self._max_idle:
            self._terminate(next(iter(self._idle_since.values())))

    def _started(self, env_key: str) -> None:
        left = self._starting[env_key] - 1
        if left:
            self._starting[env_key] = left
        else:
            del self._starting[env_key]

    def _adopt(self, env_key: str, process: asyncio.subprocess.Process) -> Worker:
        self._next_id += 1
        worker = Worker(self._next_id, env_key, process)
        self.workers[worker.worker_id] = worker
        self.stats.workers_started += 1
        reaper = asyncio.create_task(self._reap(worker), name=f"reap worker {worker.pid}")
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return worker

    async def _reap(self, worker: Worker) -> None:
        code = await worker.process.wait()
        await workers.read_last_report(worker, self.violations)
        self._cancel_timer(worker)
        self._unidle(worker)
        worker.state = WorkerState.EXITED
        del self.workers[worker.worker_id]
        self.stats.workers_exited += 1
        if self._on_worker_exit is not None:
            self._on_worker_exit(worker, code)
        self.env_slots.release(worker.env_key)

    def abandon_agent(self) -> None:
        """The agent died: its references died with it, so nothing is deleted any more."""
        self.env_slots.abandon_agent()

    # -- stopping --------------------------------------------------------------------------
    def _terminate(self, worker: Worker, *, polite: bool = True) -> None:
        """Ask a worker to exit: close its stdin (it exits at EOF, after its last report), and
        SIGTERM its group if it is still there after a grace period (``polite``) or at once."""
        self._cancel_timer(worker)
        if worker.state is WorkerState.EXITED:
            return
        self._unidle(worker)  # before anything else: a pop must never find it again (P0)
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
        self._idle_since.pop(worker.worker_id, None)
        idle = self._idle.get(worker.env_key)
        if idle and worker in idle:
            idle.remove(worker)
        if not idle:
            self._idle.pop(worker.env_key, None)

    def _cancel_timer(self, worker: Worker) -> None:
        if worker.timer is not None:
            worker.timer.cancel()
            worker.timer = None

    async def kill_all(self, grace_s: float = _STOP_GRACE_S, *, polite: bool = False) -> None:
        """Stop every worker: SIGTERM its process group (or, ``polite``, first close its stdin
        and wait for it to exit), wait up to ``grace_s`` more, then SIGKILL what is left."""
        self._closing = True
        self.env_slots.stop_keeping()
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
        """Stop every worker, finish every job and give every env reference back to the agent."""
        await self.kill_all(polite=True)
        if self._reapers:  # SIGKILLed: reaped at once; their exits schedule the last deletes
            await asyncio.wait(set(self._reapers), timeout=10)
        self.env_slots.give_back()  # jobs' holds and envs kept alive: given back now
        await self.quiesce()  # creates still in flight end in deletes too

    async def quiesce(self, max_rounds: int = 100) -> None:
        """Wait until no create or delete is in flight (a create may end in a delete)."""
        await self.env_slots.quiesce(max_rounds)

    def active_keys_by_env(self) -> dict[str, int]:
        """runtime_env_id -> the pool's active keys holding it: the agent's count must match."""
        return self.env_slots.active_keys_by_env()

    def check_invariants(self) -> None:
        for key, idle in self._idle.items():
            for worker in idle:
                assert worker.state is WorkerState.IDLE, (
                    f"P0: worker {worker.pid} of {key!r} is {worker.state.value} in the idle list"
                )
                assert self.workers.get(worker.worker_id) is worker, (
                    f"P0: worker {worker.pid} of {key!r} is idle but not in the pool's table"
                )
        assert set(self._idle_since) == {
            w.worker_id for idle in self._idle.values() for w in idle
        }, "P0: the idle workers by age are not those in the idle lists"
        holders = dict(self._starting)
        for worker in self.workers.values():
            holders[worker.env_key] = holders.get(worker.env_key, 0) + 1
        self.env_slots.check_invariants(holders)


def _signal_group(worker: Worker, sig: signal.Signals) -> None:
    if worker.process.returncode is not None:
        return  # reaped: its pid may belong to someone else now
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, sig)
