"""The Ray switch on real Ray nodes (2.60; 2.51.1 in CI's old-Ray venv): after ``rtenv-agent ray
enable --python P``, an unmodified driver with a bare ``ray.init(num_cpus=1)`` run by P (or by
``uv run`` in a uv project whose venv is P) starts a node whose raylet runs this agent, from the
agent's own installation, on the root enable named, says so once in the driver's output (with
the ``info`` command, which runs as printed), and ends at ``ray.shutdown()`` with no warning;
after ``disable``, Ray's own agent again, and no line. After ``enable --user``, a venv made anew
does the same from a new shell.
Before Ray refuses a node whose socket paths are too long, the switch says why and what to do.

Each driver runs in a process of its own with its own short ``RAY_TMPDIR`` (its node's processes
are found, and stopped, by that path); ``RTENV_ROOT`` is unset: the root is enable's."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.install.venvs.wheel_cache import find_uv
from agent.launcher import install, uninstall
from agent.ops import ray_swap
from tests.harness.ray_nodes import base_environ, poll
from tests.harness.ray_switch import (
    LAUNCH,
    OUR_AGENT,
    RAY_AGENT_MAIN,
    agent_venv,
    driver,
    kill_naming,
    node_agent,
    ray_venv,
    raylet,
    switch,
    uv_environ,
    uv_project,
)
from tests.harness.uv_projects import user_uv

AGENT_FLAG = "--runtime_env_agent_command="


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short RAY_TMPDIR of the test's own (Ray's socket paths must fit in 107 bytes)."""
    temp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    try:
        yield temp
    finally:
        kill_naming(str(temp))
        shutil.rmtree(temp, ignore_errors=True)


def _environ(ray_tmp: Path) -> dict[str, str]:
    """A user's shell: no PYTHONPATH (the driver's env must not see this checkout), no
    RTENV_*, a RAY_TMPDIR of the test's own, and a TMPDIR inside it: a bare ``ray.init()``
    starts Ray's dashboard, whose multiprocessing forkserver leaves its ``pymp-*`` folder in
    the temp dir when the node is killed by PID."""
    temp = ray_tmp / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    env = base_environ(RAY_TMPDIR=str(ray_tmp), TMPDIR=str(temp))
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "RTENV_ROOT"):
        env.pop(name, None)
    return env


def _agent_of_node(mark: str) -> tuple[list[str], list[str]]:
    """The raylet's agent command (its flag) and its agent process's command line."""
    found = poll(lambda: raylet(mark), 30, "the node's raylet")
    raylet_pid, raylet_cmd = found
    (flag,) = [a for a in raylet_cmd if a.startswith(AGENT_FLAG)]
    _, agent_cmd = poll(lambda: node_agent(raylet_pid), 30, "the raylet's agent")
    return flag.removeprefix(AGENT_FLAG).split(), agent_cmd


def test_install_over_a_switch_keeps_its_agent_python_and_root_and_uninstall_gives_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rtenv-agent ray start`` in a python the switch is on in: the launcher's install() and
    its announcement use the switch's agent python and root."""
    from ray._private import services

    calls: list[list[str]] = []
    monkeypatch.setattr(services, "start_ray_process", lambda c, kind, *a, **k: calls.append(c))
    switched = ray_swap.swapping(services.start_ray_process, sys.executable, "/data/root")
    monkeypatch.setattr(services, "start_ray_process", switched)
    told: list[list[str]] = []
    install(on_swap=told.append)
    try:
        argv = ["/ray/raylet", AGENT_FLAG + f"/env/bin/python -u /r/{RAY_AGENT_MAIN} --node-id=1"]
        services.start_ray_process(argv, "raylet", fate_share=False)
        expected = ray_swap.swap_agent_command(
            argv, sys.executable, "/data/root", ray_swap.running_ray_version()
        )
        assert calls == [expected]
        assert told == [expected], "the announcement is told the switch's root"
    finally:
        uninstall()
    assert services.start_ray_process is switched


def test_a_bare_ray_init_runs_this_agent_on_enables_root_and_rays_own_after_disable(
    tmp_path: Path, ray_tmp: Path
) -> None:
    agent_python = agent_venv(tmp_path / "agent")
    python = ray_venv(tmp_path / "env")
    root = tmp_path / "root"
    enabled = switch(agent_python, "enable", "--python", str(python), "--root", str(root))
    assert enabled.returncode == 0, enabled.stderr
    app = tmp_path / "app"
    app.mkdir()
    (app / "launch.py").write_text(LAUNCH)
    env = _environ(ray_tmp / "on")
    with driver([str(python), "launch.py"], app, env, str(ray_tmp)) as run:
        run.task_pid()
        command, agent = _agent_of_node(str(ray_tmp / "on"))
        ours = [str(agent_python), *OUR_AGENT, f"--root={root}"]
        assert agent[: len(ours)] == ours, agent
        assert command[: len(ours)] == ours, command
        assert f"--temp-dir={ray_tmp / 'on' / 'ray'}" in agent, "Ray's flags follow"
        assert (root / "state.db").is_file(), "the agent serves the root enable named"
        assert list(root.glob("agent-*.sock")), "its socket is in the root"
        (log,) = (ray_tmp / "on" / "ray").glob("session_latest/logs/runtime_env_agent.log")
        assert f"root {root}" in log.read_text()
        said = [x for x in run.err.read_text().splitlines() if "runtime-env-agent's" in x]
        info = shlex.join([str(agent_python.parent / "rtenv-agent"), "info", "--root", str(root)])
        assert said == [
            "rtenv-agent: this node's runtime env agent is runtime-env-agent's (rtenv-agent "
            f"ray-agent), not Ray's; its root: '{root}' (the Ray switch's, rtenv-agent ray "
            f"enable); what it holds: {info}"
        ], "once, in the driver's output"
        shown = subprocess.run(
            ["/bin/sh", "-c", info], capture_output=True, text=True, timeout=60, check=False,
            env={"PATH": "/nonexistent"},  # as printed: rtenv-agent on no PATH
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "holders: 1 alive" in shown.stdout, shown.stdout
        assert run.finish() == 0
        poll(lambda: "stopped" in log.read_text() or None, 30, "the agent to stop")
        text = log.read_text()
        assert "INFO agent.ops.entry: keeper " in text, "ray.shutdown(): a normal end"
        assert "WARNING agent.ops.entry" not in text, text
    disabled = switch(agent_python, "disable", "--python", str(python))
    assert disabled.returncode == 0, disabled.stderr
    env = _environ(ray_tmp / "off")
    with driver([str(python), "launch.py"], app, env, str(ray_tmp)) as run:
        run.task_pid()
        command, agent = _agent_of_node(str(ray_tmp / "off"))
        assert command[0] == str(python), "Ray's agent, run by the env's own python"
        # Ray's own agent command quotes its script's path when it has a space (CI's clone)
        assert any(word.strip('"').endswith(RAY_AGENT_MAIN) for word in command), command
        assert "-m agent ray-agent" not in " ".join(agent), agent
        assert run.finish() == 0
        # the announcement's words, not the project's name: a path (CI's clone) may hold that
        assert "runtime env agent is runtime-env-agent's" not in run.err.read_text(), "no line"


def test_after_enable_user_a_venv_made_anew_starts_nodes_on_this_agent_in_a_new_shell(
    tmp_path: Path, ray_tmp: Path
) -> None:
    """``enable --user``, then the project's venv removed and made again (``rm -rf .venv``, a
    new Python version): a bare ``ray.init()`` run from a login shell (what a new terminal
    reads) starts a node whose raylet runs this agent, on enable's root."""
    agent_python = agent_venv(tmp_path / "agent")
    home = tmp_path / "home"
    home.mkdir()
    env = _environ(ray_tmp)
    env.update(HOME=str(home), PATH=os.defpath)
    for name in [k for k in env if k.startswith("XDG_")]:
        env.pop(name)
    root = tmp_path / "root"
    on = switch(agent_python, "enable", "--user", "--root", str(root), env=env)
    assert on.returncode == 0, on.stderr
    project = tmp_path / "proj"
    ray_venv(project / ".venv")
    shutil.rmtree(project / ".venv")
    python = ray_venv(project / ".venv")
    (project / "launch.py").write_text(LAUNCH)
    command = ["bash", "-lc", f"exec {shlex.quote(str(python))} launch.py"]
    with driver(command, project, env, str(ray_tmp)) as run:
        run.task_pid()
        _, agent = _agent_of_node(str(ray_tmp))
        ours = [str(agent_python), *OUR_AGENT, f"--root={root}"]
        assert agent[: len(ours)] == ours, agent
        assert run.finish() == 0


def test_a_uv_run_driver_in_a_uv_project_runs_this_agent_from_its_own_installation(
    tmp_path: Path, ray_tmp: Path
) -> None:
    """``uv run python launch.py``: uv re-syncs the project's venv and the switch is still on;
    Ray's uv hook makes the job's env (the project folder as working_dir, ``uv run`` as the
    workers' python), which this agent prepares, and the task runs. On Ray 2.51 the hook's line
    names no program (``uv run --offline``, the worker's script after it): the agent gives it
    ``python``, else uv takes the project enclosing Ray's script (here this checkout) for the
    worker's, and the task never runs."""
    if find_uv() is None:
        pytest.skip("no uv here")
    uv = str(user_uv())  # at a path without a space, as a user's: Ray's hook does not quote it
    agent_python = agent_venv(tmp_path / "agent")
    project = tmp_path / "proj"
    env = uv_environ(_environ(ray_tmp), tmp_path, project)
    # no uv on the PATH the node's agent inherits: it leaves the workers' uv run line to uv
    # (which runs in the project's venv, given Ray the test-only way); the agent's own build of
    # a uv run project, Ray in its lock, is tests/test_ray_uv_run_agent.py's
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and not Path(d, "uv").exists()
    )
    python = uv_project(uv, project, env)
    root = tmp_path / "root"
    enabled = switch(agent_python, "enable", "--python", str(python), "--root", str(root))
    assert enabled.returncode == 0, enabled.stderr
    probe = "import importlib.util as u; print(u.find_spec('agent'))"
    seen = subprocess.run(
        [uv, "run", "--offline", "python", "-c", probe], cwd=project, env=env,
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert seen.stdout.strip() == "None", "the agent is not in the project's venv"
    with driver([uv, "run", "--offline", "python", "launch.py"], project, env, str(ray_tmp)) as run:
        run.task_pid()
        _, agent = _agent_of_node(str(ray_tmp))
        ours = [str(agent_python), *OUR_AGENT, f"--root={root}"]
        assert agent[: len(ours)] == ours, agent
        assert list((root / "uris").iterdir()), "this agent unpacked the job's working_dir"
        assert run.finish() == 0


def test_the_switch_says_why_before_ray_refuses_a_node_whose_socket_paths_are_too_long(
    tmp_path: Path, ray_tmp: Path
) -> None:
    agent_python = agent_venv(tmp_path / "agent")
    python = ray_venv(tmp_path / "env")
    enabled = switch(agent_python, "enable", "--python", str(python), "--root", str(tmp_path))
    assert enabled.returncode == 0, enabled.stderr
    deep = ray_tmp / ("d" * 60) / ("e" * 20)
    deep.mkdir(parents=True)
    env = _environ(deep)
    started = subprocess.run(
        [str(python), "-c", "import ray; ray.init(num_cpus=1)"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert started.returncode != 0, "Ray refuses the node"
    said = started.stderr
    assert "validate_socket_filename failed" in said, said[-2000:]
    warning = said.index("over the 107-byte limit of a unix socket path")
    assert warning < said.index("validate_socket_filename failed"), "said before Ray refuses"
    line = said[said.rfind("\n", 0, warning) + 1 : said.index("\n", warning)]
    for fix in ("RAY_TMPDIR", "RTENV_ROOT", "--root"):
        assert fix in line, line
    assert str(deep / "ray" / "session_") in line, line


def test_rtenv_agent_ray_start_warns_before_ray_refuses_a_long_temp_dir(
    tmp_path: Path, ray_tmp: Path
) -> None:
    agent_python = agent_venv(tmp_path / "agent")
    deep = ray_tmp / ("t" * 70)
    started = subprocess.run(
        [str(agent_python), "-m", "agent", "ray", "start", "--head", "--temp-dir", str(deep),
         "--num-cpus", "1", "--include-dashboard=false", "--port", "0"],
        cwd=tmp_path, env=_environ(ray_tmp), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert started.returncode != 0, "Ray refuses the node"
    first = started.stderr.splitlines()[0]
    assert first.startswith(f"rtenv-agent ray: warning: Ray's socket path '{deep}/session_")
    assert "over the 107-byte limit" in first
    assert "validate_socket_filename failed" in started.stderr, started.stderr[-2000:]
