"""py_executable, the command a worker runs under, against a real agent (in-process, on a unix
socket): returned in the gRPC context, the hit path's too; real workers spawned by the simulated
scheduler under it (a python with flags, a wrapper script); and Ray's format, run as Ray's worker
runs it (``bash -c "exec <py_executable> ..."``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest

from agent.app.config import RaySettings
from raylet_sim import workers
from raylet_sim.client import AgentClient
from raylet_sim.pool import TaskSpec, WorkerPool
from raylet_sim.tasks import SPAWN_FAILED, TaskFailed
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from rtenv.v1 import agent_pb2
from tests.harness.in_process import running_agent
from tests.harness.packages import workdir_zip
from tests.harness.pip_wheels import run
from tests.harness.ray_door import RayClient
from tests.harness.tempdirs import short_tempdir

PROBE_PY = """import faulthandler, os, sys

def flags():
    return {"faulthandler": faulthandler.is_enabled(), "optimize": sys.flags.optimize,
            "wrapped": os.environ.get("RTENV_WRAPPED", ""), "executable": sys.executable}
"""


@asynccontextmanager
async def probe_package() -> AsyncIterator[tuple[Path, str]]:
    """A folder for test files and the URI of a working dir holding probe.py."""
    base = short_tempdir()
    try:
        package = base / "wd.zip"
        package.write_bytes(workdir_zip({"probe.py": PROBE_PY}, top=None))
        yield base, package.as_uri()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _env(working_dir: str, py_executable: str | None) -> str:
    env: dict[str, str] = {"working_dir": working_dir}
    if py_executable is not None:
        env["py_executable"] = py_executable
    return json.dumps(env)


async def test_a_create_returns_the_envs_py_executable_and_another_command_is_another_env() -> None:
    async with probe_package() as (_, wd), running_agent() as a:
        command = f"{shlex.quote(sys.executable)} -X faulthandler"
        first = await a.create(_env(wd, command))
        assert first.context.py_executable == command
        hit = await a.create(_env(wd, command))  # the hot path's prepared reply
        assert (hit.runtime_env_id, hit.context.py_executable) == (first.runtime_env_id, command)
        plain = await a.create(_env(wd, None))
        assert plain.runtime_env_id != first.runtime_env_id
        assert plain.context.py_executable == shlex.quote(a.agent.settings.py_executable)
        assert plain.context.cwd == first.context.cwd, "one working dir package for both"
        assert len((await a.info()).uris) == 1


async def test_the_simulated_scheduler_runs_its_workers_under_the_envs_py_executable() -> None:
    """A python with flags, a wrapper script that execs the python, and none (the agent's
    python): each worker reports what it runs under."""
    async with probe_package() as (base, wd), running_agent() as a:
        wrapper = base / "wrap.sh"
        wrapper.write_text(
            f'#!/bin/sh\nRTENV_WRAPPED="$0" exec {shlex.quote(sys.executable)} -O "$@"\n'
        )
        wrapper.chmod(0o755)
        flagged = _env(wd, f"{shlex.quote(sys.executable)} -X faulthandler")
        wrapped = _env(wd, f"{shlex.quote(str(wrapper))}")
        plain = _env(wd, None)
        async with grpc.aio.insecure_channel(a.agent.address) as channel:
            pool = WorkerPool(AgentClient(channel), idle_timeout_s=60.0)
            try:
                seen = {
                    name: await pool.run(TaskSpec(text, "probe:flags"))
                    for name, text in (("flagged", flagged), ("wrapped", wrapped), ("plain", plain))
                }
                pool.check_invariants()
            finally:
                await pool.close()
    assert seen["flagged"]["faulthandler"] is True
    assert (seen["flagged"]["optimize"], seen["flagged"]["wrapped"]) == (0, "")
    assert (seen["wrapped"]["optimize"], seen["wrapped"]["wrapped"]) == (1, str(wrapper))
    assert seen["wrapped"]["faulthandler"] is False
    assert (seen["plain"]["faulthandler"], seen["plain"]["optimize"]) == (False, 0)
    assert seen["plain"]["wrapped"] == ""


async def test_rays_worker_command_runs_the_envs_py_executable() -> None:
    """Ray's format: ``py_executable`` is the env's command, and ``bash -c "<command_prefix>
    exec <py_executable> <args>"`` (Ray's ``exec_worker``) runs the worker under it."""
    async with (
        probe_package() as (_, wd),
        running_agent(ray=RaySettings()) as a,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, a.agent.ray_address)
        command = f"{shlex.quote(sys.executable)} -X faulthandler -O"
        reply = await ray.create(_env(wd, command))
        assert reply.status == ray_pb2.AGENT_RPC_STATUS_OK, reply.error_message
        context = json.loads(reply.serialized_runtime_env_context)
        assert context["py_executable"] == command
        script = "import json, probe; print(json.dumps(probe.flags()))"
        line = [*context["command_prefix"], "exec", context["py_executable"], "-c",
                shlex.quote(script)]  # fmt: skip
        code, out, err = await run("bash", "-c", " ".join(line), timeout_s=60)
    assert code == 0, err
    flags = json.loads(out)
    assert (flags["faulthandler"], flags["optimize"]) == (True, 1)


@pytest.mark.parametrize(
    ("command", "words"),
    [("python '-X", "not shell words"), ("   ", "no command"), ("/no/such/python -X utf8", "")],
)
async def test_a_worker_command_that_cannot_start_fails_its_spawn_saying_why(
    command: str, words: str
) -> None:
    """A context from elsewhere than this agent (which refuses the first two when it parses)."""
    with pytest.raises(TaskFailed) as caught:
        await workers.spawn(agent_pb2.RuntimeEnvContext(py_executable=command))
    assert caught.value.status == SPAWN_FAILED
    assert words in str(caught.value)
    assert repr(command) in str(caught.value)


async def test_a_context_without_py_executable_runs_this_python_even_from_a_path_with_a_space(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's own python is the fallback, quoted as shell words like any command: split
    unquoted, a python under a folder with a space was two words and no worker started."""
    spaced = base / "a python here"
    spaced.mkdir()
    (spaced / "python").symlink_to(os.path.realpath(sys.executable))  # stdlib is enough
    monkeypatch.setattr(sys, "executable", str(spaced / "python"))
    proc = await workers.spawn(agent_pb2.RuntimeEnvContext(cwd=str(base)))
    try:
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert ready, "the worker wrote no ready line"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
