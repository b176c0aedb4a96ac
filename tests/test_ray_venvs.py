"""pip and uv envs under Ray have Ray's semantics (on this agent as on Ray's): the worker runs
under the venv's python, which sees the node's packages after its own, so a ``python`` found on
``PATH`` imports Ray (the pattern of ``ray job submit --runtime-env-json '{"pip": ...}' --
python job.py``, whose entrypoint is such a subprocess), and ``.pth`` files of the env's
packages (editable installs) are processed. One node serves the module; wheels offline."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.pip_wheels import local_project, offline
from tests.harness.ray_nodes import (
    OURS,
    PIP_OK,
    Json,
    RayNode,
    agent_info,
    drive,
    ray_nodes,
    wait_counts_zero,
)
from tests.harness.uv_wheels import module_wheel

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not PIP_OK, reason="Ray's agent needs virtualenv for pip envs"),
]

PTH_MODULE = "pth_only_mod"  # importable only through the wheel's .pth
DASHBOARD = importlib.util.find_spec("aiohttp_cors") is not None  # ray[default]: jobs
JOB_S = 240.0
JOB = """
import ray
import gamma_pkg

@ray.remote
def value():
    import gamma_pkg
    return gamma_pkg.VALUE

ray.init()
print("JOB SAW", gamma_pkg.VALUE, ray.get(value.remote()))
"""
IMPORT_RAY = ["python", "-c", "import ray, sys; print('ray', ray.__version__, sys.prefix)"]


@pytest.fixture(scope="module")
def node() -> Iterator[RayNode]:
    with ray_nodes(1, num_cpus=2, dashboard=DASHBOARD) as (head,):
        yield head


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def pth_wheel(folder: Path) -> Path:
    """A wheel as an editable install is: its module lives in a folder that only its ``.pth``
    puts on the path."""
    files = {
        "pthdemo.pth": b"pthdemo_src\n",
        f"pthdemo_src/{PTH_MODULE}.py": b"VALUE = 'through the pth'\n",
        "pthdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pthdemo\nVersion: 1.0\n",
        "pthdemo-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [_record_line(name, data) for name, data in files.items()]
    record.append("pthdemo-1.0.dist-info/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pthdemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("pthdemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _assert_ray_semantics(seen: Json, name: str) -> None:
    assert "error" not in seen, seen
    assert seen["modules"] == {"gamma_pkg": "gamma 1.0", PTH_MODULE: "through the pth"}, seen
    (imported,) = seen["commands"]
    assert imported["code"] == 0, f"{name}: `python -c 'import ray'` from PATH: {imported}"
    prefix = imported["out"].split()[-1]
    assert seen["executable"].startswith(prefix), seen  # the worker runs the venv's python
    assert seen["env"]["VIRTUAL_ENV"] == prefix, seen


def test_pip_and_uv_workers_run_the_venvs_python_which_sees_ray_and_processes_pth_files(
    node: RayNode, wheels: Path, tmp_path: Path
) -> None:
    """A task and an actor in a pip env (and, on this agent, a uv env) run under the venv's
    python (VIRTUAL_ENV), import a module only a .pth puts on the path, and a `python` run
    from PATH imports Ray."""
    extra = tmp_path / "extra"
    pth_wheel(extra)
    options = [*offline(wheels), "--find-links", str(extra)]
    spec = {"modules": ["gamma_pkg", PTH_MODULE], "env": ["VIRTUAL_ENV"], "commands": [IMPORT_RAY]}
    cases: list[Json] = [
        {
            "name": "pip",
            "runtime_env": {"pip": {"packages": ["gamma_pkg", "pthdemo"],
                                    "pip_install_options": options}},
            "spec": spec,
        },
    ]  # fmt: skip
    if OURS:  # Ray's own agent would pip-install uv from an index first
        uv = {"packages": ["gamma_pkg", "pthdemo"], "uv_pip_install_options": options}
        cases.append({"name": "uv", "runtime_env": {"uv": uv}, "spec": spec})
    got = drive(node, "probe", {"cases": cases})
    for case in cases:
        for kind in ("task", "actor"):
            _assert_ray_semantics(got[case["name"]][kind], f"{case['name']} {kind}")
    if OURS:  # info says which venvs are Ray's: their own kinds, never the gRPC door's
        wait_counts_zero(node)
        kinds = {u.kind for u in agent_info(node).uris}
        assert {"ray_pip", "ray_uv"} <= kinds, kinds
        assert not kinds & {"pip", "uv"}, kinds


@pytest.mark.skipif(not DASHBOARD, reason="ray job submit needs ray[default] (the dev extra)")
def test_ray_job_submit_with_pip_runs_python_from_path_in_the_env(
    node: RayNode, wheels: Path, tmp_path: Path
) -> None:
    """`ray job submit --runtime-env-json '{"pip": ...}' -- python job.py`, Ray's everyday job
    pattern: the entrypoint's `python` (the venv's, first on PATH) imports Ray and the env's
    packages, and so do the job's tasks."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {"pip": {"packages": ["gamma_pkg"], "pip_install_options": offline(wheels)}}
    address = f"http://{node.ip}:{node.ports['dashboard-port']}"
    done = subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", address,
         "--runtime-env-json", json.dumps(env), "--", "python", str(job)],
        env=node.env, capture_output=True, text=True, timeout=JOB_S, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "JOB SAW gamma 1.0 gamma 1.0" in out, out[-4000:]


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_a_requirements_file_of_the_working_dir_makes_the_venv(
    node: RayNode, wheels: Path, tmp_path: Path, tool: str
) -> None:
    """`-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt` in pip (and, on this agent,
    uv) packages, Ray's documented form: the venv is built from the file in the job's uploaded
    working dir, its own `-r` naming a file beside it, and the workers run that venv."""
    if tool == "uv" and not OURS:
        pytest.skip("Ray's own agent would pip-install uv from an index first")
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "requirements.txt").write_text("# the job's requirements\n-r more.txt\n")
    (wd / "more.txt").write_text("gamma_pkg  # from the nested file\n")
    line = "-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt"
    options_field = "pip_install_options" if tool == "pip" else "uv_pip_install_options"
    job_env = {"working_dir": str(wd), tool: {"packages": [line], options_field: offline(wheels)}}
    spec = {"modules": ["gamma_pkg"], "env": ["VIRTUAL_ENV"], "files": ["more.txt"]}
    got = drive(node, "job", {"job_env": job_env, "spec": spec})
    for kind in ("task", "actor"):
        seen = got[kind]
        assert "error" not in seen, seen
        assert seen["modules"] == {"gamma_pkg": "gamma 1.0"}, seen
        assert seen["files"]["more.txt"].startswith("gamma_pkg"), seen  # in the working dir
        venv = seen["env"]["VIRTUAL_ENV"]
        assert venv, seen
        assert seen["executable"].startswith(venv), seen
    if OURS:  # the venv is the Ray door's kind, counted and given back with the env
        wait_counts_zero(node)
        kinds = {u.kind for u in agent_info(node).uris}
        assert f"ray_{tool}" in kinds, kinds


def test_a_wheel_path_and_a_local_folder_in_pip_run_a_task_and_a_rebuilt_wheel_is_a_new_venv(
    node: RayNode, tmp_path: Path
) -> None:
    """`"pip": ["/abs/tinydep-1.0-py3-none-any.whl", "/abs/proj"]`, everyday Ray idioms Ray's
    agent installs (issue 37: this agent said 'is not a requirement'). Once the job is gone and
    its env released, a wheel rebuilt at the same path is a new venv here (Ray's own agent keys
    its venv by the strings alone, and would keep the old one)."""
    wheels = tmp_path / "my wheels"
    wheels.mkdir()
    wheel = module_wheel(wheels, "tinydep", "one")
    folder = local_project(tmp_path / "proj", "projmod", "from the folder")
    env = {"pip": {"packages": [str(wheel), str(folder)], "pip_install_options": ["--no-index"]}}
    spec = {"modules": ["tinydep", "projmod"], "env": ["VIRTUAL_ENV"]}
    cases = [{"name": "local", "runtime_env": env, "spec": spec}]
    first = drive(node, "probe", {"cases": cases, "tasks_only": True})["local"]["task"]
    assert "error" not in first, first
    assert first["modules"] == {"tinydep": "one", "projmod": "from the folder"}, first
    venv = first["env"]["VIRTUAL_ENV"]
    assert venv, first
    assert first["executable"].startswith(venv), first
    if not OURS:
        return
    wait_counts_zero(node)  # the job's env released: its next create reads the files again
    module_wheel(wheels, "tinydep", "two")
    second = drive(node, "probe", {"cases": cases, "tasks_only": True})["local"]["task"]
    assert "error" not in second, second
    assert second["modules"] == {"tinydep": "two", "projmod": "from the folder"}, second
    assert second["env"]["VIRTUAL_ENV"] != venv, "a new venv for the new bytes"
