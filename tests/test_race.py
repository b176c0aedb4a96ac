"""The race that motivated the design, made deterministic with the package server's gate.

Env A holds URI X. A create of env B (X and Y) takes its references, then waits on Y's download,
held at the server. A is deleted and eviction runs with a zero budget. X must survive: the
agent counted B's reference on X before its first await, so X is never unused while B needs it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, module_zip, workdir_zip
from tests.harness.polling import wait_until

X_ZIP = "x.zip"
Y_ZIP = "y.zip"


def uri_info(info: agent_pb2.GetRuntimeEnvsInfoReply, uri: str) -> agent_pb2.UriInfo:
    found = [u for u in info.uris if u.uri == uri]
    assert len(found) == 1, f"{uri} listed {len(found)} times in {info.uris}"
    return found[0]


def listing(a: RunningAgent, sub: str) -> list[str]:
    """What is under ``sub``: for tmp/ and trash/, what is in the agents' own folders there."""
    return listed(a.root, sub)


def on_disk(path: str | Path) -> bool:
    """Whether anything (a dangling symlink included) exists at ``path``; a direct, quick stat."""
    return os.path.lexists(path)


async def assert_nothing_left(a: RunningAgent) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """No env, no URI, and uris/, tmp/ and trash/ empty once background deletions are done."""
    await a.settle()
    info = await a.info()
    assert info.total_envs == 0
    assert [e for e in info.envs if e.state != "failed"] == []
    assert list(info.uris) == []
    assert (listing(a, "uris"), listing(a, "tmp"), listing(a, "trash")) == ([], [], [])
    assert info.cache.used_bytes == 0
    assert info.cache.unused_bytes == 0
    a.service.check_invariants()
    return info


async def test_uri_shared_with_an_env_being_created_survives_deletion_of_its_other_env() -> None:
    """Deleting A and evicting with a zero budget while B's create is held keeps X for B."""
    async with package_server() as pkgs, running_agent(cache_budget_bytes=0) as a:
        x = pkgs.add(X_ZIP, workdir_zip({"main.py": "X = 1\n"}))
        y = pkgs.add(Y_ZIP, module_zip("ymod", "y"))
        env_a = await a.create(env_json(x))
        x_dir = Path(env_a.context.cwd)
        assert (x_dir / "main.py").is_file()

        gate = pkgs.hold(Y_ZIP)
        b_call = asyncio.create_task(a.create(env_json(x, [y])))
        # Y is requested only after B's create took its references (before its first await).
        await asyncio.wait_for(pkgs.requested(Y_ZIP).wait(), timeout=10)
        a.service.check_invariants()
        info = await a.info()
        assert uri_info(info, x).references == 2

        assert await a.delete(env_a.runtime_env_id) == 0
        await a.service.store.enforce_budget()  # force eviction: the budget is zero
        await a.settle()
        a.service.check_invariants()
        assert (x_dir / "main.py").is_file(), "X was deleted while B's create needed it"
        info = await a.info()
        ux = uri_info(info, x)
        assert (ux.references, ux.state) == (1, "ready")
        uy = uri_info(info, y)
        assert (uy.references, uy.state) == (1, "installing")
        assert info.cache.evictions == 0
        assert not b_call.done()

        gate.set()
        env_b = await asyncio.wait_for(b_call, timeout=10)
        assert env_b.context.cwd == str(x_dir)
        paths = env_b.context.env_vars["PYTHONPATH"].split(os.pathsep)
        assert paths[0] == str(x_dir)
        y_dir = Path(paths[1])
        assert (x_dir / "main.py").is_file()
        assert (y_dir / "ymod" / "__init__.py").is_file()
        info = await a.info()
        assert [(e.runtime_env_id, e.references) for e in info.envs] == [(env_b.runtime_env_id, 1)]
        assert (uri_info(info, x).references, uri_info(info, x).state) == (1, "ready")
        assert info.cache.downloads == 2
        assert pkgs.gets[X_ZIP] == 1
        a.service.check_invariants()

        assert await a.delete(env_b.runtime_env_id) == 0
        info = await assert_nothing_left(a)
        assert not on_disk(x_dir)
        assert not on_disk(y_dir)
        assert info.cache.evictions == 2


async def test_client_cancel_of_a_held_create_releases_its_references_and_leaks_nothing() -> None:
    """B's create cancelled by the client while held: X drops to 0 and is evicted; Y's install,
    which nobody waits for any more, is cancelled and leaves no file."""
    async with package_server() as pkgs, running_agent(cache_budget_bytes=0) as a:
        x = pkgs.add(X_ZIP, workdir_zip({"main.py": "X = 1\n"}))
        y = pkgs.add(Y_ZIP, module_zip("ymod", "y"))
        env_a = await a.create(env_json(x))
        x_dir = Path(env_a.context.cwd)

        gate = pkgs.hold(Y_ZIP)
        request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(x, [y]))
        call = a.stub.CreateRuntimeEnv(request, timeout=30)
        await asyncio.wait_for(pkgs.requested(Y_ZIP).wait(), timeout=10)
        assert await a.delete(env_a.runtime_env_id) == 0
        assert on_disk(x_dir), "X was deleted while B's create needed it"
        a.service.check_invariants()

        assert call.cancel()
        assert await call.code() == grpc.StatusCode.CANCELLED

        async def references_gone() -> bool:
            info = await a.info()
            return info.total_envs == 0 and all(u.references == 0 for u in info.uris)

        await wait_until(references_gone, what="the cancelled create to give back X and Y")
        await wait_until(lambda: not list(a.service.store.entries()), what="Y's install to stop")
        a.service.check_invariants()
        await a.settle()
        assert not on_disk(x_dir), "X, unused under a zero budget, should be evicted"
        gate.set()  # too late: nobody downloads Y any more
        info = await assert_nothing_left(a)
        assert info.cache.evictions == 1
        assert info.cache.downloads == 1  # X's; Y's was cancelled mid-download

        # The agent still serves: B downloads both packages afresh.
        env_b = await a.create(env_json(x, [y]))
        assert (Path(env_b.context.cwd) / "main.py").is_file()
        assert (pkgs.gets[X_ZIP], pkgs.gets[Y_ZIP]) == (2, 2)
        assert await a.delete(env_b.runtime_env_id) == 0
        await assert_nothing_left(a)


async def test_uri_still_installing_for_a_cancelled_create_is_kept_for_the_other_env() -> None:
    """X's install started by A, whose create is cancelled; B needs X too and gets it whole."""
    async with package_server() as pkgs, running_agent(cache_budget_bytes=0) as a:
        x = pkgs.add(X_ZIP, workdir_zip({"main.py": "X = 1\n"}))
        y = pkgs.add(Y_ZIP, module_zip("ymod", "y"))
        gate = pkgs.hold(X_ZIP)
        call_a = a.stub.CreateRuntimeEnv(
            agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=env_json(x)), timeout=30
        )
        await asyncio.wait_for(pkgs.requested(X_ZIP).wait(), timeout=10)
        b_call = asyncio.create_task(a.create(env_json(x, [y])))
        await wait_until(lambda: len(a.service.tables) == 2, what="B's create to count")
        await asyncio.wait_for(pkgs.requested(Y_ZIP).wait(), timeout=10)

        assert call_a.cancel()
        await wait_until(lambda: len(a.service.tables) == 1, what="A's create to give back")
        await a.service.store.enforce_budget()
        a.service.check_invariants()
        info = await a.info()
        assert (uri_info(info, x).references, uri_info(info, x).state) == (1, "installing")

        gate.set()
        env_b = await asyncio.wait_for(b_call, timeout=10)
        assert (Path(env_b.context.cwd) / "main.py").is_file()
        assert pkgs.gets[X_ZIP] == 1
        info = await a.info()
        assert info.cache.evictions == 0
        assert (uri_info(info, x).references, uri_info(info, x).state) == (1, "ready")
        a.service.check_invariants()

        assert await a.delete(env_b.runtime_env_id) == 0
        info = await assert_nothing_left(a)
        assert info.cache.evictions == 2
