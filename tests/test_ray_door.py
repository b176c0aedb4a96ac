"""The Ray door of a real agent (both doors, in-process), spoken to over 127.0.0.1 by a real
aiohttp client with protobuf bodies (``rtenv.ray.v1``), packages from a real aiohttp server:
one env across both doors, Ray's token check, hostile bodies, and the door's lifecycle (bound and
its port file written before recovery, requests held until the agent serves, no port file left
by a failed start), and ``serve --ray-address``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from agent.app.config import RaySettings, Settings
from agent.core.errors import StartupError
from agent.doors import ray_http
from agent.doors.ray_context import RAY_CONTEXT_KEYS
from agent.ops.config_view import effective
from agent.ops.logs import BoundFields
from agent.ops.option_parsers import parse_ray_address
from agent.ops.server import Agent, AgentState
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.agent_process import refused
from tests.harness.in_process import FAST_FETCH, running_agent, stray_cancellation
from tests.harness.package_server import package_server
from tests.harness.packages import workdir_zip
from tests.harness.pip_wheels import isolate_pip, pip_env, run
from tests.harness.polling import wait_until
from tests.harness.ray_door import RayClient, ray_agent
from tests.harness.tempdirs import short_tempdir

OK = ray_pb2.AGENT_RPC_STATUS_OK
FAILED = ray_pb2.AGENT_RPC_STATUS_FAILED
SPACED = '{"env_vars": {"A": "1"}, "working_dir": "%s"}'
TIGHT = '{"env_vars":{"A":"1"},"working_dir":"%s"}'


async def test_both_doors_share_one_env_and_its_counts() -> None:
    async with package_server() as server, ray_agent() as (ra, ray):
        url = server.add("wd.zip", workdir_zip({"a.py": "A = 1\n"}))
        spaced, tight = SPACED % url, TIGHT % url
        reply = await ray.create(spaced, timeout_s=600)
        assert reply.status == OK, reply.error_message
        assert tuple(json.loads(reply.serialized_runtime_env_context)) == RAY_CONTEXT_KEYS
        assert (await ray.create(tight)).status == OK
        created = await ra.create(spaced)  # over gRPC: the same env
        assert server.gets["wd.zip"] == 1
        assert ra.service.tables.env_count(created.runtime_env_id) == 3
        [shown] = (await ra.info()).envs  # the gRPC door's info sees the Ray door's job
        assert "01000000" in shown.job_ids

        assert (await ray.delete(spaced)).status == OK
        again = await ray.delete(spaced)
        assert again.status == FAILED
        assert again.error_message.startswith("[Node 127.0.0.1] rtenv-agent: cannot delete")
        assert (await ray.delete(tight)).status == OK
        assert ra.service.tables.env_count(created.runtime_env_id) == 1  # gRPC's, untouched
        counted = generate_latest(ra.agent.metrics.registry).decode()
        for rpc, outcome, n in (
            ("ray:get_or_create_runtime_env", "ok", 2),
            ("ray:delete_runtime_env_if_possible", "ok", 2),
            ("ray:delete_runtime_env_if_possible", "not_found", 1),
        ):
            assert f'rtenv_requests_total{{outcome="{outcome}",rpc="{rpc}"}} {n}.0' in counted
        assert await ra.delete(created.runtime_env_id) == 0

        info = await ray.info()
        assert info.total == 0
        ra.service.check_invariants()
        assert ra.agent.ray_front is not None
        ra.agent.ray_front.check_invariants()


async def test_info_lists_each_string_with_its_count_and_failures() -> None:
    async with ray_agent() as (_, ray):
        good = ['{"env_vars": {"N": "1"}}', '{"env_vars":{"N":"1"}}']
        for text in good:
            assert (await ray.create(text)).status == OK
        assert (await ray.create(good[0])).status == OK
        bad = json.dumps({"env_vars": {"BIG": "x" * 200_000}})
        failed = await ray.create(bad)
        assert failed.status == FAILED
        assert "may not exceed 131072 bytes" in failed.error_message
        info = await ray.info()
        assert info.total == 3
        states = {s.runtime_env: s for s in info.runtime_env_states}
        assert (states[good[0]].ref_cnt, states[good[1]].ref_cnt) == (2, 1)
        assert states[good[0]].success
        assert not states[good[0]].HasField("error")
        assert states[good[0]].HasField("creation_time_ms")
        assert not states[bad].success
        assert states[bad].error == failed.error_message
        limited = await ray.info(limit=1)
        assert (len(limited.runtime_env_states), limited.total) == (1, 3)


async def test_the_requests_setup_timeout_is_honoured_zero_default_minus_one_max() -> None:
    async with (
        package_server() as server,
        running_agent(
            ray=RaySettings(), default_setup_timeout_s=0.3, max_setup_timeout_s=0.6
        ) as ra,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, ra.agent.ray_address)
        url = server.add("held.zip", workdir_zip({"a.py": ""}))
        gate = server.hold("held.zip")
        try:
            for asked, expected in ((1, "0.6s"), (0, "0.3s"), (-1, "0.6s")):
                reply = await ray.create(SPACED % url, timeout_s=asked)
                assert reply.status == FAILED
                assert f"was not set up within {expected}" in reply.error_message, asked
        finally:
            gate.set()
        assert len(ra.service.records) == 0


async def test_client_server_installs_but_is_not_counted_over_http() -> None:
    """Installed and held (Ray Client's server starts in it), shown in no info state."""
    async with package_server() as server, ray_agent() as (ra, ray):
        url = server.add("wd.zip", workdir_zip({"a.py": ""}))
        text = SPACED % url
        assert (await ray.create(text, source_process="client_server")).status == OK
        assert server.gets["wd.zip"] == 1
        assert [ra.service.tables.env_count(e) for e in ra.service.records] == [1]
        assert (await ray.delete(text, source_process="client_server")).status == OK
        assert (await ray.info()).total == 0


async def test_with_a_token_missing_is_401_wrong_is_403_right_is_served() -> None:
    async with ray_agent(token="s3cret") as (_, ray):
        body = ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()
        path = "/get_runtime_envs_info"
        assert (await ray.post(path, body, headers={})).status == 401
        wrong = await ray.post(path, body, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 403
        wrong = await ray.post(path, body, headers={"X-Ray-Authorization": "s3cret"})
        assert wrong.status == 403  # the value is "Bearer <token>"
        right = await ray.post(path, body, headers={"X-Ray-Authorization": "Bearer s3cret"})
        assert right.status == 200
        assert (await ray.info()).total == 0  # Authorization: Bearer s3cret


async def test_refusals_say_their_words_and_every_failure_is_logged_once_with_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The door's refusals answer the words Ray clients have always seen; each failure (a
    refusal, a FAILED reply) is one warning of the funnel with ``code`` and ``kind``, and the
    request's ``rpc`` and job id bound."""
    caplog.handler.addFilter(BoundFields())  # the bound fields, as the agent's handler adds
    async with ray_agent(token="s3cret") as (_, ray):
        info = "/get_runtime_envs_info"
        with caplog.at_level(logging.WARNING, logger="agent.doors.ray_errors"):
            missing = await ray.post(info, b"", headers={})
            wrong = await ray.post(info, b"", headers={"Authorization": "Bearer nope"})
            garbage = await ray.post("/get_or_create_runtime_env", b"\xff\xff")
            gone = await ray.delete('{"env_vars": {"Z": "9"}}')
            bad = await ray.create('{"conda": "nope"}')
        assert (missing.status, missing.content_type) == (401, "text/plain")
        assert missing.text == (
            "Unauthorized: this agent wants Ray's token: send 'Authorization: Bearer <token>'\n"
        )
        assert (wrong.status, wrong.text) == (403, "Forbidden: the token is not this agent's\n")
        assert (garbage.status, garbage.text) == (
            400, "the body (2 bytes) is not a GetOrCreateRuntimeEnvRequest protobuf message\n"
        )  # fmt: skip
        assert gone.status == FAILED
        logged = [
            (r.rpc, r.code, r.kind, r.levelname)  # type: ignore[attr-defined]
            for r in caplog.records
            if r.name == "agent.doors.ray_errors"
        ]
        assert logged == [
            ("ray:get_runtime_envs_info", "401", "no_token", "WARNING"),
            ("ray:get_runtime_envs_info", "403", "wrong_token", "WARNING"),
            ("ray:get_or_create_runtime_env", "400", "not_a_message", "WARNING"),
            ("ray:delete_runtime_env_if_possible", "FAILED", "not_found", "WARNING"),
            ("ray:get_or_create_runtime_env", "FAILED", "refused", "WARNING"),
        ]
        assert gone.error_message in caplog.records[-2].getMessage()
        assert bad.status == FAILED
        assert caplog.records[-1].job_id == "01000000"  # type: ignore[attr-defined]
        assert "job_id=01000000" in caplog.records[-1].getMessage()


async def test_a_bug_below_the_door_is_a_failed_reply_saying_so_and_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (an exception that is no AgentError, or a cancellation nobody asked for) answers
    FAILED naming an internal error, instead of leaving Ray's request without an answer; the
    front gave its count back."""
    async with ray_agent() as (ra, ray):
        front = ra.agent.ray_front
        assert front is not None

        def broken(env_id: str) -> str:
            raise RuntimeError("injected bug")

        with caplog.at_level(logging.ERROR, logger="agent.doors.ray_errors"):
            monkeypatch.setattr(front, "_context", broken)
            first = await ray.create('{"env_vars": {"C": "3"}}')
            monkeypatch.undo()
            monkeypatch.setattr(ra.service, "create", stray_cancellation)
            second = await ray.create('{"env_vars": {"C": "4"}}')
            third = await ray.create('{"env_vars": {"C": "4"}}', source_process="client_server")
        for reply in (first, second, third):
            assert reply.status == FAILED
            assert reply.error_message == (
                "[Node 127.0.0.1] rtenv-agent: internal error in the agent (see its log)"
            )
        bugs = [r for r in caplog.records if r.name == "agent.doors.ray_errors"]
        assert len(bugs) == 3
        assert all(r.exc_info is not None for r in bugs)
        assert front.references() == 0
        front.check_invariants()
        counted = generate_latest(ra.agent.metrics.registry).decode()
        assert 'rtenv_requests_total{outcome="bug",rpc="ray:get_or_create_runtime_env"} 3.0' in (
            counted
        )


async def test_an_empty_token_is_refused_at_start_not_taken_as_no_auth() -> None:
    base = short_tempdir()
    try:
        agent = Agent(Settings(root=base / "root", ray=RaySettings(token=" ")))
        with pytest.raises(StartupError, match="the Ray token is empty"):
            await agent.start()
        assert not (base / "root").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_hostile_bodies_are_refused_and_the_agent_keeps_its_state() -> None:
    async with ray_agent() as (ra, ray), aiohttp.ClientSession() as session:
        held = '{"env_vars": {"K": "v"}}'
        assert (await ray.create(held)).status == OK
        garbage = await ray.post("/get_or_create_runtime_env", b"not a protobuf \xff")
        assert garbage.status == 400
        text = garbage.text
        assert text.count("\n") == 1
        assert "not a GetOrCreateRuntimeEnvRequest protobuf message" in text
        assert (await ray.post("/delete_runtime_env_if_possible", b"\xff\xff")).status == 400

        limit = ra.agent.settings.max_message_bytes
        url = f"{ray.base}/get_or_create_runtime_env"

        async def endless() -> AsyncIterator[bytes]:  # a body that never ends, unannounced
            for _ in range(limit // 65536 + 64):
                yield b"\x0a" * 65536

        async with session.post(url, data=endless()) as response:
            assert response.status == 413
        too_large = await ray.post("/get_or_create_runtime_env", b"x" * (limit + 1))
        assert (too_large.status, too_large.text) == (
            413, f"Maximum request body size {limit} exceeded."
        )  # fmt: skip

        info = await ray.info()
        assert [(s.runtime_env, s.ref_cnt) for s in info.runtime_env_states] == [(held, 1)]
        assert (await ray.delete(held)).status == OK
        ra.service.check_invariants()
        assert ra.agent.ray_front is not None
        ra.agent.ray_front.check_invariants()


async def test_the_port_file_exists_before_recovery_and_requests_wait_for_it() -> None:
    base = short_tempdir()
    port_file = base / "runtime_env_agent_port_node1"
    hold = asyncio.Event()
    reached = asyncio.Event()

    async def before_recovery() -> None:
        reached.set()
        await hold.wait()

    settings = replace(
        Settings(root=base / "root"), fetch=FAST_FETCH,
        ray=RaySettings(port_file=port_file),
    )  # fmt: skip
    agent = Agent(settings, before_recovery=before_recovery)
    starting = asyncio.create_task(agent.start())
    try:
        await asyncio.wait_for(reached.wait(), 30)
        assert agent.state is AgentState.STARTING
        assert agent.service is None  # recovery has not run
        port = int(port_file.read_text())
        assert agent.ray_address == f"127.0.0.1:{port}"
        assert [p.name for p in base.iterdir() if p.name.endswith(".tmp")] == []
        async with aiohttp.ClientSession() as session:
            ray = RayClient(session, agent.ray_address)
            asked = asyncio.create_task(ray.create('{"env_vars": {"A": "1"}}'))
            await wait_until(lambda: door_waiting(agent) == 1, what="the request waiting")
            assert not asked.done(), "served before the agent was ready"
            hold.set()
            await asyncio.wait_for(starting, 30)
            reply = await asyncio.wait_for(asked, 30)
            assert reply.status == OK, reply.error_message
            assert agent.service is not None
            assert len(agent.service.records) == 1
        await agent.stop(grace=0.5)
        assert not port_file.exists(), "a stopped agent's port file points at a dead port"
    finally:
        hold.set()
        if not starting.done():
            starting.cancel()
        await asyncio.wait([starting])
        await agent.stop(grace=0.5)
        shutil.rmtree(base, ignore_errors=True)


async def test_a_failed_start_leaves_no_port_file_and_no_listener() -> None:
    """The start fails after the Ray door was bound (the python to start workers with does not
    exist): its port file goes and its port is let go."""
    base = short_tempdir()
    port_file = base / "port"
    try:
        settings = Settings(
            root=base / "root", py_executable=str(base / "no-python"),
            ray=RaySettings(port_file=port_file),
        )  # fmt: skip
        agent = Agent(settings)
        with pytest.raises(StartupError, match="no-python"):
            await agent.start()
        assert agent.ray_address, "the Ray door was not bound before the failing step"
        assert not port_file.exists()
        _assert_closed(agent.ray_address)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_request_waiting_through_a_failed_start_gets_503_and_no_port_file_is_left() -> None:
    base = short_tempdir()
    port_file = base / "port"
    go = asyncio.Event()

    async def failing_recovery() -> None:
        await go.wait()
        raise StartupError("injected: recovery failed")

    settings = replace(
        Settings(root=base / "root"), fetch=FAST_FETCH, ray=RaySettings(port_file=port_file)
    )
    agent = Agent(settings, before_recovery=failing_recovery)
    starting = asyncio.create_task(agent.start())
    try:
        await wait_until(port_file.exists, timeout_s=30, what="the port file")
        async with aiohttp.ClientSession() as session:
            ray = RayClient(session, agent.ray_address)
            asked = asyncio.create_task(ray.post("/get_runtime_envs_info", b""))
            await wait_until(lambda: door_waiting(agent) == 1, what="the request waiting")
            assert not asked.done()
            go.set()
            with pytest.raises(StartupError, match="injected"):
                await asyncio.wait_for(starting, 30)
            response = await asyncio.wait_for(asked, 30)
            assert response.status == 503
            assert "failed to start" in response.text
        assert not port_file.exists()
        _assert_closed(agent.ray_address)
    finally:
        go.set()
        await asyncio.wait([starting])
        shutil.rmtree(base, ignore_errors=True)


def door_waiting(agent: Agent) -> int:
    """Requests at ``agent``'s Ray door waiting for it to serve."""
    assert agent.ray_app is not None
    return ray_http.waiting(agent.ray_app)


def _assert_closed(address: str) -> None:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        assert probe.connect_ex((host, int(port))) != 0, f"{address} still listens"


async def test_the_ray_port_in_use_is_a_clear_startup_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        base = short_tempdir()
        try:
            agent = Agent(Settings(root=base / "root", ray=RaySettings(port=port)))
            said = rf"^cannot listen on 127.0.0.1:{port} \(--ray-address\): Address already in use"
            with pytest.raises(StartupError, match=said):
                await agent.start()
            assert agent.state is AgentState.STOPPED
            assert not (base / "root").exists(), "refused after the root was made"
        finally:
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("port_file", [False, True])
async def test_the_ray_doors_start_line_names_its_port_file_or_says_why_there_is_none(
    caplog: pytest.LogCaptureFixture, base: Path, port_file: bool
) -> None:
    """A door with no port file (``serve --ray-address``) was logged as '(port file None)'."""
    path = base / "port" if port_file else None
    with caplog.at_level(logging.INFO, logger="agent.ops.ray_door"):
        async with ray_agent(port_file=path) as (ra, _):
            address = ra.agent.ray_address
    (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Ray door")]
    told = (
        f"port file {path}" if port_file
        else "no port file: no raylet started this agent, so none waits for one"
    )  # fmt: skip
    assert said == f"Ray door on http://{address} ({told})"


async def test_serve_ray_address_opens_the_door_and_non_loopback_needs_allow_remote(
    base: Path,
) -> None:
    code, err = await refused(base / "refused.log", "--root", str(base / "r1"),
                              "--ray-address", "10.1.2.3:0")  # fmt: skip
    assert code == 2, err
    assert "not a loopback address; pass --allow-remote" in err
    assert len(err.strip().splitlines()) == 1

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "serve", "--root", str(base / "r2"),
        "--ray-address", "127.0.0.1:0", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "NO_PROXY": "127.0.0.1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [await asyncio.wait_for(proc.stdout.readline(), 60) for _ in range(2)]
        prefix = "rtenv-agent serving Ray's protocol on "
        assert lines[1].decode().startswith(prefix), lines
        address = lines[1].decode().strip().removeprefix(prefix)
        async with aiohttp.ClientSession() as session:
            reply = await RayClient(session, address).create('{"env_vars": {"A": "1"}}')
            assert reply.status == OK
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_until_served_a_request_is_bounded_and_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait at the door is bounded by READY_WAIT_S (not the hour-long max setup timeout):
    one that outlasts it is a 503 saying so."""
    monkeypatch.setattr(ray_http, "READY_WAIT_S", 0.3)
    base = short_tempdir()
    hold = asyncio.Event()

    async def held() -> None:
        await hold.wait()

    settings = replace(
        Settings(root=base / "root"), fetch=FAST_FETCH, max_setup_timeout_s=3600,
        ray=RaySettings(),
    )  # fmt: skip
    agent = Agent(settings, before_recovery=held)
    starting = asyncio.create_task(agent.start())
    try:
        await wait_until(lambda: bool(agent.ray_address), what="the Ray door")
        async with aiohttp.ClientSession() as session:
            ray = RayClient(session, agent.ray_address)
            response = await asyncio.wait_for(
                ray.post(
                    "/get_runtime_envs_info",
                    ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString(),
                ),
                10,
            )
            assert response.status == 503
            assert "still starting" in response.text
            hold.set()
            await asyncio.wait_for(starting, 30)
            assert (await ray.info()).total == 0
    finally:
        hold.set()
        await asyncio.wait([starting])
        await agent.stop(grace=0.5)
        shutil.rmtree(base, ignore_errors=True)


async def test_a_pip_env_runs_as_rays_worker_would_start_it(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The context run as Ray's worker runs it (variables expanded as ``update_envs`` does, then
    ``bash -c "<command_prefix> exec <py_executable> ..."``): the venv's python (Ray's
    semantics), in the working dir, imports the wheel from its own site-packages and Ray from
    the node's, and finds the venv's script first."""
    isolate_pip(monkeypatch)
    zip_path = tmp_path / "wd.zip"
    zip_path.write_bytes(workdir_zip({"wdmod.py": "VALUE = 'wd'\n"}))
    text = pip_env(["Alpha_Pkg"], wheels, working_dir=zip_path.as_uri())
    async with ray_agent() as (_, ray):
        reply = await ray.create(text, timeout_s=180)
        assert reply.status == OK, reply.error_message
        context = json.loads(reply.serialized_runtime_env_context)
        venv = context["env_vars"]["VIRTUAL_ENV"]
        assert context["py_executable"] == shlex.quote(f"{venv}/bin/python")  # one shell word
        env = dict(os.environ)
        for key, value in context["env_vars"].items():  # as Ray's update_envs
            env[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
        script = (
            "import alpha_pkg, os, ray, shutil, sys, wdmod; "
            "print(alpha_pkg.__file__); print(shutil.which('alpha-hello')); "
            "print(os.getcwd()); print(wdmod.VALUE); print(ray.__file__)"
        )
        command = [*context["command_prefix"], "exec", context["py_executable"], "-c",
                   shlex.quote(script)]  # fmt: skip
        code, out, err = await run("bash", "-c", " ".join(command), env=env, timeout_s=60)
        assert code == 0, err
        module, found, cwd, value, ray_module = out.splitlines()
        site = f"{venv}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
        assert site not in env["PYTHONPATH"].split(os.pathsep)  # the venv's python has it
        assert module.startswith(site)
        assert found == f"{venv}/bin/alpha-hello"
        assert (cwd, value) == (context["command_prefix"][1], "wd")
        assert not ray_module.startswith(venv), ray_module  # the node's Ray


def test_ray_address_parses_off_and_malformed_and_shows_in_config() -> None:
    assert parse_ray_address("") is None
    assert parse_ray_address("127.0.0.1:0") == RaySettings(host="127.0.0.1", port=0)
    with pytest.raises(ValueError, match="malformed"):
        parse_ray_address("no-port")
    settings = replace(Settings(root=Path("/r")), ray=parse_ray_address("[::1]:8000"))
    lines = effective(settings, {}, uv=None).splitlines()
    line = next(line for line in lines if line.startswith("ray-address"))
    assert "[::1]:8000" in line
