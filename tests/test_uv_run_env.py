"""``uv run`` envs through a real in-process agent: the project's venv built once at create, by
the real uv, offline, from the working dir's lock; the worker runs that venv's python; folders
differing in anything but what decides the env share it; a project reaching outside the
allowed roots is refused; a line the agent cannot build is left to uv."""

from __future__ import annotations

import json
import logging
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.packages import make_zip
from tests.harness.pip_wheels import isolate_pip
from tests.harness.uv_wheels import have_uv, no_network, write_wheel
from tests.harness.venvs import probe, status_of

pytestmark = pytest.mark.skipif(not have_uv(), reason="no uv beside the python nor on PATH")

BUILD_S = 60
PYTHON = platform.python_version()  # as Ray's hook pins it
HOOK_LINE = f"/usr/local/bin/uv run --python {PYTHON} python"  # Ray's hook's form


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pip configuration of this machine; any index request fails on loopback."""
    isolate_pip(monkeypatch)
    no_network(monkeypatch)


def wheels(tmp: Path) -> Path:
    folder = tmp / "wheels"
    write_wheel(folder, "alpha")
    write_wheel(folder, "beta", deps=["alpha"])
    write_wheel(folder, "gamma")
    return folder


def pyproject(find_links: str, deps: list[str], *, name: str = "exp") -> str:
    return (
        f'[project]\nname = "{name}"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        f"dependencies = {json.dumps(deps)}\n"
        f"[tool.uv]\nfind-links = [{json.dumps(find_links)}]\nno-index = true\n"
    )


def locked(tmp: Path, files: dict[str, str]) -> dict[str, str]:
    """``files`` with the ``uv.lock`` the real uv makes of them, offline."""
    project = tmp / "lock-project"
    project.mkdir(exist_ok=True)
    for name, text in files.items():
        (project / name).write_text(text)
    uv = subprocess.run(
        [str(Path(sys.executable).parent / "uv"), "lock", "--offline", "--quiet"],
        cwd=project, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "UV_CACHE_DIR": str(tmp / "uv-cache"), "HOME": str(tmp),
             "TMPDIR": str(tmp)},
    )  # fmt: skip
    assert uv.returncode == 0, uv.stderr
    return {**files, "uv.lock": (project / "uv.lock").read_text()}


def served_zip(tmp: Path, name: str, files: dict[str, str]) -> str:
    """A working dir zip on disk, as a file:// URI."""
    path = tmp / f"{name}.zip"
    path.write_bytes(make_zip(files))
    return path.as_uri()


async def create(ra: RunningAgent, working_dir: str, line: str = HOOK_LINE) -> object:
    env = {"working_dir": working_dir, "py_executable": line}
    return await ra.create(json.dumps(env), timeout_s=BUILD_S)


def project_dirs(ra: RunningAgent) -> list[str]:
    return [name for name in ra.uri_dirs() if name.startswith("uv_project-")]


async def test_the_worker_runs_the_project_venv_the_agent_built_from_the_lock(
    tmp_path: Path,
) -> None:
    """Ray's hook form: the agent builds the project's venv at create (the lock's packages in
    it), and the worker's command is that venv's python with VIRTUAL_ENV set: no uv run."""
    files = locked(tmp_path, {"pyproject.toml": pyproject(str(wheels(tmp_path)), ["beta"])})
    uri = served_zip(tmp_path, "one", {**files, "launch.py": "print('hi')\n"})
    async with running_agent() as ra:
        reply = await create(ra, uri)
        context = reply.context  # type: ignore[attr-defined]
        (venv_dir,) = project_dirs(ra)
        venv = ra.root / "uris" / venv_dir
        assert shlex.split(context.py_executable) == [str(venv / "bin" / "python")]
        assert context.env_vars["VIRTUAL_ENV"] == str(venv)
        seen = await probe(context, "beta", "alpha")
        assert seen["prefix"] == str(venv)
        assert seen["beta"][0] == "beta 1.0"
        assert seen["alpha"][0] == "alpha 1.0"
        info = await ra.info()
        (row,) = [u for u in info.uris if u.uri.startswith("uvproject://")]
        assert row.size_bytes > 0


async def test_folders_differing_by_a_file_share_one_venv_and_another_lock_gets_its_own(
    tmp_path: Path,
) -> None:
    """Two experiments whose folders differ by one file (two working dir packages) share one
    project venv; a project whose lock differs gets a venv of its own."""
    links = str(wheels(tmp_path))
    files = locked(tmp_path, {"pyproject.toml": pyproject(links, ["beta"])})
    first = served_zip(tmp_path, "first", {**files, "notes.txt": "run 1\n"})
    second = served_zip(tmp_path, "second", {**files, "notes.txt": "run 2\n"})
    (tmp_path / "lock-project" / "uv.lock").unlink()
    other_files = locked(tmp_path, {"pyproject.toml": pyproject(links, ["beta", "gamma"])})
    other = served_zip(tmp_path, "other", other_files)
    async with running_agent() as ra:
        a = await create(ra, first)
        b = await create(ra, second)
        assert a.context.py_executable == b.context.py_executable  # type: ignore[attr-defined]
        assert len(project_dirs(ra)) == 1
        c = await create(ra, other)
        assert c.context.py_executable != a.context.py_executable  # type: ignore[attr-defined]
        assert len(project_dirs(ra)) == 2
        seen = await probe(c.context, "gamma")  # type: ignore[attr-defined]
        assert seen["gamma"][0] == "gamma 1.0"


async def test_a_project_without_a_lock_is_locked_by_the_agent_in_a_copy(tmp_path: Path) -> None:
    """No uv.lock: the agent locks a copy (the shared working dir is not written) and builds
    from that lock; frozen with no lock fails saying so."""
    files = {"pyproject.toml": pyproject(str(wheels(tmp_path)), ["beta"])}
    uri = served_zip(tmp_path, "nolock", files)
    async with running_agent() as ra:
        reply = await create(ra, uri)
        seen = await probe(reply.context, "beta")  # type: ignore[attr-defined]
        assert seen["beta"][0] == "beta 1.0"
        (wd,) = [n for n in ra.uri_dirs() if n.startswith("working_dir-")]
        assert sorted(p.name for p in (ra.root / "uris" / wd).iterdir()) == ["pyproject.toml"]
        assert not list((ra.root / "logs").glob("uvproject-*")), "a lock that succeeded: no log"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await create(ra, uri, f"uv run --frozen --python {PYTHON} python")
        code, message = status_of(caught.value)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "no uv.lock" in message


async def test_a_find_links_folder_outside_the_allowed_roots_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """With allow-file-root set, a project whose find-links lies outside is refused (the
    setting and the folder named), and the agent keeps serving."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    outside = wheels(tmp_path)
    files = {"pyproject.toml": pyproject(str(outside), ["beta"])}
    archive = allowed / "p.zip"
    archive.write_bytes(make_zip(files))
    async with running_agent(allow_file_roots=(str(allowed),)) as ra:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await create(ra, archive.as_uri())
        code, message = status_of(caught.value)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "find-links" in message
        assert str(outside) in message
        assert project_dirs(ra) == []
        info = await ra.info()
        assert len(info.envs) == 1
        assert info.envs[0].error


async def test_a_line_the_agent_cannot_build_is_left_to_uv_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``uv run --script`` (a flag the agent does not build) keeps the env's own line, and the
    create logs why."""
    files = {"pyproject.toml": pyproject(str(wheels(tmp_path)), ["beta"])}
    uri = served_zip(tmp_path, "script", files)
    line = f"uv run --script --python {PYTHON} python"
    caplog.set_level(logging.INFO, logger="agent.app.project_venvs")
    async with running_agent() as ra:
        reply = await create(ra, uri, line)
        assert reply.context.py_executable == line  # type: ignore[attr-defined]
        assert project_dirs(ra) == []
    said = [r.getMessage() for r in caplog.records if "left to uv" in r.getMessage()]
    assert len(said) == 1
    assert "--script" in said[0]
