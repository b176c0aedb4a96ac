"""Wheels in py_modules (issue 31): a ``.whl`` is pip-installed into its folder as Ray's agent
installs it (``pip install <wheel> --target=<dir>``), the folder put on the worker's path, and
the package counted, shared and released per URI like every package."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from agent.app.config import RaySettings
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import make_zip
from tests.harness.ray_door import RayClient
from tests.harness.uv_wheels import module_wheel


def _wheel(folder: Path, module: str, value: str) -> tuple[str, bytes]:
    """A pure-python wheel (the benchmark's builder): its PEP 427 file name and its bytes;
    ``import <module>`` gives ``VALUE == value``."""
    wheel = module_wheel(folder, module, value)
    return wheel.name, wheel.read_bytes()


def _import_value(pythonpath: str, module: str) -> str:
    """What ``module.VALUE`` is for a python given that PYTHONPATH (bounded in time)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}; print({module}.VALUE)"],
        env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_a_wheel_in_py_modules_is_installed_and_importable_beside_a_zip(
    tmp_path: Path,
) -> None:
    name, wheel = _wheel(tmp_path, "wheelmod", "from a wheel")
    async with package_server() as pkgs, running_agent() as a:
        whl_url = pkgs.add(name, wheel)
        zip_url = pkgs.add("zipmod.zip", make_zip({"zipmod/__init__.py": b"VALUE = 'zip'\n"}))
        reply = await a.create(json.dumps({"py_modules": [zip_url, whl_url]}))
        path = reply.context.env_vars["PYTHONPATH"]
        folders = path.split(os.pathsep)
        wheel_dir = Path(folders[1])
        assert (wheel_dir / "wheelmod" / "__init__.py").is_file(), "installed by pip --target"
        assert not list(wheel_dir.rglob("*.whl")), "the wheel file itself is removed"
        assert any(p.name.endswith(".dist-info") for p in wheel_dir.iterdir())
        assert _import_value(path, "wheelmod") == "from a wheel"
        assert _import_value(path, "zipmod") == "zip"
        assert list(reply.uris) == [f"py_modules:{zip_url}", f"py_modules_wheel:{whl_url}"]
        a.service.check_invariants()


async def test_a_wheel_is_installed_once_for_two_envs_and_released_per_uri(
    tmp_path: Path,
) -> None:
    name, wheel = _wheel(tmp_path, "sharedmod", "shared")
    async with package_server() as pkgs, running_agent() as a:
        url = pkgs.add(name, wheel)
        first = await a.create(json.dumps({"py_modules": [url]}))
        second = await a.create(json.dumps({"py_modules": [url], "env_vars": {"B": "1"}}))
        assert first.runtime_env_id != second.runtime_env_id
        assert pkgs.gets[name] == 1, "downloaded and installed once for both envs"
        assert first.context.env_vars["PYTHONPATH"] == second.context.env_vars["PYTHONPATH"]
        info = await a.info()
        (package,) = [p for p in info.uris if p.kind == "py_modules_wheel"]
        assert package.references == 2
        await a.delete(first.runtime_env_id)
        await a.delete(second.runtime_env_id)
        info = await a.info()
        (package,) = [p for p in info.uris if p.kind == "py_modules_wheel"]
        assert package.references == 0
        a.service.check_invariants()


async def test_a_wheel_not_matching_its_pinned_digest_is_refused_and_installs_nothing(
    tmp_path: Path,
) -> None:
    name, wheel = _wheel(tmp_path, "pinnedmod", "pinned")
    async with package_server() as pkgs, running_agent() as a:
        url = pkgs.add(name, wheel) + "#sha256=" + hashlib.sha256(b"other").hexdigest()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.create(json.dumps({"py_modules": [url]}))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "sha256" in (caught.value.details() or "")
        info = await a.info()
        assert [p for p in info.uris if p.kind == "py_modules_wheel"] == []
        a.service.check_invariants()


async def test_a_wheel_pip_cannot_install_fails_with_pips_own_words(
    tmp_path: Path,
) -> None:
    name, _ = _wheel(tmp_path, "brokenmod", "x")
    async with package_server() as pkgs, running_agent() as a:
        url = pkgs.add(name, b"this is not a zip archive")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.create(json.dumps({"py_modules": [url]}))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
        assert "brokenmod" in (caught.value.details() or ""), caught.value.details()
        a.service.check_invariants()


def _python_without_pip(venv: Path) -> str:
    """A venv's python made without pip (set up before the agent's loop runs)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import pip"], capture_output=True, timeout=60, check=False
    )
    assert probe.returncode != 0, "the node's python has no pip"
    return python


async def test_a_node_python_without_pip_has_its_wheel_installed_by_uv(tmp_path: Path) -> None:
    """A node's python made without pip (as uv makes venvs): uv installs the wheel for it,
    where ``python -m pip`` would fail with "No module named pip" (Ray's agent runs whatever
    pip is on its PATH)."""
    python = _python_without_pip(tmp_path / "bare")
    name, wheel = _wheel(tmp_path, "uvwheelmod", "by uv")
    async with package_server() as pkgs, running_agent(py_executable=python) as a:
        url = pkgs.add(name, wheel)
        reply = await a.create(json.dumps({"py_modules": [url]}))
        path = reply.context.env_vars["PYTHONPATH"]
        assert _import_value(path, "uvwheelmod") == "by uv"
        logs = list((a.root / "logs").glob("py_modules_wheel-*.log"))
        assert any("No module named" in log.read_text() for log in logs), "pip asked first"


async def test_rays_door_drops_a_remote_py_modules_zips_top_folder_as_ray_does(
    tmp_path: Path,
) -> None:
    """Ray's agent unpacks a remote (non-gcs) py_modules zip without its single top folder; the
    gRPC door keeps it: two packages of one URI, told apart by kind."""
    async with (
        package_server() as pkgs,
        running_agent(ray=RaySettings()) as a,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, a.agent.ray_address)
        url = pkgs.add("top.zip", make_zip({"top/topmod/__init__.py": b"VALUE = 'top'\n"}))
        name, wheel = _wheel(tmp_path, "raywheel", "ray wheel")
        whl_url = pkgs.add(name, wheel)
        text = json.dumps({"py_modules": [url, whl_url]})
        reply = await ray.create(text)
        assert reply.status == ray_pb2.AGENT_RPC_STATUS_OK, reply.error_message
        context = json.loads(reply.serialized_runtime_env_context)
        path = context["env_vars"]["PYTHONPATH"]
        zip_dir = Path(path.split(os.pathsep)[0])
        assert (zip_dir / "topmod" / "__init__.py").is_file(), "the top folder dropped"
        assert _import_value(path, "topmod") == "top"
        assert _import_value(path, "raywheel") == "ray wheel"
        grpc_reply = await a.create(text)
        grpc_dir = Path(grpc_reply.context.env_vars["PYTHONPATH"].split(os.pathsep)[0])
        assert (grpc_dir / "top" / "topmod" / "__init__.py").is_file(), "kept by the gRPC door"
        kinds = {u.kind for u in (await a.info()).uris}
        assert {"py_modules", "ray_py_modules", "py_modules_wheel"} <= kinds
        a.service.check_invariants()
