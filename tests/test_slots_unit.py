"""The env slots' counting on their own: no process, no socket. The agent is a fake ``EnvAgent``
that records each create and delete, can hold creates on an event, and can refuse one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import pytest

from raylet_sim.slots import EnvSlots
from raylet_sim.tasks import ENV_SETUP_FAILED, TaskFailed
from rtenv.v1 import agent_pb2
from tests.harness.polling import wait_until


@dataclass
class FakeAgent:
    creates: list[tuple[str, str, bool]] = field(default_factory=list)  # key, job id, eager
    deletes: list[str] = field(default_factory=list)
    hold: asyncio.Event | None = None
    refuse: int = 0  # refuse this many next creates with INVALID_ARGUMENT

    async def create(
        self, serialized_env: str, job_id: str = "", *, eager_install: bool = False
    ) -> agent_pb2.CreateRuntimeEnvReply:
        self.creates.append((serialized_env, job_id, eager_install))
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse:
            self.refuse -= 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="refused",
            )
        return agent_pb2.CreateRuntimeEnvReply(
            runtime_env_id=f"id-{serialized_env}",
            context=agent_pb2.RuntimeEnvContext(cwd=f"/envs/{serialized_env}"),
        )

    async def delete(self, runtime_env_id: str) -> int:
        self.deletes.append(runtime_env_id)
        return 0


def test_acquire_and_release_count_synchronously_and_give_back_at_zero() -> None:
    """The counting needs no agent call and no event loop while nothing was created."""
    agent = FakeAgent()
    slots = EnvSlots(agent)
    slots.acquire("a")
    slots.acquire("a")
    assert slots.slots["a"].count == 2
    slots.check_invariants({"a": 2})
    slots.release("a")
    assert slots.slots["a"].count == 1
    slots.release("a")
    assert "a" not in slots.slots
    assert agent.creates == []
    assert agent.deletes == []  # never created: nothing to give back


async def test_concurrent_ensures_of_one_key_send_one_create() -> None:
    hold = asyncio.Event()
    agent = FakeAgent(hold=hold)
    slots = EnvSlots(agent)
    for _ in range(3):
        slots.acquire("a")
    waits = [asyncio.create_task(slots.ensure("a")) for _ in range(3)]
    await wait_until(lambda: len(agent.creates) == 1, what="the create")
    hold.set()
    contexts = await asyncio.wait_for(asyncio.gather(*waits), 10)
    assert {c.cwd for c in contexts} == {"/envs/a"}
    assert len(agent.creates) == 1
    assert slots.slots["a"].runtime_env_id == "id-a"
    assert slots.active_keys_by_env() == {"id-a": 1}


async def test_the_last_release_deletes_the_reference_exactly_once() -> None:
    agent = FakeAgent()
    slots = EnvSlots(agent)
    slots.acquire("a")
    slots.acquire("a")
    await slots.ensure("a")
    slots.release("a")
    await slots.quiesce()
    assert agent.deletes == []
    slots.release("a")
    await slots.quiesce()
    assert agent.deletes == ["id-a"]
    assert slots.stats.creates == slots.stats.deletes == 1


async def test_a_create_answered_after_its_slot_was_given_back_is_deleted_then() -> None:
    """P2: the holder went away while the create was in flight; the late reference goes back."""
    hold = asyncio.Event()
    agent = FakeAgent(hold=hold)
    slots = EnvSlots(agent)
    slots.acquire("a")
    waiter = asyncio.create_task(slots.ensure("a"))
    await wait_until(lambda: len(agent.creates) == 1, what="the create in flight")
    waiter.cancel()
    slots.release("a")
    assert "a" not in slots.slots
    hold.set()
    await slots.quiesce()
    assert agent.deletes == ["id-a"]


async def test_a_slot_kept_alive_is_reused_without_a_create_then_expires() -> None:
    agent = FakeAgent()
    slots = EnvSlots(agent, keepalive_s=0.2)
    slots.acquire("a")
    await slots.ensure("a")
    slots.release("a")
    assert slots.slots["a"].count == 0
    slots.check_invariants({})
    slots.acquire("a")
    assert (await slots.ensure("a")).cwd == "/envs/a"
    assert len(agent.creates) == 1
    slots.release("a")
    await wait_until(lambda: agent.deletes == ["id-a"], what="the keep-alive to expire")
    assert "a" not in slots.slots


async def test_a_refused_create_fails_env_setup_and_the_next_holder_tries_again() -> None:
    agent = FakeAgent(refuse=1)
    slots = EnvSlots(agent)
    slots.acquire("a")
    with pytest.raises(TaskFailed) as failed:
        await slots.ensure("a")
    assert failed.value.status == ENV_SETUP_FAILED
    assert "INVALID_ARGUMENT" in failed.value.message
    assert (await slots.ensure("a")).cwd == "/envs/a"
    assert len(agent.creates) == 2


async def test_an_eager_job_creates_its_env_at_start_and_holds_it_until_it_finishes() -> None:
    agent = FakeAgent()
    slots = EnvSlots(agent)
    await slots.start_job("job-1", "a", eager_install=True)
    assert agent.creates == [("a", "job-1", True)]
    assert slots.slots["a"].count == 1
    slots.check_invariants({})
    slots.acquire("a")  # a worker of the job: the env is ready, no create
    assert (await slots.ensure("a")).cwd == "/envs/a"
    assert len(agent.creates) == 1
    slots.finish_job("job-1")
    assert slots.slots["a"].count == 1, "the job's worker still holds the env"
    slots.check_invariants({"a": 1})
    slots.release("a")
    await slots.quiesce()
    assert agent.deletes == ["id-a"]
    assert not slots.jobs


async def test_a_job_without_eager_install_creates_nothing_until_its_first_worker() -> None:
    agent = FakeAgent()
    slots = EnvSlots(agent)
    await slots.start_job("job-1", "a", eager_install=False)
    assert agent.creates == []
    assert slots.slots == {}
    slots.finish_job("job-1")
    assert not slots.jobs
    assert agent.deletes == []


async def test_an_eager_job_whose_create_fails_is_not_started_and_holds_nothing() -> None:
    agent = FakeAgent(refuse=1)
    slots = EnvSlots(agent)
    with pytest.raises(TaskFailed):
        await slots.start_job("job-1", "a")
    assert not slots.jobs
    assert not slots.slots


async def test_a_job_started_twice_or_finished_unknown_is_refused_by_name() -> None:
    slots = EnvSlots(FakeAgent())
    await slots.start_job("job-1", "a")
    with pytest.raises(ValueError, match=r"job-1.*already started"):
        await slots.start_job("job-1", "a")
    with pytest.raises(ValueError, match="no job 'job-2'"):
        slots.finish_job("job-2")
    slots.give_back()
    await slots.quiesce()
    assert not slots.slots


def test_check_invariants_reports_a_count_that_does_not_match_its_holders() -> None:
    """P1: a leaked count (no worker, start or job behind it) is caught."""
    slots = EnvSlots(FakeAgent())
    slots.acquire("a")
    slots.check_invariants({"a": 1})
    with pytest.raises(AssertionError, match=r"P1: slot 'a' counts 1, but has 0 worker"):
        slots.check_invariants({})
    with pytest.raises(AssertionError, match="P1: a live worker's key has no slot"):
        slots.check_invariants({"a": 1, "b": 1})
