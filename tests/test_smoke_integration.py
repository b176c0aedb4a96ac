"""In-process integration: a real agent on a unix socket, packages from a real HTTP server."""

from __future__ import annotations

import os

import grpc
import pytest

from rtenv.v1 import agent_pb2
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, module_zip, workdir_zip


async def test_create_returns_a_context_whose_paths_hold_the_packages() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add("wd.zip", workdir_zip({"main.py": "print('hi')\n", "data/x.txt": "x"}))
        mod = pkgs.add("mod.zip", module_zip("mymod", "one"))
        reply = await a.create(env_json(wd, [mod], {"A": "1"}))
        ctx = reply.context
        assert os.path.isfile(os.path.join(ctx.cwd, "main.py"))
        assert os.path.isfile(os.path.join(ctx.cwd, "data", "x.txt"))
        paths = ctx.env_vars["PYTHONPATH"].split(os.pathsep)
        assert paths[0] == ctx.cwd
        assert os.path.isfile(os.path.join(paths[1], "mymod", "__init__.py"))
        assert ctx.env_vars["A"] == "1"
        assert list(reply.uris) == [f"working_dir:{wd}", f"py_modules:{mod}"]
        info = await a.info()
        assert info.total_envs == 1
        assert info.envs[0].references == 1
        assert await a.delete(reply.runtime_env_id) == 0
        info = await a.info()
        assert info.total_envs == 0
        assert {u.state for u in info.uris} == {"unused"}
        a.service.check_invariants()


async def test_info_shows_the_job_ids_and_eager_install_of_an_envs_creates() -> None:
    """CreateRuntimeEnvRequest.job_id and config.eager_install reach RuntimeEnvInfo; a job id
    over the limit is INVALID_ARGUMENT naming the limit, and counts nothing."""
    async with running_agent() as a:
        text = env_json(env_vars={"A": "1"})

        async def create(job_id: str, eager: bool) -> agent_pb2.CreateRuntimeEnvReply:
            request = agent_pb2.CreateRuntimeEnvRequest(
                serialized_runtime_env=text, job_id=job_id,
                config=agent_pb2.RuntimeEnvConfig(eager_install=eager),
            )  # fmt: skip
            reply: agent_pb2.CreateRuntimeEnvReply = await a.stub.CreateRuntimeEnv(
                request, timeout=30
            )
            return reply

        await create("01000000", True)
        await create("02000000", True)
        [env] = (await a.info()).envs
        assert (list(env.job_ids), env.eager_install) == (["01000000", "02000000"], True)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await create("j" * 129, True)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "job_id 'jjjj" in (details := caught.value.details() or "")
        assert "is 129 bytes; the limit is 128" in details
        [env] = (await a.info()).envs
        assert env.references == 2
