"""Env slots: the pool's count of each runtime env in use, and the one agent reference it holds.

    env key -> EnvSlot (count, runtime_env_id, context, keep-alive, jobs holding it)

The env key is the serialized runtime env exactly as the task (or the job) gave it; nothing here
parses it. The counting is synchronous: ``acquire`` counts one on a key, ``release`` uncounts one,
and a key whose count reaches 0 is given back (at once, or after ``keepalive_s``). The agent is
called through an injected ``EnvAgent`` (the pool's ``AgentClient``, or a fake in unit tests):
the first holder of a key that needs its context calls CreateRuntimeEnv once (``ensure``;
concurrent callers wait on that one call), and a slot given back calls DeleteRuntimeEnv once. So
the pool holds exactly one agent reference per active key, however many holders share it.

Jobs (Ray's ``eager_install``): ``start_job`` with eager install counts one on the job's key and
creates its env at once, so the job's workers find it ready; the job holds that count until
``finish_job``. Without eager install a job only names its env: nothing happens before its first
worker.

Invariants (``check_invariants``, given the pool's holders of each key):
  P1. a slot's count = its holders (live workers and starts in flight, counted by the pool) + the
      jobs holding it; a slot at 0 is removed at once, or, with ``keepalive_s``, when its
      keep-alive expires unless an acquire reuses it first.
  P2. a slot with a runtime_env_id holds one agent reference; it is deleted exactly once, when
      the slot is removed, or, for a create that finishes after its slot was removed, then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from raylet_sim.tasks import ENV_SETUP_FAILED, TaskFailed
from rtenv.v1 import agent_pb2

log = logging.getLogger(__name__)


class EnvAgent(Protocol):
    """The two calls the slots make (``raylet_sim.client.AgentClient`` has them)."""

    async def create(
        self, serialized_env: str, job_id: str = "", *, eager_install: bool = False
    ) -> agent_pb2.CreateRuntimeEnvReply: ...

    async def delete(self, runtime_env_id: str) -> int: ...


@dataclass
class EnvSlot:
    count: int = 0  # its holders: live workers, starts in flight, jobs (P1)
    runtime_env_id: str = ""  # set once created: the slot then holds one agent reference (P2)
    context: agent_pb2.RuntimeEnvContext | None = None
    creating: asyncio.Task[agent_pb2.RuntimeEnvContext] | None = None
    expiry: asyncio.TimerHandle | None = None  # at count 0, kept until this fires (keep-alive)
    jobs: set[str] = field(default_factory=set)  # jobs holding one count each (eager install)


@dataclass(frozen=True)
class Job:
    job_id: str
    env_key: str
    eager_install: bool  # True: the job holds one count on its key's slot until it finishes


@dataclass
class SlotStats:
    creates: int = 0
    deletes: int = 0
    create_latencies_s: list[float] = field(default_factory=list)


class EnvSlots:
    def __init__(
        self, agent: EnvAgent, *, keepalive_s: float = 0.0, stats: SlotStats | None = None
    ) -> None:
        self._agent = agent
        self._keepalive_s = keepalive_s  # 0: a slot at count 0 is given back at once
        self.stats = stats if stats is not None else SlotStats()
        self.slots: dict[str, EnvSlot] = {}
        self.jobs: dict[str, Job] = {}
        self._creates: set[asyncio.Task[agent_pb2.RuntimeEnvContext]] = set()
        self._deletes: set[asyncio.Task[None]] = set()
        self._closing = False  # no keep-alive any more: a slot at 0 is given back at once
        self._agent_gone = False  # the agent died: its references died with it

    # -- counting (synchronous) ------------------------------------------------------------
    def acquire(self, env_key: str) -> EnvSlot:
        """Count one holder on a key; a slot kept alive at 0 is reused (no create)."""
        slot = self.slots.setdefault(env_key, EnvSlot())
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None
        slot.count += 1
        return slot

    def release(self, env_key: str) -> None:
        """Uncount one holder; at 0 the slot is kept alive a while, or given back at once."""
        slot = self.slots[env_key]
        slot.count -= 1
        if slot.count > 0:
            return
        if self._keepalive_s > 0 and slot.context is not None and not self._closing:
            slot.expiry = asyncio.get_running_loop().call_later(
                self._keepalive_s, self._expire, env_key, slot
            )
            return
        self._drop(env_key, slot)

    def _expire(self, env_key: str, slot: EnvSlot) -> None:
        slot.expiry = None
        if self.slots.get(env_key) is slot and slot.count == 0:
            self._drop(env_key, slot)

    def _drop(self, env_key: str, slot: EnvSlot) -> None:
        del self.slots[env_key]
        if slot.runtime_env_id:
            self._schedule_delete(slot.runtime_env_id)
        # a create still in flight sees its slot gone and deletes what it created

    # -- the agent -------------------------------------------------------------------------
    async def ensure(
        self, env_key: str, *, job_id: str = "", eager_install: bool = False
    ) -> agent_pb2.RuntimeEnvContext:
        """The context of a key the caller holds a count on: created once, on the first call
        (``job_id`` and ``eager_install`` go with that create); later calls wait for it."""
        slot = self.slots[env_key]
        if slot.context is not None:
            return slot.context
        if slot.creating is None:
            slot.creating = asyncio.create_task(
                self._create(env_key, slot, job_id, eager_install), name=f"create {env_key[:40]}"
            )
            self._creates.add(slot.creating)
            slot.creating.add_done_callback(self._creates.discard)
            slot.creating.add_done_callback(_retrieved)  # its waiters may all have gone
        return await asyncio.shield(slot.creating)

    async def _create(
        self, env_key: str, slot: EnvSlot, job_id: str, eager_install: bool
    ) -> agent_pb2.RuntimeEnvContext:
        started = time.monotonic()
        try:
            reply = await self._agent.create(env_key, job_id, eager_install=eager_install)
        except grpc.aio.AioRpcError as exc:
            slot.creating = None  # the next holder of this key tries again
            raise TaskFailed(
                ENV_SETUP_FAILED, f"the agent answered {exc.code().name}: {exc.details()}"
            ) from exc
        self.stats.creates += 1
        self.stats.create_latencies_s.append(time.monotonic() - started)
        if self.slots.get(env_key) is not slot:
            # every holder that wanted it went away meanwhile: give the reference back (P2)
            self._schedule_delete(reply.runtime_env_id)
        else:
            slot.runtime_env_id = reply.runtime_env_id
            slot.context = reply.context
        return reply.context

    def _schedule_delete(self, runtime_env_id: str) -> None:
        if self._agent_gone:
            return
        task = asyncio.create_task(self._delete(runtime_env_id), name=f"delete {runtime_env_id}")
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete(self, runtime_env_id: str) -> None:
        try:
            await self._agent.delete(runtime_env_id)
            self.stats.deletes += 1
        except grpc.aio.AioRpcError as exc:
            log.error(
                "DeleteRuntimeEnv %s failed: %s %s", runtime_env_id, exc.code(), exc.details()
            )
        except grpc.aio.UsageError as exc:  # the node closed its channel: the agent is going too
            # after the agent's death its references died with it: nothing was lost
            level = logging.DEBUG if self._agent_gone else logging.WARNING
            log.log(level, "DeleteRuntimeEnv %s not sent: %s", runtime_env_id, exc)

    def abandon_agent(self) -> None:
        """The agent died: its references died with it, so nothing is deleted any more."""
        self._agent_gone = True

    # -- jobs ------------------------------------------------------------------------------
    async def start_job(
        self, job_id: str, serialized_env: str, *, eager_install: bool = True
    ) -> None:
        """Register a job. With ``eager_install`` its env is created now (the create carries
        the job id and ``config.eager_install``) and the job holds one count on it until
        ``finish_job``; a create that fails raises ``TaskFailed`` and the job is not started."""
        if job_id in self.jobs:
            raise ValueError(f"job {job_id!r} is already started; finish it first")
        if self._closing:
            raise TaskFailed(ENV_SETUP_FAILED, f"job {job_id!r}: the pool is shutting down")
        job = Job(job_id, serialized_env, eager_install)
        if not eager_install:
            self.jobs[job_id] = job
            return
        slot = self.acquire(serialized_env)
        slot.jobs.add(job_id)
        self.jobs[job_id] = job  # registered before the wait: finish_job may come meanwhile
        try:
            await self.ensure(serialized_env, job_id=job_id, eager_install=True)
        except BaseException:
            if self.jobs.get(job_id) is job:
                self.finish_job(job_id)
            raise

    def finish_job(self, job_id: str) -> None:
        """The job is over: its count on its env's slot (if eager) is released."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            raise ValueError(f"no job {job_id!r} is running (started: {sorted(self.jobs)})")
        if job.eager_install:
            self.slots[job.env_key].jobs.discard(job_id)
            self.release(job.env_key)

    # -- closing ---------------------------------------------------------------------------
    def stop_keeping(self) -> None:
        """From now on a slot at count 0 is given back at once (the pool is closing)."""
        self._closing = True

    def give_back(self) -> None:
        """Finish every job and give back every slot kept alive at count 0."""
        self._closing = True
        for job_id in list(self.jobs):
            self.finish_job(job_id)
        for key, slot in list(self.slots.items()):
            if slot.count == 0 and slot.expiry is not None:
                slot.expiry.cancel()
                self._expire(key, slot)

    async def quiesce(self, max_rounds: int = 100) -> None:
        """Wait until no create or delete is in flight (a create may end in a delete)."""
        for _ in range(max_rounds):
            pending: set[asyncio.Future[Any]] = {*self._creates, *self._deletes}
            if not pending:
                return
            await asyncio.wait(pending)
        raise RuntimeError(f"creates and deletes still in flight after {max_rounds} rounds")

    def active_keys_by_env(self) -> dict[str, int]:
        """runtime_env_id -> the active keys holding it: the agent's count must match."""
        counts: dict[str, int] = {}
        for slot in self.slots.values():
            if slot.runtime_env_id:
                counts[slot.runtime_env_id] = counts.get(slot.runtime_env_id, 0) + 1
        return counts

    def check_invariants(self, holders: Mapping[str, int]) -> None:
        """P1 against the pool's holders of each key (live workers + starts in flight)."""
        for key, slot in self.slots.items():
            kept = slot.count == 0 and slot.expiry is not None
            assert slot.count >= 1 or kept, f"P1: slot {key!r} kept at count {slot.count}"
            expected = holders.get(key, 0) + len(slot.jobs)
            assert slot.count == expected, (
                f"P1: slot {key!r} counts {slot.count}, but has {holders.get(key, 0)} "
                f"worker(s) or start(s) and {len(slot.jobs)} job(s)"
            )
        assert {k for k, n in holders.items() if n} <= set(self.slots), (
            "P1: a live worker's key has no slot"
        )
        for job in self.jobs.values():
            if job.eager_install:
                held = self.slots.get(job.env_key, EnvSlot()).jobs
                assert job.job_id in held, f"P1: eager job {job.job_id!r} holds no count"


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
