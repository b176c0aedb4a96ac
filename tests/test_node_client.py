"""A client in a second language: Node.js, built from proto/ alone, against a real agent."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip, module_zip, workdir_zip

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"


@pytest.fixture(scope="module")
def node_client() -> Path:
    """The client with its packages installed by `npm ci` from the committed lockfile."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not on PATH")
    if not (CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CLIENT, check=True, timeout=600,
        )  # fmt: skip
    return CLIENT / "client.js"


async def _run_node(client: Path, address: str, env: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node", str(client), "--address", address, "--env", env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


async def test_node_client_sees_what_the_python_client_sees(node_client: Path) -> None:
    """Same env id for the env written with its keys in another order, the same context, the
    two clients' references counted together, and every count back to 0."""
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add("wd.zip", workdir_zip({"main.py": "print('hi')\n"}))
        mod = pkgs.add("mod.zip", module_zip("nodemod", "n"))
        jar = pkgs.add("lib.jar", make_zip({"META-INF/MANIFEST.MF": "Manifest-Version: 1.0\n"}))
        python_env = env_json(wd, [mod], {"LANG_OF_CLIENT": "any"}, java_jars=[jar])
        node_env = json.dumps(
            {"java_jars": [jar], "env_vars": {"LANG_OF_CLIENT": "any"}, "py_modules": [mod],
             "working_dir": wd}
        )  # fmt: skip
        assert node_env != python_env
        held = await a.create(python_env)

        result = await _run_node(node_client, a.agent.address, node_env)

        created = result["created"]
        assert created["runtime_env_id"] == held.runtime_env_id
        assert created["context"]["env_vars"] == dict(held.context.env_vars)
        assert created["context"]["cwd"] == held.context.cwd
        assert created["context"]["py_executable"] == held.context.py_executable
        assert created["context"]["java_jars"] == list(held.context.java_jars)
        assert len(held.context.java_jars) == 1
        assert created["uris"] == list(held.uris)
        (env_info,) = result["info"]["envs"]
        assert env_info["references"] == 2  # the Python client's and the Node client's
        assert result["remaining"] == 1
        (after,) = result["after"]["envs"]
        assert after["references"] == 1
        assert (pkgs.gets["wd.zip"], pkgs.gets["mod.zip"], pkgs.gets["lib.jar"]) == (1, 1, 1)

        assert await a.delete(held.runtime_env_id) == 0
        info = await a.info()
        assert info.total_envs == 0
        assert [u.references for u in info.uris] == [0, 0, 0]
        a.service.check_invariants()


async def test_node_client_gets_the_status_code_of_a_bad_env(node_client: Path) -> None:
    """An error reaches a Node client as its gRPC status and message."""
    async with running_agent() as a:
        proc = await asyncio.create_subprocess_exec(
            "node", str(node_client), "--address", a.agent.address,
            "--env", '{"conda": ["numpy"]}',
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 1
        assert "FAILED_PRECONDITION" in err.decode()
        assert "'conda' cannot be used on this node: it needs a conda installation" in err.decode()


def _node_usage(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the client with ``args`` (no agent, no packages needed: usage comes first)."""
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH")
    return subprocess.run(
        ["node", str(CLIENT / "client.js"), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_node_client_help_prints_usage_and_exits_0(flag: str) -> None:
    done = _node_usage(flag)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: node client.js --address ADDR --env JSON")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "--address and --env are required"),
        (("--address",), "--address needs a value"),
        (("--env", "{}"), "--address and --env are required"),
        (("--bogus", "x"), 'unknown argument "--bogus"'),
        (("--address", "unix:/x", "--env", "{}", "--timeout-ms", "soon"), "--timeout-ms must be"),
    ],
)
def test_node_client_usage_mistakes_get_one_line_and_exit_2(
    args: tuple[str, ...], says: str
) -> None:
    """No stack trace: one line naming the mistake, exit status 2."""
    done = _node_usage(*args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr
    assert "(--help for usage)" in done.stderr
