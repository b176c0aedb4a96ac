"""``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt`` through the Ray door of a real
agent (in-process, over 127.0.0.1), wheels offline: the venv is built from the file in the
env's installed working dir and shared with every env whose file says the same; a missing file
fails the create saying so, gives back the working dir, and the agent serves on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.uris import UriKind
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.in_process import RunningAgent
from tests.harness.packages import workdir_zip
from tests.harness.pip_wheels import isolate_pip, offline
from tests.harness.ray_door import ray_agent

OK = ray_pb2.AGENT_RPC_STATUS_OK
FAILED = ray_pb2.AGENT_RPC_STATUS_FAILED
LINE = "-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt"
SETUP_S = 180


def env_text(tmp_path: Path, name: str, files: dict[str, str], wheels: Path) -> str:
    """A Ray env: a working dir zip of ``files``, and a pip field reading its requirements."""
    path = tmp_path / f"{name}.zip"
    path.write_bytes(workdir_zip(files))
    pip = {"packages": [LINE], "pip_install_options": offline(wheels)}
    return json.dumps({"working_dir": path.as_uri(), "pip": pip})


def venv_keys(ra: RunningAgent) -> dict[str, int]:
    """The Ray-semantics pip venvs the agent counts, with their counts."""
    return {k.uri: n for k, n in ra.service.tables.uris() if k.kind is UriKind.RAY_PIP}


async def test_the_working_dirs_file_makes_one_venv_shared_by_envs_saying_the_same(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two working dirs (two envs) whose files name the same requirements, in another order and
    another spelling: one venv, counted by both; each env gives it back."""
    isolate_pip(monkeypatch)
    one = env_text(tmp_path, "one", {"requirements.txt": "Alpha_Pkg\n"}, wheels)
    two = env_text(tmp_path, "two", {"requirements.txt": "# same\nalpha-pkg  # c\n"}, wheels)
    async with ray_agent() as (ra, ray):
        first = await ray.create(one, timeout_s=SETUP_S)
        assert first.status == OK, first.error_message
        second = await ray.create(two, timeout_s=SETUP_S)
        assert second.status == OK, second.error_message
        contexts = [json.loads(r.serialized_runtime_env_context) for r in (first, second)]
        venv = contexts[0]["env_vars"]["VIRTUAL_ENV"]
        assert contexts[1]["env_vars"]["VIRTUAL_ENV"] == venv
        assert contexts[0]["py_executable"] == f"{venv}/bin/python"
        assert (Path(venv) / "bin" / "alpha-hello").exists()
        assert list(venv_keys(ra).values()) == [2]
        assert contexts[0]["command_prefix"] != contexts[1]["command_prefix"]  # two working dirs

        for text in (one, two):
            assert (await ray.delete(text)).status == OK
        assert venv_keys(ra) == {}  # uncounted: cached, evictable
        ra.service.check_invariants()


async def test_a_missing_file_fails_the_create_saying_so_and_loses_nothing(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_pip(monkeypatch)
    text = env_text(tmp_path, "none", {"app.py": "A = 1\n"}, wheels)
    async with ray_agent() as (ra, ray):
        failed = await ray.create(text, timeout_s=SETUP_S)
        assert failed.status == FAILED
        assert "the working dir has no requirements file 'requirements.txt'" in (
            failed.error_message
        )
        assert dict(ra.service.tables.uris()) == {}  # the working dir given back
        ra.service.check_invariants()
        served = await ray.create('{"env_vars": {"A": "1"}}')
        assert served.status == OK, served.error_message
