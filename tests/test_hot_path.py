"""The doors' hot path (``agent/doors/servicer.py``, ``agent/doors/ray_http.py``): gRPC
handlers that take the request's bytes and answer prepared bytes, a cache hit answered in one
synchronous step, and requests seen before recognised by their bytes; the Ray door's prepared
replies. Every behaviour of the full path stays: bad input is answered with its status whether
the env is ready or not, a remembered request whose env went away is created again, the
metrics count hits, and a body that is not the message is INVALID_ARGUMENT, not a crash. A
real agent on a real unix socket; packages are file:// zips."""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio._server
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent.app.config import RaySettings
from agent.app.service import AgentService
from agent.doors.servicer import SERVICE, RuntimeEnvAgentServicer, _HotRequests
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.packages import env_json, module_zip
from tests.harness.ray_door import RayClient

RPCS = ("CreateRuntimeEnv", "DeleteRuntimeEnv", "GetRuntimeEnvsInfo")


def _env(tmp_path: Path, name: str = "hotmod") -> str:
    pkg = tmp_path / f"{name}.zip"
    pkg.write_bytes(module_zip(name, "1"))
    return env_json(py_modules=[f"file://{pkg}"], env_vars={"A": "1"})


async def _raw(a: RunningAgent, rpc: str, body: bytes) -> tuple[grpc.StatusCode, str, bytes]:
    """Call ``rpc`` with ``body`` as the request's bytes, as they are."""
    async with grpc.aio.insecure_channel(a.agent.address) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            f"/{SERVICE}/{rpc}"
        )
        try:
            reply = await call(body, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or "", b""
    return grpc.StatusCode.OK, "", reply


def _references(a: RunningAgent, env_id: str) -> int:
    service: AgentService = a.service
    return service.tables.env_count(env_id)


@pytest.mark.parametrize("rpc", RPCS)
async def test_a_body_that_is_not_the_request_message_is_invalid_argument_and_serving_goes_on(
    rpc: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A field whose wire type is impossible (tag 1, wire type 7) cannot be parsed: the client
    hears INVALID_ARGUMENT naming the message, the log has a warning and no bug."""
    caplog.set_level(logging.WARNING)
    async with running_agent() as a:
        code, details, _ = await _raw(a, rpc, b"\x0f\x01\x02")
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert f"(3 bytes) is not a rtenv.v1.{rpc}Request message" in details, details
        created = await a.create(_env(tmp_path))  # and the agent serves
        assert created.runtime_env_id
    assert "failed with a bug" not in caplog.text
    assert "INVALID_ARGUMENT" in caplog.text


async def test_a_hit_answers_the_reply_the_full_path_gives_and_counts_each_reference(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path)
    async with running_agent() as a:
        first = await a.create(env)  # a miss: installs
        hits = [await a.create(env) for _ in range(3)]  # hits; the last two by their bytes
        assert all(h == first for h in hits), (first, hits)
        assert _references(a, first.runtime_env_id) == 4
        assert [await a.delete(first.runtime_env_id) for _ in range(4)] == [3, 2, 1, 0]
        assert _references(a, first.runtime_env_id) == 0


async def test_bad_input_on_a_ready_env_is_refused_by_the_hot_path_as_by_the_full_one(
    tmp_path: Path,
) -> None:
    """The env is ready (a hit would be answered at once): a create of it with a setup timeout
    below -1, or a job id over the limit, is still INVALID_ARGUMENT with the full path's
    message, and counts nothing; the same request refused twice is refused twice."""
    env = _env(tmp_path)
    async with running_agent() as a:
        held = await a.create(env)
        env_id = held.runtime_env_id
        bad_timeout = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=env, config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=-5)
        ).SerializeToString()
        long_job = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=env, job_id="j" * 200
        ).SerializeToString()
        for body, words in ((bad_timeout, "setup_timeout_seconds"), (long_job, "job_id")):
            for _ in range(2):
                code, details, _ = await _raw(a, "CreateRuntimeEnv", body)
                assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
                assert words in details, details
        assert _references(a, env_id) == 1
        # a delete by an id nobody created, twice (the second one as remembered bytes if
        # they were): NOT_FOUND both times, nothing changed
        unknown = agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id="0" * 32).SerializeToString()
        for _ in range(2):
            code, details, _ = await _raw(a, "DeleteRuntimeEnv", unknown)
            assert code is grpc.StatusCode.NOT_FOUND, (code, details)
        assert _references(a, env_id) == 1


async def test_remembered_request_bytes_of_an_env_that_went_away_create_it_again(
    tmp_path: Path,
) -> None:
    """The door remembers a hit's request bytes; once every reference is gone (the env is no
    longer ready here), the same bytes are a create again, not a hit, and a delete remembered
    by its bytes is NOT_FOUND until then."""
    env = _env(tmp_path)
    body = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env).SerializeToString()
    async with running_agent() as a:
        code, _, raw = await _raw(a, "CreateRuntimeEnv", body)  # a miss
        assert code is grpc.StatusCode.OK
        env_id = agent_pb2.CreateRuntimeEnvReply.FromString(raw).runtime_env_id
        for _ in range(2):  # hits: remembered by their bytes from the first
            code, _, again = await _raw(a, "CreateRuntimeEnv", body)
            assert (code, again) == (grpc.StatusCode.OK, raw)
        delete = agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id).SerializeToString()
        for left in (2, 1, 0):
            code, _, reply = await _raw(a, "DeleteRuntimeEnv", delete)
            assert code is grpc.StatusCode.OK
            assert agent_pb2.DeleteRuntimeEnvReply.FromString(reply).remaining_references == left
        code, details, _ = await _raw(a, "DeleteRuntimeEnv", delete)
        assert code is grpc.StatusCode.NOT_FOUND, (code, details)
        assert env_id not in a.service.records
        code, _, again = await _raw(a, "CreateRuntimeEnv", body)  # created again
        assert (code, again) == (grpc.StatusCode.OK, raw)
        assert _references(a, env_id) == 1
        info = await a.info()
        assert [e.runtime_env_id for e in info.envs] == [env_id]
        assert info.envs[0].state == "ready"


async def test_hits_are_counted_in_the_metrics(tmp_path: Path) -> None:
    env = _env(tmp_path)
    async with running_agent() as a:
        metrics = a.agent.metrics
        created = await a.create(env)
        for _ in range(5):
            await a.create(env)
            await a.delete(created.runtime_env_id)
        registry = metrics.registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        assert sample("rtenv_requests_total", rpc="CreateRuntimeEnv", outcome="ok") == 6
        assert sample("rtenv_requests_total", rpc="DeleteRuntimeEnv", outcome="ok") == 5
        assert sample("rtenv_create_seconds_count", cache="hit") == 5
        assert sample("rtenv_create_seconds_count", cache="miss") == 1
        assert (sample("rtenv_create_seconds_sum", cache="hit") or 0) > 0
        # cumulative buckets, ending at +Inf with the count
        assert sample("rtenv_create_seconds_bucket", cache="hit", le="+Inf") == 5
        assert sample("rtenv_create_seconds_bucket", cache="hit", le="300.0") == 5


async def test_the_ray_door_answers_hits_with_the_prepared_reply_and_failures_with_their_own(
    tmp_path: Path,
) -> None:
    """Over the Ray door: every create of an env answers the same reply bytes (OK, its
    context), a delete answers OK, and a failure after them still answers FAILED with its
    message (the prepared OK replies are not answered for it); the counts move as Ray's."""
    env = _env(tmp_path)
    async with (
        running_agent(ray=RaySettings()) as a,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, a.agent.ray_address)
        request = ray_pb2.GetOrCreateRuntimeEnvRequest(serialized_runtime_env=env)
        bodies = []
        for _ in range(3):
            response = await ray.post("/get_or_create_runtime_env", request.SerializeToString())
            assert response.status == 200
            bodies.append(response.body)
        assert bodies[0] == bodies[1] == bodies[2]
        first = ray_pb2.GetOrCreateRuntimeEnvReply.FromString(bodies[0])
        assert first.status == ray_pb2.AGENT_RPC_STATUS_OK
        assert json.loads(first.serialized_runtime_env_context)["env_vars"]["A"] == "1"
        assert (await ray.delete(env)).status == ray_pb2.AGENT_RPC_STATUS_OK
        info = await ray.info()
        assert [s.ref_cnt for s in info.runtime_env_states] == [2]
        bad = await ray.create('{"env_vars": {"A": 1}}')  # not a string: refused
        assert bad.status == ray_pb2.AGENT_RPC_STATUS_FAILED
        assert "env_vars" in bad.error_message
        assert bad.serialized_runtime_env_context == ""
        for _ in range(2):
            assert (await ray.delete(env)).status == ray_pb2.AGENT_RPC_STATUS_OK
        gone = await ray.delete(env)
        assert gone.status == ray_pb2.AGENT_RPC_STATUS_FAILED
        assert "no reference on this agent" in gone.error_message


async def test_only_the_hot_methods_are_registered_by_method_and_every_service_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """grpc.aio waits on one requested call per method registered by method, for every call:
    only CreateRuntimeEnv and DeleteRuntimeEnv are; info, the health checks and reflection are
    found through generic handlers and answer as before."""
    registered: list[tuple[str, list[str]]] = []
    add = grpc.aio._server.Server.add_registered_method_handlers

    def recording(server: grpc.aio._server.Server, service: str, handlers: dict[str, Any]) -> None:
        registered.append((service, sorted(handlers)))
        add(server, service, handlers)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", recording)
    async with running_agent() as a:
        assert registered == [(SERVICE, ["CreateRuntimeEnv", "DeleteRuntimeEnv"])]
        created = await a.create(_env(tmp_path))
        assert [e.runtime_env_id for e in (await a.info()).envs] == [created.runtime_env_id]
        async with grpc.aio.insecure_channel(a.agent.address) as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)
            checked = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
            assert checked.status == health_pb2.HealthCheckResponse.SERVING
            reflect: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = [r async for r in reflect.ServerReflectionInfo(iter([request]))]
        listed = {s.name for s in replies[0].list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= listed, listed
        assert await a.delete(created.runtime_env_id) == 0


async def test_the_handlers_are_recognised_as_async_by_the_first_question_grpc_asks(
    tmp_path: Path,
) -> None:
    """grpc.aio asks ``inspect.isawaitable(handler)`` first, then ``iscoroutinefunction``, of
    every call: the door's handlers answer the first one yes (a bound method answers it no,
    eight Python calls in all), and calling one answers the request."""
    async with running_agent() as a:
        servicer = RuntimeEnvAgentServicer(a.service, None)
        handlers = servicer.handlers()
        assert sorted(handlers) == sorted(RPCS)
        for handler in handlers.values():
            assert inspect.isawaitable(handler.unary_unary)
            assert inspect.iscoroutinefunction(handler.unary_unary)
        body = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=_env(tmp_path))
        create: Any = handlers["CreateRuntimeEnv"].unary_unary
        reply = await create(body.SerializeToString(), None)  # a context is read only for errors
        env_id = agent_pb2.CreateRuntimeEnvReply.FromString(reply).runtime_env_id
        assert _references(a, env_id) == 1
        assert await a.delete(env_id) == 0


def test_remembered_requests_are_bounded_in_entries_and_in_bytes_oldest_first() -> None:
    kept: _HotRequests[str] = _HotRequests(3, 100)
    for i in range(4):
        kept.remember(b"r%d" % i, f"v{i}", 10)
    assert list(kept) == [b"r1", b"r2", b"r3"]  # over the entries: r0, the oldest, went
    assert kept.bytes == 30
    assert kept.get(b"r1") == "v1"  # a plain dict read: it moves nothing
    kept.remember(b"big", "b", 80)  # over the bytes: the oldest go until it fits
    assert list(kept) == [b"r2", b"r3", b"big"]
    assert kept.bytes == 100
    kept.remember(b"r2", "again", 5)  # remembered again: the newest, weighed anew
    assert list(kept) == [b"r3", b"big", b"r2"]
    assert kept.bytes == 95
    assert kept[b"r2"] == "again"
    kept.remember(b"r3", "huge", 101)  # heavier than the whole budget: not kept, nor the old
    assert list(kept) == [b"big", b"r2"]
    assert kept.bytes == 85
