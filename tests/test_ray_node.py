"""One real Ray node (``ray start --head``, its raylet launching this agent; see
tests/ray_harness.py for the switch to Ray's own) runs tasks and actors whose runtime envs this
agent prepares: working_dir (file:// and http zips), py_modules, env_vars, pip from offline wheels,
a job's local working_dir that Ray uploads to its GCS. The counts go back to 0 as workers exit,
and the agent's info shows what Ray created. One node serves the whole module."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.ops import loops
from tests.harness.packages import workdir_zip
from tests.harness.pip_wheels import offline
from tests.harness.ray_nodes import (
    HTTP_OK,
    OURS,
    PIP_OK,
    Driver,
    Json,
    RayNode,
    ThreadedPackageServer,
    agent_info,
    drive,
    modules_zip,
    needs_http,
    needs_ours,
    package_server,
    ray_counts,
    ray_nodes,
    wait_counts_zero,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def node() -> Iterator[RayNode]:
    with ray_nodes(1, num_cpus=2) as (head,):
        yield head


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedPackageServer]:
    with package_server() as server:
        yield server


@needs_ours
def test_the_raylets_agent_runs_on_the_loop_its_environment_chooses(node: RayNode) -> None:
    """RTENV_EVENT_LOOP and an installed uvloop reach the agent through ray start and the
    raylet, as they reach serve: CI's uvloop pass runs these Ray tests on uvloop (its log says)."""
    log = (node.session_dir / "logs" / "runtime_env_agent.log").read_text(errors="replace")
    found = re.search(r"event loop: (\w+)", log)
    assert found, node.logs()
    assert found[1] == ("asyncio" if loops.loop_factory() is None else "uvloop"), node.logs()


def _assert_saw(seen: Json, *, files: dict[str, str], modules: dict[str, str], env: Json) -> None:
    assert "error" not in seen, seen
    assert seen["files"] == files, seen
    assert seen["modules"] == modules, seen
    assert seen["env"] == env, seen


def test_task_and_actor_see_working_dir_py_modules_env_vars_and_pip(
    node: RayNode, served: ThreadedPackageServer, wheels: Path, tmp_path: Path
) -> None:
    """A task and an actor each read their working dir's file, import their py_modules (and the
    pip and uv envs' modules), and see their env vars: file:// and http zips, offline pip and
    uv (the object form, to which Ray's driver adds its --no-cache)."""
    wd = tmp_path / "wd.zip"
    wd.write_bytes(workdir_zip({"data.txt": "file working dir"}))
    mods = tmp_path / "mods.zip"
    mods.write_bytes(modules_zip({"e2e_file_mod": "file module"}))
    cases: list[Json] = [
        {
            "name": "file",
            "runtime_env": {
                "working_dir": wd.as_uri(),
                "py_modules": [mods.as_uri()],
                "env_vars": {"E2E_VAR": "file env"},
            },
            "spec": {"files": ["data.txt"], "modules": ["e2e_file_mod"], "env": ["E2E_VAR"]},
            "expect": {
                "files": {"data.txt": "file working dir"},
                "modules": {"e2e_file_mod": "file module"},
                "env": {"E2E_VAR": "file env"},
            },
        }
    ]
    if HTTP_OK:
        cases.append(
            {
                "name": "http",
                "runtime_env": {
                    "working_dir": served.add("wd.zip", workdir_zip({"data.txt": "http wd"})),
                    "py_modules": [served.add("m.zip", modules_zip({"e2e_http_mod": "http m"}))],
                },
                "spec": {"files": ["data.txt"], "modules": ["e2e_http_mod"]},
                "expect": {
                    "files": {"data.txt": "http wd"},
                    "modules": {"e2e_http_mod": "http m"},
                    "env": {},
                },
            }
        )
    if PIP_OK:
        pip = {"packages": ["gamma_pkg"], "pip_install_options": offline(wheels)}
        cases.append(
            {
                "name": "pip",
                "runtime_env": {"pip": pip, "env_vars": {"E2E_VAR": "pip env"}},
                "spec": {"modules": ["gamma_pkg", "alpha_pkg"], "env": ["E2E_VAR"]},
                "expect": {
                    "files": {},
                    "modules": {"gamma_pkg": "gamma 1.0", "alpha_pkg": "alpha 1.0"},
                    "env": {"E2E_VAR": "pip env"},
                },
            }
        )
    if PIP_OK and OURS:  # Ray's own agent would pip-install uv from an index first
        uv = {"packages": ["gamma_pkg"], "uv_pip_install_options": offline(wheels)}
        cases.append(
            {
                "name": "uv",
                "runtime_env": {"uv": uv},
                "spec": {"modules": ["gamma_pkg", "alpha_pkg"]},
                "expect": {
                    "files": {},
                    "modules": {"gamma_pkg": "gamma 1.0", "alpha_pkg": "alpha 1.0"},
                    "env": {},
                },
            }
        )
    got = drive(node, "probe", {"cases": cases})
    for case in cases:
        for kind in ("task", "actor"):
            _assert_saw(got[case["name"]][kind], **case["expect"])
    if HTTP_OK:
        assert served.gets("wd.zip") == 1, "the node fetched its working dir more than once"
        assert served.gets("m.zip") == 1
    wait_counts_zero(node)
    if OURS:
        uris = {u.uri: u for u in agent_info(node).uris}
        for case in cases:
            env = case["runtime_env"]
            for uri in [env.get("working_dir"), *env.get("py_modules", [])]:
                if uri is not None:
                    # installed, kept in the cache, used by nobody now
                    assert uris[uri].state == "unused", uris[uri]
                    assert uris[uri].references == 0, uris[uri]
        assert any(u.startswith("pip://") for u in uris), sorted(uris)
        if PIP_OK:
            assert any(u.startswith("uv://") for u in uris), sorted(uris)


def test_rays_worker_runs_under_the_envs_py_executable(node: RayNode, tmp_path: Path) -> None:
    """Ray's raylet starts the worker as ``exec <py_executable> ...`` from the context: a task
    and an actor run under a wrapper script that marks their environment, then execs python."""
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text(f'#!/bin/sh\nE2E_WRAPPED="$0" exec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    cases: list[Json] = [
        {
            "name": "wrapped",
            "runtime_env": {"py_executable": str(wrapper), "env_vars": {"E2E_VAR": "w"}},
            "spec": {"env": ["E2E_WRAPPED", "E2E_VAR"]},
        }
    ]
    got = drive(node, "probe", {"cases": cases})
    for kind in ("task", "actor"):
        env = {"E2E_WRAPPED": str(wrapper), "E2E_VAR": "w"}
        _assert_saw(got["wrapped"][kind], files={}, modules={}, env=env)
    wait_counts_zero(node)


def test_a_jobs_local_working_dir_and_py_modules_are_uploaded_and_served(
    node: RayNode, tmp_path: Path
) -> None:
    """``ray.init(runtime_env={"working_dir": "./job", "py_modules": [dir]})``: Ray uploads both
    to its GCS (gcs:// packages) and the job's task and actor see them."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "data.txt").write_text("uploaded working dir")
    (tmp_path / "libs" / "e2e_job_mod").mkdir(parents=True)
    (tmp_path / "libs" / "e2e_job_mod" / "__init__.py").write_text("VALUE = 'uploaded module'\n")
    job_env = {"working_dir": "./job", "py_modules": [str(tmp_path / "libs" / "e2e_job_mod")]}
    spec = {"files": ["data.txt"], "modules": ["e2e_job_mod"]}
    got = drive(node, "job", {"job_env": job_env, "spec": spec}, cwd=tmp_path)
    for kind in ("task", "actor"):
        _assert_saw(
            got[kind],
            files={"data.txt": "uploaded working dir"},
            modules={"e2e_job_mod": "uploaded module"},
            env={},
        )
        seen_env = got[kind]["runtime_env"]
        assert seen_env["working_dir"].startswith("gcs://_ray_pkg_"), seen_env
        assert seen_env["py_modules"][0].startswith("gcs://_ray_pkg_"), seen_env
    wait_counts_zero(node)


def _count_of(counts: dict[str, int], marker: str) -> int | None:
    """The count of the one serialized env that mentions ``marker`` (None: no such env)."""
    found = [n for env, n in counts.items() if marker in env]
    assert len(found) <= 1, counts
    return found[0] if found else None


def test_deletes_arrive_as_workers_exit_and_every_count_returns_to_zero(
    node: RayNode, tmp_path: Path
) -> None:
    """While an actor holds its env the agent counts it; once the actor is killed (its worker
    exits) the count drops with the driver still running; once the driver exits, every count on
    the node is 0."""
    wd = tmp_path / "held.zip"
    wd.write_bytes(workdir_zip({"data.txt": "held"}))
    env = {"working_dir": wd.as_uri(), "env_vars": {"E2E_HELD": "yes"}}
    driver = Driver(node, "hold", {"runtime_env": env, "spec": {"files": ["data.txt"]}})
    try:
        held = driver.expect("STEP")["held"]
        assert held["files"] == {"data.txt": "held"}, held
        counts = ray_counts(node)
        assert (_count_of(counts, "E2E_HELD") or 0) >= 1, counts
        driver.go()
        driver.expect("STEP")
        wait_counts_zero(node)  # the driver is still connected: the delete came from the exit
        driver.go()
        driver.result()
    finally:
        driver.kill()
    wait_counts_zero(node)


def _cli_info(node: RayNode) -> dict[str, Any]:
    """The node's agent's own view (``info --address`` on its socket: ``info --root`` shows the
    root's index, shared by every agent of the root)."""
    address = node.grpc_address
    done = subprocess.run(
        [sys.executable, "-m", "agent", "info", "--address", address, "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    info: dict[str, Any] = json.loads(done.stdout)
    return info


@needs_ours
@needs_http
def test_the_agents_info_shows_the_envs_and_packages_ray_created(
    node: RayNode, served: ThreadedPackageServer
) -> None:
    """``rtenv-agent info --root <root> --json``, on the root under Ray's session dir: while an
    actor holds it, the env Ray asked for (as Ray serialized it) with its package, installed
    once; once the driver is gone, no env and the package kept in the cache, unused."""
    wd = served.add("info-wd.zip", workdir_zip({"data.txt": "info"}))
    env = {"working_dir": wd, "env_vars": {"E2E_INFO": "1"}}
    driver = Driver(node, "hold", {"runtime_env": env})
    try:
        driver.expect("STEP")
        info = _cli_info(node)
        envs = [e for e in info.get("envs", []) if "E2E_INFO" in e["serialized_runtime_env"]]
        assert len(envs) == 1, info.get("envs")
        assert envs[0]["state"] == "ready", envs[0]
        assert int(envs[0]["references"]) >= 1, envs[0]
        assert envs[0]["uris"] == [f"working_dir:{wd}"], envs[0]
        uris = {u["uri"]: u for u in info.get("uris", [])}
        assert uris[wd]["kind"] == "working_dir", uris[wd]
        assert uris[wd]["state"] == "ready", uris[wd]
        driver.go()
        driver.expect("STEP")
        driver.go()
        driver.result()
    finally:
        driver.kill()
    wait_counts_zero(node)
    info = _cli_info(node)
    assert not [e for e in info.get("envs", []) if "E2E_INFO" in e["serialized_runtime_env"]]
    uris = {u["uri"]: u for u in info.get("uris", [])}
    assert uris[wd]["state"] == "unused", uris[wd]
    assert served.gets("info-wd.zip") == 1


BIG = "x" * 200_000


@pytest.mark.parametrize(
    ("case", "message"),
    [
        pytest.param(
            {"env_vars": {"E2E_BIG": BIG}},
            "one variable may not exceed",
            id="a 200 KB env var",
            marks=needs_ours,  # Ray's agent accepts it, and its worker cannot start
        ),
        pytest.param(
            {"pip": {"packages": ["alpha_pkg"], "pip_install_options": ["--target", "/tmp/x"]}},
            "pip.pip_install_options: '--target' is refused: writes outside the env's venv",
            id="a pip option that writes outside the venv",
            marks=needs_ours,  # Ray's agent passes it to pip
        ),
        pytest.param(
            {"conda": {"dependencies": ["pip"]}},
            "runtime_env field 'conda' cannot be used on this node: it needs a conda installation",
            id="a field this agent does not support",
            marks=needs_ours,  # Ray's agent runs conda
        ),
        pytest.param(
            {"working_dir": "HTTP/missing.zip"},
            "working_dir:HTTP/missing.zip: the server answered 404",
            id="a 404 working dir",
        ),
    ],
)
def test_an_env_the_agent_refuses_fails_the_task_with_the_agents_message(
    node: RayNode, served: ThreadedPackageServer, case: Json, message: str
) -> None:
    """An env Ray's own validation accepts but this agent refuses: the task fails with
    RuntimeEnvSetupError and the text is this agent's message."""
    url = served.server.base_url
    env = {k: v.replace("HTTP", url) if isinstance(v, str) else v for k, v in case.items()}
    message = message.replace("HTTP", url)
    if "working_dir" in env and not HTTP_OK:
        pytest.skip("Ray before 2.56 takes no http:// URIs; Ray's own agent needs smart_open")
    got = drive(node, "probe", {"cases": [{"name": "bad", "runtime_env": env}], "tasks_only": True})
    outcome = got["bad"]["task"]
    assert outcome.get("error") == "RuntimeEnvSetupError", outcome
    if OURS:  # this agent's message, saying which node's agent refused
        assert f"[Node {node.ip}] rtenv-agent: " in outcome["message"], outcome["message"]
        assert message in outcome["message"], outcome["message"]
    wait_counts_zero(node)
