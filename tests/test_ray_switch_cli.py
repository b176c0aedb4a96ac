"""``rtenv-agent ray enable|disable|enabled`` on real venvs, run from the agent's own
installation: what enable writes (two files and the module's bytecode, nothing else), that it is
idempotent, that ``enabled`` tells (exit 0 on, 1 off, or on but not in effect), that disable
removes exactly what enable wrote (run as enable printed it, by its full path), that ``uv sync``
keeps the switch, that ``--help`` lists the switch with Ray and without it, and that each mistake
is one line and exit 2."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.install.venvs.wheel_cache import find_uv
from tests.harness.agent_process import REPO
from tests.harness.ray_switch import (
    agent_venv,
    ray_venv,
    site_packages,
    switch,
    uv_environ,
    uv_project,
)

NAMES = {"_rtenv_agent_switch.pth", "_rtenv_agent_switch.py"}
# and the module's bytecode, compiled by the target python (the tests' version)
BYTECODE = {"__pycache__", f"__pycache__/_rtenv_agent_switch.{sys.implementation.cache_tag}.pyc"}


@pytest.fixture(scope="module")
def agent_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_venv(tmp_path_factory.mktemp("agent") / "a venv")  # a space, to be quoted


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *said: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    for text in said:
        assert text in done.stderr, done.stderr


def test_enable_writes_two_files_and_bytecode_enabled_tells_and_disable_removes_them_all(
    tmp_path: Path, agent_python: Path
) -> None:
    python = ray_venv(tmp_path / "env")
    purelib = site_packages(tmp_path / "env")
    before = _files(purelib)
    root = tmp_path / "root"
    assert switch(agent_python, "enabled", "--python", str(python)).returncode == 1
    first = switch(agent_python, "enable", "--python", str(python), "--root", str(root))
    assert first.returncode == 0, first.stderr
    assert _files(purelib) - before == NAMES | BYTECODE
    assert f"agent python: {agent_python}" in first.stdout
    assert f"root: {root}" in first.stdout
    cli = shlex.quote(str(agent_python.parent / "rtenv-agent"))  # by its full path
    assert f"  what it holds: {cli} info --root {root}\n" in first.stdout
    assert f"  undo: {cli} ray disable --python {python}\n" in first.stdout
    assert not root.exists(), "the agent makes its root, enable does not"
    again = switch(agent_python, "enable", "--python", str(python), "--root", str(root))
    assert again.returncode == 0, again.stderr
    assert "enabled again" in again.stdout
    assert _files(purelib) - before == NAMES | BYTECODE, "idempotent"
    shown = switch(agent_python, "enabled", "--python", str(python))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1:3] == [
        f"  agent python: {agent_python}",
        f"  root: {root} (RTENV_ROOT, where set, wins)",
    ]
    # the target python arms the switch at start, from the bytecode enable wrote
    probe = "import sys; m = sys.modules['_rtenv_agent_switch']; print(m.__spec__.cached)"
    armed = subprocess.run(
        [str(python), "-c", f"{probe}; print(type(sys.meta_path[0]))"],
        capture_output=True, text=True, timeout=60, check=True,
        env={"PATH": os.defpath, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    cached, finder = armed.stdout.splitlines()
    assert finder == "<class '_rtenv_agent_switch.Finder'>"
    assert Path(cached).is_file()
    undo = first.stdout.partition("  undo: ")[2].splitlines()[0]
    off = subprocess.run(
        ["/bin/sh", "-c", undo], capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/nonexistent"},  # the line runs as printed, rtenv-agent on no PATH
    )  # fmt: skip
    assert off.returncode == 0, off.stderr
    assert "removed" in off.stdout
    assert _files(purelib) == before
    assert not any("_rtenv_agent_switch" in name for name in _files(purelib))
    assert switch(agent_python, "enabled", "--python", str(python)).returncode == 1
    twice = switch(agent_python, "disable", "--python", str(python))
    assert twice.returncode == 0
    assert "nothing to remove" in twice.stdout


def test_the_default_python_is_the_one_rtenv_agent_runs_in_and_the_root_the_users_cache(
    tmp_path: Path,
) -> None:
    agent_python = agent_venv(tmp_path / "agent")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    on = switch(agent_python, "enable", env=env)
    assert on.returncode == 0, on.stderr
    assert f"enabled for {agent_python}:" in on.stdout
    assert f"root: {tmp_path / 'cache' / 'rtenv-agent' / 'root'}" in on.stdout
    assert _files(site_packages(tmp_path / "agent")) >= NAMES
    assert switch(agent_python, "disable", env=env).returncode == 0


def test_uv_sync_and_uv_run_keep_the_switch(tmp_path: Path, agent_python: Path) -> None:
    uv = find_uv()
    if uv is None:
        pytest.skip("no uv here")
    project = tmp_path / "proj"
    env = uv_environ(dict(os.environ), tmp_path, project)
    python = uv_project(uv, project, env)
    on = switch(agent_python, "enable", "--python", str(python), "--root", str(tmp_path / "r"))
    assert on.returncode == 0, on.stderr
    for command in (["sync", "--offline"], ["run", "--offline", "python", "-c", "pass"]):
        done = subprocess.run(
            [uv, *command], cwd=project, env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert _files(site_packages(project / ".venv")) >= NAMES
    assert switch(agent_python, "enabled", "--python", str(python)).returncode == 0


def test_each_mistake_is_one_line_and_exit_2(tmp_path: Path, agent_python: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a python\n")
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    no_dir = tmp_path / "says-a-file"
    no_dir.write_text(
        '#!/bin/sh\necho \'{"purelib": "' + str(text) + '", "version": [3, 11, 0], '
        '"ray": false}\'\n'
    )
    no_dir.chmod(0o755)
    cases: list[tuple[list[str], tuple[str, ...]]] = [
        (["enable", "--python", str(text)], ("is not an executable file",)),
        (["disable", "--python", str(fake)], ("is not a python",)),
        (["enable", "--python", str(no_dir)], ("cannot write into", "site-packages")),
        (["enable", "--root", str(text)], ("is not a folder",)),
        (["enable", "--root", ""], ("--root is empty",)),
        (["enabled", "--root", "/x"], ("unrecognized arguments", "rtenv-agent ray enabled")),
    ]
    with ThreadPoolExecutor(len(cases)) as pool:  # each a process: a second or so of imports
        done = list(pool.map(lambda case: switch(agent_python, *case[0]), cases))
    for (argv, said), result in zip(cases, done, strict=True):
        _one_line_exit_2(result, f"rtenv-agent ray {argv[0]}", *said)


def test_enable_refuses_an_agent_python_that_cannot_import_the_agent_isolated(
    tmp_path: Path,
) -> None:
    """A checkout on PYTHONPATH only: the raylet's ``-I`` agent could not start."""
    python = ray_venv(tmp_path / "env")
    base = Path(sys._base_executable)  # type: ignore[attr-defined]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])}
    done = subprocess.run(
        [str(base), "-m", "agent", "ray", "enable", "--python", str(python)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    _one_line_exit_2(done, "cannot import the agent isolated")
    assert not NAMES & _files(site_packages(tmp_path / "env"))


def test_enabled_is_1_saying_why_when_the_agent_python_it_names_is_gone(
    tmp_path: Path, agent_python: Path
) -> None:
    """Nodes would run Ray's own agent: not 'on'."""
    python = ray_venv(tmp_path / "env")
    gone = agent_venv(tmp_path / "gone")
    on = switch(gone, "enable", "--python", str(python), "--root", str(tmp_path / "root"))
    assert on.returncode == 0, on.stderr
    assert switch(agent_python, "enabled", "--python", str(python)).returncode == 0
    shutil.rmtree(tmp_path / "gone")
    shown = switch(agent_python, "enabled", "--python", str(python))
    assert shown.returncode == 1, shown.stdout
    first, *_, fix = shown.stdout.splitlines()
    assert first == (
        f"rtenv-agent ray: on for {python}, but not in effect: the agent python {gone} is gone: "
        "the Ray nodes it starts run Ray's own agent"
    )
    assert fix.startswith(f"  fix: {shlex.quote(str(agent_python.parent / 'rtenv-agent'))} ")


def test_ray_help_lists_the_switch_with_ray_and_without_it(
    tmp_path: Path, agent_python: Path
) -> None:
    """Ray's help and ours after it; where Ray is not importable, ours and a word on Ray's,
    exit 0 (the switch needs no Ray in the agent's python)."""
    no_ray = tmp_path / "no-ray"
    (no_ray / "ray").mkdir(parents=True)
    (no_ray / "ray" / "__init__.py").write_text("raise ImportError('no ray here (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(no_ray)}
    with ThreadPoolExecutor(3) as pool:
        helped, short, bare = pool.map(
            lambda case: switch(agent_python, *case[0], env=case[1]),
            [(["--help"], None), (["-h"], env), ([], env)],
        )
    assert helped.returncode == 0, helped.stderr
    assert "Start Ray processes manually" in helped.stdout, "Ray's own help first"
    ours = helped.stdout.index("runtime-env-agent's commands")
    for command in ("enable", "disable", "enabled"):
        assert f"\n  {command} " in helped.stdout[ours:], command
    for result in (short, bare):
        assert result.returncode == 0, result.stderr
        assert result.stdout == bare.stdout
        assert "Start Ray processes manually" not in result.stdout
        assert "\n  enabled  is the switch on and in effect?" in result.stdout
        assert "Ray is not installed" not in result.stderr
        assert "which has none: no ray here (test)" in result.stdout
        assert "\n  start  " in result.stdout
        assert "pip install 'ray[default]'" in result.stdout
    assert switch(agent_python, "start", env=env).returncode == 2, "Ray's command: needs Ray"
