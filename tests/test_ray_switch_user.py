"""The per-user switch (``rtenv-agent ray enable|disable|enabled --user``, ``--project DIR``) with
a home of the test's own: enable writes the hook folder and a block in the shell startup files; a
venv made anew after it is armed in a shell that read them (``bash -lc``), and the next
``sitecustomize`` on the path still runs; ``enabled`` says which switch covers a python and
whether this shell has it; a broken config never breaks a python; ``--project`` arms a project's
venv and not another's; disable leaves the startup files byte for byte as they were."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.ray_switch import agent_venv, ray_venv, switch

HOOK = ("rtenv-agent", "switch")
FINDERS = "import sys; print(' '.join(type(f).__module__ for f in sys.meta_path))"
USER_SWITCH = "_rtenv_agent_user_switch"  # the hook's copy of ray_swap, whose Finder arms


@pytest.fixture(scope="module")
def agent_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_venv(tmp_path_factory.mktemp("agent") / "venv")


def _home(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose HOME is the test's own (no XDG folders, no PYTHONPATH)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "PYTHON", "RTENV_"))}
    env.update(HOME=str(home), PATH=os.defpath)
    return env, home


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd="/", env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _login(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` in a login shell: what a new terminal reads (~/.profile)."""
    return _run(["bash", "-lc", command], env)


def test_a_venv_made_anew_is_armed_in_a_new_shell_and_disable_restores_the_startup_files(
    tmp_path: Path, agent_python: Path
) -> None:
    env, home = _home(tmp_path)
    bashrc, zshrc = home / ".bashrc", home / ".zshrc"
    bashrc.write_bytes(b"alias ll='ls -l'")  # no newline at its end
    zshrc.write_bytes(b"export EDITOR=vi\n")
    before = {p: p.read_bytes() for p in (bashrc, zshrc)}
    project = tmp_path / "proj"
    python = ray_venv(project / ".venv")
    on = switch(agent_python, "enable", "--user", "--root", str(tmp_path / "root"), env=env)
    assert on.returncode == 0, on.stderr
    assert on.stdout.splitlines()[-1] == (
        "  in effect: open a new shell, or run `. ~/.profile` in this one"
    )
    folder = home.joinpath(".local", "share", *HOOK)
    assert (folder / "sitecustomize.py").is_file()
    for startup in (home / ".profile", bashrc, zshrc):
        assert f"export PYTHONPATH={folder}" in startup.read_text(), startup
    shutil.rmtree(project / ".venv")  # `rm -rf .venv && uv sync`: a venv made anew
    python = ray_venv(project / ".venv")
    # the next sitecustomize on the path (Debian's, another tool's) still runs
    other = tmp_path / "other-hook"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('NEXT SITECUSTOMIZE')\n")
    shell = {**env, "PYTHONPATH": str(other)}
    seen = _login(f"{python} -c {FINDERS!r}; {agent_python} -m agent ray enabled --user", shell)
    assert seen.returncode == 0, seen.stderr
    lines = seen.stdout.splitlines()
    assert lines[0] == "NEXT SITECUSTOMIZE"
    assert lines[1].split()[0] == USER_SWITCH, "armed first on sys.meta_path"
    assert lines[2] == "NEXT SITECUSTOMIZE", "the agent's python runs it too (not armed there)"
    assert lines[3].startswith("rtenv-agent ray: on per user for every venv and Python "), lines
    assert lines[3].endswith(", in this shell")
    shown = _login(f"{agent_python} -m agent ray enabled --python {python}", env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.splitlines()[0] == (
        f"rtenv-agent ray: {python} is on through the per-user switch (every venv and Python "
        "environment of this user's), in this shell"
    )
    stale = switch(agent_python, "enabled", "--python", str(python), env=env)
    assert stale.returncode == 1, "this shell did not read the block"
    assert "not in this shell" in stale.stdout
    assert stale.stdout.splitlines()[0].endswith(
        ": open a new shell, or run `. ~/.profile` in this one"
    )
    off = switch(agent_python, "disable", "--user", env=env)
    assert off.returncode == 0, off.stderr
    assert {p: p.read_bytes() for p in (bashrc, zshrc)} == before, "byte for byte"
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", ".zshrc"], "nothing else left"
    gone = _login(f"{python} -c {FINDERS!r}", env)
    assert USER_SWITCH not in gone.stdout
    assert switch(agent_python, "enabled", "--user", env=env).returncode == 1


def test_project_scope_arms_its_venvs_only_and_a_broken_config_never_breaks_python(
    tmp_path: Path, agent_python: Path
) -> None:
    env, home = _home(tmp_path)
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    mine, theirs = ray_venv(project / ".venv"), ray_venv(elsewhere / ".venv")
    on = switch(agent_python, "enable", "--project", str(project), env=env)
    assert on.returncode == 0, on.stderr
    folder = tmp_path.joinpath("data", *HOOK)
    shell = {**env, "PYTHONPATH": str(folder)}  # as the block sets it
    armed = [_run([str(p), "-c", FINDERS], shell).stdout.split()[0] for p in (mine, theirs)]
    assert armed[0] == USER_SWITCH
    assert armed[1] != USER_SWITCH, "another project's venv"
    said = switch(agent_python, "enabled", "--python", str(theirs), env=shell)
    assert said.returncode == 1
    assert said.stdout == (
        f"rtenv-agent ray: {theirs} is off: the per-user switch covers the Python environments "
        f"in {project}, not {elsewhere / '.venv'}\n"
    )
    assert switch(agent_python, "enabled", "--python", str(mine), env=shell).returncode == 0
    (folder / "switch.conf").write_text("python=relative\nscope=all\n")
    broken = _run([str(mine), "-c", "print('still runs')"], shell)
    assert broken.returncode == 0
    assert broken.stdout == "still runs\n"
    assert broken.stderr.count("\n") == 1, broken.stderr
    assert "per-user Ray switch is off in this process: cannot read" in broken.stderr
    assert "Traceback" not in broken.stderr
    off = switch(agent_python, "disable", "--user", env=env)
    assert off.returncode == 0, off.stderr
    assert not (tmp_path / "data").exists()
    assert sorted(p.name for p in home.iterdir()) == [], "the .profile and .bashrc it made"
