"""A pip env end to end: a raylet_sim Node, the real agent as its sidecar process, and a real
worker started on the venv's python that imports the wheel installed in it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from raylet_sim.node import Node
from raylet_sim.pool import TaskSpec
from tests.harness.package_server import package_server
from tests.harness.packages import workdir_zip
from tests.harness.pip_wheels import isolate_pip, pip_env
from tests.harness.tempdirs import short_tempdir

TASK = """\
import importlib.util, os, sys
import alpha_pkg


def run():
    return {"executable": sys.executable, "prefix": sys.prefix, "value": alpha_pkg.VALUE,
            "module": alpha_pkg.__file__, "cwd": os.getcwd(),
            "grpc": importlib.util.find_spec("grpc") is not None}
"""


@pytest.fixture(autouse=True)
def agent_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar agent inherits this environment. Its pip sees none of this machine's pip
    configuration, only the install's own options. And gRPC's fork support is off: the
    workaround for the bug pinned by test_pip_env.py's
    test_installer_spawns_survive_grpc_traffic_in_the_agent (an installer forked from the
    agent's gRPC process with a preexec_fn crashes now and then before it execs)."""
    isolate_pip(monkeypatch)


async def test_a_worker_of_a_pip_env_runs_on_the_venv_python_and_imports_the_wheel(
    wheels: Path,
) -> None:
    base = short_tempdir()
    root = base / "root"
    node = Node(root, idle_timeout_s=60.0, agent_args=("--log-level", "WARNING"))
    try:
        async with package_server() as packages:
            url = packages.add("app.zip", workdir_zip({"pip_task.py": TASK}))
            env = pip_env(["ALPHA_PKG"], wheels, working_dir=url)
            await asyncio.wait_for(node.start(), 60)
            assert node.pool is not None
            assert node.client is not None
            result: dict[str, Any] = await asyncio.wait_for(
                node.run(TaskSpec(env, "pip_task:run"), task_id="1"), 120
            )
            context = node.pool.slots[env].context
            assert context is not None
            venv = Path(context.py_executable).parent.parent
            assert venv.parent == root.resolve() / "uris"
            assert venv.name.startswith("pip-")
            assert result["executable"] == context.py_executable
            assert result["prefix"] == str(venv)
            assert result["value"] == "alpha 1.0"
            assert result["module"].startswith(f"{venv}/lib/")
            assert result["cwd"] == context.cwd
            assert not result["grpc"], "the worker sees the agent's own packages"

            info = await node.client.info()
            pip_refs = {u.uri: u.references for u in info.uris if u.kind == "pip"}
            assert list(pip_refs.values()) == [1], "the worker's env holds its venv"
            await asyncio.wait_for(node.pool.close(), 30)
            info = await node.client.info()
            assert [u.references for u in info.uris if u.kind == "pip"] == [0]
    finally:
        await asyncio.wait_for(node.stop(), 60)
        shutil.rmtree(base, ignore_errors=True)
