"""Files and folders of the node in ``pip`` (issue 37) through a real in-process agent: a wheel by
its path, a project folder, an sdist and a direct reference installed by real pip (and uv) from
copies, a rebuilt wheel at the same path a new venv, an editable folder read live, and each
refused form answered with its status while the agent keeps serving. Offline: every install
names ``--no-index`` and every proxy points at a closed loopback port."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import running_agent
from tests.harness.pip_wheels import isolate_pip, local_project
from tests.harness.uv_wheels import have_uv, module_wheel, no_network
from tests.harness.venvs import probe, status_of, still_serves


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_pip(monkeypatch)
    no_network(monkeypatch)


def pip_env(*packages: str) -> str:
    return json.dumps({"pip": {"packages": list(packages), "pip_install_options": ["--no-index"]}})


def sdist_of(project: Path, module: str, dest: Path) -> Path:
    """``<module>-1.0.tar.gz`` in ``dest``: the project's files under one top folder."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{module}-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(project, arcname=f"{module}-1.0")
    return path


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


INSTALLERS = [
    "pip",
    pytest.param("uv", marks=pytest.mark.skipif(not have_uv(), reason="no uv here")),
]


@pytest.mark.parametrize("installer", INSTALLERS)
async def test_a_wheel_by_its_path_installs_and_a_rebuilt_wheel_there_is_a_new_venv(
    tmp_path: Path, installer: str
) -> None:
    """Before: '/abs/x.whl' was 'not a requirement'. While the env lives its creates share its
    venv; once released, the next create reads the wheel again: new bytes, new venv."""
    wheels = tmp_path / "my wheels"
    wheels.mkdir()
    wheel = module_wheel(wheels, "tinydep", "one")
    env = pip_env(str(wheel))
    async with running_agent(pip_installer=installer) as a:
        first = await a.create(env)
        seen = await probe(first.context, "tinydep")
        assert seen["tinydep"][0] == "one"
        assert str(wheels) not in seen["tinydep"][1], "installed, not read from the wheel"
        (uri,) = first.uris
        assert uri.startswith("pip:pip://")
        again = await a.create(env)
        assert again.context.py_executable == first.context.py_executable
        module_wheel(wheels, "tinydep", "two")
        assert await a.delete(first.runtime_env_id) == 1
        assert await a.delete(again.runtime_env_id) == 0
        rebuilt = await a.create(env)
        assert rebuilt.runtime_env_id == first.runtime_env_id, "one env: the same text"
        assert rebuilt.context.py_executable != first.context.py_executable
        assert list(rebuilt.uris) != list(first.uris)
        assert (await probe(rebuilt.context, "tinydep"))["tinydep"][0] == "two"
        a.service.check_invariants()


async def test_a_folder_an_sdist_and_a_direct_reference_install_from_copies(
    tmp_path: Path,
) -> None:
    """Each is built from a copy: the user's folder gets no build output of the agent's."""
    folder = local_project(tmp_path / "my project", "projmod", "from the folder")
    source = local_project(tmp_path / "src" / "sdmod", "sdmod", "from the sdist")
    sdist = sdist_of(source, "sdmod", tmp_path / "dist")
    wheels = tmp_path / "w"
    wheels.mkdir()
    wheel = module_wheel(wheels, "refmod", "by reference")
    before = files_of(folder)
    async with running_agent() as a:
        reply = await a.create(pip_env(str(folder), str(sdist), f"refmod @ {wheel.as_uri()}"))
        seen = await probe(reply.context, "projmod", "sdmod", "refmod")
        values = [seen[module][0] for module in ("projmod", "sdmod", "refmod")]
        assert values == ["from the folder", "from the sdist", "by reference"]
        assert files_of(folder) == before
        assert await a.delete(reply.runtime_env_id) == 0


async def test_an_editable_folder_inside_a_root_is_read_live(tmp_path: Path) -> None:
    folder = local_project(tmp_path / "proj", "livemod", "one")
    async with running_agent(allow_file_roots=(str(tmp_path),)) as a:
        reply = await a.create(pip_env(f"-e {folder}"))
        assert (await probe(reply.context, "livemod"))["livemod"][0] == "one"
        (folder / "livemod" / "__init__.py").write_text("VALUE = 'edited'\n")
        assert (await probe(reply.context, "livemod"))["livemod"][0] == "edited"
        assert await a.delete(reply.runtime_env_id) == 0


async def test_each_refused_form_answers_its_status_and_the_agent_keeps_serving(
    tmp_path: Path,
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    outside = module_wheel(tmp_path, "tinydep", "outside")
    cases = [
        (pip_env("./pkg"), grpc.StatusCode.INVALID_ARGUMENT, "is a relative path"),
        (pip_env(str(outside)), grpc.StatusCode.PERMISSION_DENIED, "allow-file-root"),
        (
            pip_env(str(allowed / "gone-1.0-py3-none-any.whl")),
            grpc.StatusCode.NOT_FOUND,
            "no such file on this node",
        ),
        (
            pip_env("--no-deps"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "pass any other in pip.pip_install",
        ),
    ]
    async with running_agent(allow_file_roots=(str(allowed),)) as a:
        for env, code, words in cases:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await a.create(env)
            got, details = status_of(failed.value)
            assert (got, words in details) == (code, True), details
        await still_serves(a)
        a.service.check_invariants()
