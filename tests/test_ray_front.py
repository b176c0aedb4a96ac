"""Ray's request semantics over the real service (``RayFront`` on an in-process agent, packages
from a real aiohttp server): counts per serialized string, ``client_server`` not counted (its
env held until a counted create takes over),
deletes of strings with no count refused, one env shared with the gRPC door, failures raised
(and answered by the door as FAILED replies with this agent's prefixed message: ``Answered``
words them through the door's table), the setup timeout, and info per string."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from agent.core.errors import AgentError, EnvNotFound, ErrorKind
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.doors import ray_front
from agent.doors.ray_context import RAY_CONTEXT_KEYS
from agent.doors.ray_errors import REPLY
from agent.doors.ray_front import MAX_STRINGS_PER_ENV, RayFront, RayInfo
from tests.harness.in_process import RunningAgent, running_agent, stray_cancellation
from tests.harness.package_server import package_server
from tests.harness.packages import workdir_zip
from tests.harness.polling import wait_until

SPACED = '{"env_vars": {"A": "1"}, "working_dir": "%s"}'
TIGHT = '{"env_vars":{"A":"1"},"working_dir":"%s"}'


@dataclass(frozen=True, slots=True)
class Reply:
    """A create's or a delete's answer as the Ray door gives it: ``ok`` (a create's
    ``context``), else ``error`` in the door's words for its ``kind``."""

    ok: bool
    error: str = ""
    context: str = ""
    kind: ErrorKind | None = None


class Answered:
    """A front whose expected failures are answered as the door's table words them
    (``ray_errors.REPLY``: the kind's FAILED reply, with the front's prefix)."""

    def __init__(self, front: RayFront) -> None:
        self.front = front

    async def get_or_create(self, serialized: str, **kwargs: Any) -> Reply:
        try:
            return Reply(True, context=await self.front.get_or_create(serialized, **kwargs))
        except AgentError as exc:
            return self._failed(exc)

    async def delete(self, serialized: str, **kwargs: Any) -> Reply:
        try:
            await self.front.delete(serialized, **kwargs)
        except AgentError as exc:
            return self._failed(exc)
        return Reply(True)

    def _failed(self, exc: AgentError) -> Reply:
        answer = REPLY[exc.kind]
        assert (answer.status, answer.failed) == (200, True), answer
        return Reply(
            False, answer.text(prefix=self.front.prefix, message=exc.message), kind=exc.kind
        )

    def info(self, limit: int | None = None) -> RayInfo:
        return self.front.info(limit)

    def references(self) -> int:
        return self.front.references()

    def in_flight(self) -> int:
        return self.front.in_flight()

    def check_invariants(self) -> None:
        self.front.check_invariants()


def front_of(ra: RunningAgent) -> Answered:
    return Answered(RayFront(ra.service, node="10.0.0.7"))


def env_id(text: str) -> str:
    return parse_runtime_env(text, EnvLimits()).env_id


def count(ra: RunningAgent, text: str) -> int:
    n: int = ra.service.tables.env_count(env_id(text))
    return n


async def test_two_spellings_are_one_env_one_install_and_two_counts() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": "A = 1\n"}))
        spaced, tight = SPACED % url, TIGHT % url
        front = front_of(ra)
        assert (await front.get_or_create(spaced)).ok
        assert (await front.get_or_create(spaced)).ok
        assert (await front.get_or_create(tight)).ok
        assert server.gets["wd.zip"] == 1
        assert count(ra, spaced) == 3
        refs = {s.runtime_env: s.ref_cnt for s in front.info().states}
        assert refs == {spaced: 2, tight: 1}

        assert (await front.delete(spaced)).ok
        assert (await front.delete(spaced)).ok
        third = await front.delete(spaced)  # no count left on this string: refused, no change
        assert not third.ok
        assert third.error.startswith("[Node 10.0.0.7] rtenv-agent: cannot delete")
        assert "no reference on this agent" in third.error
        assert count(ra, tight) == 1
        assert (await front.delete(tight)).ok
        assert count(ra, tight) == 0
        front.check_invariants()
        ra.service.check_invariants()


async def test_a_delete_of_a_string_never_created_fails_and_changes_nothing() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        held = '{"env_vars": {"B": "2"}}'
        assert (await front.get_or_create(held)).ok
        reply = await front.delete('{"env_vars":{"B":"2"}}')  # same env, another string
        assert not reply.ok
        assert "cannot delete runtime env" in reply.error
        reply = await front.delete("not json at all")
        assert not reply.ok
        assert count(ra, held) == 1
        assert front.references() == 1


async def test_client_server_installs_uncounted_and_holds_the_env_until_a_counted_create() -> None:
    """Ray Client's server (``client_server``) is not counted (no state in info, its delete a
    no-op), but its env stays held, as Ray's agent keeps its URIs in use, until a counted
    create of the env takes the hold over; one arriving while a counted string holds the env
    holds nothing more."""
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": "A = 1\n"}))
        text = SPACED % url
        front = front_of(ra)
        reply = await front.get_or_create(text, source_process="client_server")
        assert reply.ok
        assert "command_prefix" in json.loads(reply.context)
        assert server.gets["wd.zip"] == 1  # installed
        assert front.info().states == ()  # not counted as Ray counts
        assert count(ra, text) == 1  # held: a cache of 0 must not delete the server's folder
        assert (await front.delete(text, source_process="client_server")).ok  # a no-op
        assert count(ra, text) == 1
        # a counted create takes the hold over: one reference, Ray's count of 1
        assert (await front.get_or_create(TIGHT % url)).ok
        assert server.gets["wd.zip"] == 1  # still installed: no second download
        assert count(ra, text) == 1
        # with a count held, client_server's calls leave it as it is
        assert (await front.get_or_create(text, source_process="client_server")).ok
        assert (await front.delete(text, source_process="client_server")).ok
        assert count(ra, text) == 1
        assert [s.ref_cnt for s in front.info().states] == [1]
        front.check_invariants()
        assert (await front.delete(TIGHT % url)).ok  # the job's delete lets it go
        assert count(ra, text) == 0
        assert front.references() == 0
        front.check_invariants()
        ra.service.check_invariants()


async def test_client_server_holds_are_bounded_the_oldest_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray_front, "MAX_CLIENT_HOLDS", 2)
    async with running_agent() as ra:
        front = front_of(ra)
        texts = [f'{{"env_vars": {{"H": "{i}"}}}}' for i in range(3)]
        for text in texts:
            assert (await front.get_or_create(text, source_process="client_server")).ok
            assert (await front.get_or_create(text, source_process="client_server")).ok
        assert [count(ra, text) for text in texts] == [0, 1, 1]
        assert front.references() == 2
        front.check_invariants()


async def test_an_env_created_over_grpc_and_over_ray_is_one_env_counted_twice() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": "A = 1\n"}))
        text = SPACED % url
        front = front_of(ra)
        created = await ra.create(text)
        assert (await front.get_or_create(text)).ok
        assert created.runtime_env_id == env_id(text)
        assert count(ra, text) == 2
        assert server.gets["wd.zip"] == 1
        assert (await front.delete(text)).ok  # the Ray door's reference only
        assert count(ra, text) == 1
        assert not (await front.delete(text)).ok  # the gRPC reference is not the Ray door's
        assert await ra.delete(created.runtime_env_id) == 0
        ra.service.check_invariants()


async def test_failures_are_failed_replies_with_the_prefixed_message_and_shown_in_info() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        big = json.dumps({"env_vars": {"BIG": "x" * 200_000}})
        reply = await front.get_or_create(big)
        assert not reply.ok
        assert reply.error.startswith("[Node 10.0.0.7] rtenv-agent: env_vars['BIG'] is ")
        assert "may not exceed 131072 bytes" in reply.error
        unknown = await front.get_or_create('{"conda": "env.yaml"}')
        assert not unknown.ok
        assert "runtime_env field 'conda' cannot be used on this node" in unknown.error
        states = front.info().states
        assert [(s.success, s.ref_cnt) for s in states] == [(False, 0), (False, 0)]
        assert states[0].error == unknown.error  # newest first
        assert states[1].runtime_env == big
        assert front.info().total == 2
        assert len(ra.service.records) == 0
        front.check_invariants()


async def test_a_later_success_replaces_the_strings_failure_in_info() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}), statuses=[404])
        text = SPACED % url
        front = front_of(ra)
        assert not (await front.get_or_create(text)).ok
        assert [s.success for s in front.info().states] == [False]
        assert (await front.get_or_create(text)).ok
        assert [(s.success, s.ref_cnt, s.error) for s in front.info().states] == [(True, 1, None)]
        front.check_invariants()


async def test_setup_timeout_seconds_is_honoured_zero_default_minus_one_max() -> None:
    async with (
        package_server() as server,
        running_agent(default_setup_timeout_s=0.3, max_setup_timeout_s=0.6) as ra,
    ):
        url = server.add("held.zip", workdir_zip({"a.py": ""}))
        gate = server.hold("held.zip")
        text = SPACED % url
        front = front_of(ra)
        try:
            for asked, expected in ((1, "0.6s"), (0, "0.3s"), (-1, "0.6s")):
                started = time.monotonic()
                reply = await front.get_or_create(text, setup_timeout_seconds=asked)
                took = time.monotonic() - started
                assert not reply.ok
                assert f"was not set up within {expected}" in reply.error, (asked, reply.error)
                assert took < 5.0
        finally:
            gate.set()
        assert count(ra, text) == 0


async def test_info_honours_limit_and_counts_the_total() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        texts = [json.dumps({"env_vars": {"N": str(i)}}) for i in range(5)]
        for text in texts:
            assert (await front.get_or_create(text)).ok
        assert len(front.info().states) == 5
        limited = front.info(2)
        assert [s.runtime_env for s in limited.states] == texts[:2]
        assert limited.total == 5
        assert front.info(0).states == ()
        assert all(s.success and s.creation_time_ms >= 0 for s in front.info().states)


async def test_the_context_is_rays_format_with_the_working_dir() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        reply = await front_of(ra).get_or_create(SPACED % url)
        context = json.loads(reply.context)
        assert tuple(context) == RAY_CONTEXT_KEYS
        assert context["command_prefix"][0] == "cd"
        assert context["env_vars"]["A"] == "1"
        assert context["env_vars"]["PYTHONPATH"].startswith(str(ra.root))


async def test_concurrent_creates_of_one_string_each_count() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        text = SPACED % url
        front = front_of(ra)
        replies = await asyncio.gather(*(front.get_or_create(text) for _ in range(8)))
        assert all(r.ok for r in replies)
        assert count(ra, text) == 8
        assert [s.ref_cnt for s in front.info().states] == [8]
        assert server.gets["wd.zip"] == 1


async def test_a_delete_during_the_create_of_its_string_is_counted_and_nothing_is_left() -> None:
    """As the raylet does when a job ends: the delete arrives while the create installs."""
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        gate = server.hold("wd.zip")
        text = SPACED % url
        front = front_of(ra)
        creating = asyncio.create_task(front.get_or_create(text))
        try:
            await asyncio.wait_for(server.requested("wd.zip").wait(), 10)
            assert front.in_flight() == 1
            deleted = await front.delete(text)
            assert deleted.ok, deleted.error
            front.check_invariants()
            assert not (await front.delete(text)).ok  # the count is 0 now
        finally:
            gate.set()
        assert (await asyncio.wait_for(creating, 30)).ok
        assert count(ra, text) == 0
        assert front.references() == 0
        assert front.info().states == ()
        front.check_invariants()
        ra.service.check_invariants()


async def test_a_failed_create_after_a_delete_gives_back_no_more_than_it_took() -> None:
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": ""}), statuses=[404])
        gate = server.hold("wd.zip")
        text = SPACED % url
        front = front_of(ra)
        creating = asyncio.create_task(front.get_or_create(text))
        try:
            await asyncio.wait_for(server.requested("wd.zip").wait(), 10)
            assert (await front.delete(text)).ok
        finally:
            gate.set()
        assert not (await asyncio.wait_for(creating, 30)).ok
        assert front.in_flight() == 0
        front.check_invariants()
        assert [s.success for s in front.info().states] == [False]


async def test_a_create_failing_after_an_earlier_one_was_deleted_leaves_nothing_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C0 done, C1 of the same string in flight, a delete (of C0's count), then C1 fails: Ray
    counts 0 now (it decrements on a failed create), so the reference C0 took goes back."""
    async with running_agent() as ra:
        front = front_of(ra)
        text = '{"env_vars": {"C": "3"}}'
        assert (await front.get_or_create(text)).ok
        real_create = ra.service.create
        gate = asyncio.Event()

        async def failing_later(*args: object, **kwargs: object) -> object:
            await gate.wait()
            raise EnvNotFound("injected: the second create fails")

        monkeypatch.setattr(ra.service, "create", failing_later)
        # the env is ready: not answered by the hot path, the second create goes to ``create``
        monkeypatch.setattr(ra.service, "create_hit", lambda key: False)
        second = asyncio.create_task(front.get_or_create(text))
        await wait_until(lambda: front.in_flight() == 1, what="the second create in flight")
        assert (await front.delete(text)).ok  # the raylet's delete of the first create
        gate.set()
        assert not (await asyncio.wait_for(second, 10)).ok
        monkeypatch.setattr(ra.service, "create", real_create)
        assert front.references() == 0
        assert count(ra, text) == 0
        assert front.info().states[0].success is False  # the failure shown, no count
        front.check_invariants()
        ra.service.check_invariants()


async def test_the_grpc_door_cannot_drop_a_reference_the_ray_door_holds() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        text = '{"env_vars": {"D": "4"}}'
        assert (await front.get_or_create(text)).ok
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ra.delete(env_id(text))
        assert "held by Ray's raylet" in (refused.value.details() or "")
        assert count(ra, text) == 1
        front.check_invariants()
        created = await ra.create(text)  # a gRPC reference of its own may be dropped
        assert await ra.delete(created.runtime_env_id) == 1
        assert (await front.delete(text)).ok
        assert count(ra, text) == 0
        front.check_invariants()
        ra.service.check_invariants()


async def test_delete_is_by_the_env_id_and_a_service_error_is_a_failed_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        text = '{"env_vars": {"B": "2"}}'
        assert (await front.get_or_create(text)).ok
        calls: list[tuple[str, str, bool]] = []

        def refusing(env_id: str, serialized: str, *, holder: bool = False) -> int:
            calls.append((env_id, serialized, holder))
            raise EnvNotFound("injected: no such env")

        monkeypatch.setattr(ra.service, "delete_now", refusing)  # the front's delete: no
        reply = await front.delete(text)  # request id, in one step
        assert not reply.ok
        assert reply.error == "[Node 10.0.0.7] rtenv-agent: injected: no such env"
        assert calls == [(env_id(text), "", True)]
        assert [s.ref_cnt for s in front.info().states] == [1]  # nothing changed
        monkeypatch.undo()
        assert (await front.delete(text)).ok
        assert count(ra, text) == 0
        front.check_invariants()


async def test_a_context_that_cannot_be_built_is_a_bug_raised_and_leaks_no_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(The door answers a bug FAILED: ``test_ray_door``.)"""
    async with running_agent() as ra:
        front = front_of(ra)
        text = '{"env_vars": {"C": "3"}}'

        def broken(env_id: str) -> str:
            raise RuntimeError("injected bug")

        monkeypatch.setattr(front.front, "_context", broken)
        with pytest.raises(RuntimeError, match="injected bug"):
            await front.get_or_create(text)
        assert count(ra, text) == 0
        assert front.references() == 0
        front.check_invariants()


async def test_one_env_under_too_many_spellings_is_refused_saying_the_limit() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        spellings = ['{"env_vars":' + " " * i + '{"D": "4"}}' for i in range(MAX_STRINGS_PER_ENV)]
        for text in spellings:
            assert (await front.get_or_create(text)).ok
        extra = '{"env_vars":' + " " * MAX_STRINGS_PER_ENV + '{"D": "4"}}'
        reply = await front.get_or_create(extra)
        assert not reply.ok
        assert f"the limit is {MAX_STRINGS_PER_ENV}" in reply.error
        assert count(ra, extra) == MAX_STRINGS_PER_ENV
        assert (await front.get_or_create(spellings[0])).ok  # a known spelling still counts
        front.check_invariants()


async def test_held_strings_are_bounded_in_bytes_and_info_in_reply_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        texts = [json.dumps({"env_vars": {"N": str(i) * 40}}) for i in range(3)]
        monkeypatch.setattr(ray_front, "MAX_HELD_BYTES", 2 * len(texts[0]))
        assert (await front.get_or_create(texts[0])).ok
        assert (await front.get_or_create(texts[1])).ok
        reply = await front.get_or_create(texts[2])
        assert not reply.ok
        assert f"the limit is {2 * len(texts[0])}" in reply.error
        assert count(ra, texts[2]) == 0
        monkeypatch.setattr(ray_front, "MAX_INFO_BYTES", len(texts[0]) + 10)
        info = front.info()
        assert [s.runtime_env for s in info.states] == texts[:1]
        assert info.total == 2  # both held strings, the one left out too
        front.check_invariants()


async def test_the_job_id_is_kept_as_the_raylets_text_and_odd_bytes_are_escaped() -> None:
    async with running_agent() as ra:
        front = front_of(ra)
        assert (await front.get_or_create('{"env_vars": {"E": "5"}}', job_id=b"02000000")).ok
        assert (await front.get_or_create('{"env_vars": {"E": "6"}}', job_id=b"\x01a\xff")).ok
        jobs = sorted(j for record in ra.service.records.values() for j in record.job_ids)
        assert jobs == ["02000000", "\\x01a\\xff"]
        reply = await front.get_or_create('{"env_vars": {"E": "7"}}', job_id=b"\x00" * 10_000)
        assert not reply.ok
        assert "the limit is" in reply.error


async def test_a_cancellation_nobody_asked_for_is_raised_and_gives_the_count_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create whose service meets a stray CancelledError (a bug below) gives back its count
    and raises it (the door answers it FAILED naming an internal error, as any bug:
    ``test_ray_door``)."""
    async with package_server() as server, running_agent() as ra:
        url = server.add("wd.zip", workdir_zip({"a.py": "A = 1\n"}))
        front = front_of(ra)

        create = ra.service.create
        monkeypatch.setattr(ra.service, "create", stray_cancellation)
        for source in ("", ray_front.CLIENT_SERVER):
            with pytest.raises(asyncio.CancelledError):
                await front.get_or_create(SPACED % url, source_process=source)
        assert front.info().states == ()
        monkeypatch.setattr(ra.service, "create", create)
        assert (await front.get_or_create(SPACED % url)).ok
        assert count(ra, SPACED % url) == 1
