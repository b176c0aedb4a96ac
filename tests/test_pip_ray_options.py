"""Ray's ``pip`` field as Ray's agent takes it, through a real in-process agent on a real socket,
real pip and a real package index on 127.0.0.1: the option lines of a list (Ray writes the list
into a requirements file: its test_requirements_files[pip]), a ``pip_version`` installed into the
venv before the set (test_runtime_env_with_pip_config), one no pip satisfies failing in pip's own
words (test_runtime_env_with_conflict_pip_version), ``pip_check`` run after the install, and a
place an option line names checked against the allowed roots as every place pip reads is."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.pip_wheels import isolate_pip, offline, run
from tests.harness.venvs import BUILD_S, nothing_left, probe, status_of, still_serves
from tests.harness.wheel_index import pip_wheel, wheel_index

FAILED = grpc.StatusCode.FAILED_PRECONDITION
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(autouse=True)
def hermetic_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_pip(monkeypatch)


@pytest.fixture(scope="module")
def pip_whl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_wheel(tmp_path_factory.mktemp("pip-wheel"))


def alpha(wheels: Path) -> Path:
    [found] = wheels.glob("alpha_pkg-*.whl")
    return found


async def refusal(ra: RunningAgent, text: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await ra.create(text, timeout_s=int(BUILD_S))
    return status_of(refused.value)


async def test_index_lines_in_a_pip_list_build_the_venv_from_that_index(wheels: Path) -> None:
    """Before: each option line refused as 'not a requirement'. As Ray's agent writes the list
    into a requirements file, ``--index-url`` and ``--extra-index-url`` lines say where pip
    finds the set: here only the index on 127.0.0.1 has alpha-pkg."""
    async with wheel_index(alpha(wheels)) as simple, running_agent() as ra:
        nothing = simple.replace("/simple", "/nothing")  # an index with no project at all
        packages = [f"--index-url {nothing}", f"--extra-index-url={simple}", "alpha-pkg"]
        reply = await ra.create(json.dumps({"pip": packages}), timeout_s=int(BUILD_S))
        seen = await probe(reply.context, "alpha_pkg")
        assert seen["alpha_pkg"][0] == "alpha 1.0"
        again = await ra.create(json.dumps({"pip": packages[1:]}), timeout_s=int(BUILD_S))
        assert again.context.py_executable != reply.context.py_executable, "lines are keyed"
        for made in (reply, again):
            assert await ra.delete(made.runtime_env_id) == 0


async def test_a_pip_version_is_installed_into_the_venv_before_the_set(
    wheels: Path, pip_whl: Path
) -> None:
    """Before: refused. The venv is made without pip; with ``pip_version`` that pip is installed
    into it from the env's index, and the venv's ``python -m pip`` is that pip."""
    version = pip_whl.name.split("-")[1]
    async with wheel_index(alpha(wheels), pip_whl) as simple, running_agent() as ra:
        field = {"packages": [f"--index-url {simple}", "alpha-pkg"], "pip_version": f"=={version}"}
        reply = await ra.create(json.dumps({"pip": field}), timeout_s=int(BUILD_S))
        python = reply.context.py_executable
        venv = Path(python).parent.parent
        code, out, err = await run(python, "-m", "pip", "--version")
        assert code == 0, err
        assert out.startswith(f"pip {version} from {venv}/lib/"), out
        assert (await probe(reply.context, "alpha_pkg"))["alpha_pkg"][0] == "alpha 1.0"
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_a_pip_version_no_pip_satisfies_fails_with_pips_own_words(
    wheels: Path, pip_whl: Path
) -> None:
    """Ray's test_runtime_env_with_conflict_pip_version: '<19,>19' fails the create, saying
    pip's 'No matching distribution found for pip<19,>19'; nothing is left behind."""
    async with wheel_index(alpha(wheels), pip_whl) as simple, running_agent() as ra:
        field = {"packages": [f"--index-url {simple}", "alpha-pkg"], "pip_version": "<19,>19"}
        code, message = await refusal(ra, json.dumps({"pip": field}))
        assert code == FAILED, message
        assert "No matching distribution found for pip<19,>19" in message, message
        await nothing_left(ra)
        await still_serves(ra)


async def test_pip_check_runs_after_the_install_and_a_conflict_fails_it_in_pips_words(
    wheels: Path,
) -> None:
    """Before: ``pip_check: true`` refused. gamma-pkg needs alpha-pkg: installed without its
    dependencies, ``pip check`` fails the create with pip's line; with them, it passes."""
    async with running_agent() as ra:
        broken = {"packages": ["gamma-pkg"], "pip_check": True,
                  "pip_install_options": [*offline(wheels), "--no-deps"]}  # fmt: skip
        code, message = await refusal(ra, json.dumps({"pip": broken}))
        assert code == FAILED, message
        assert "gamma-pkg 1.0 requires alpha-pkg, which is not installed." in message, message
        await nothing_left(ra)
        whole = {**broken, "pip_install_options": offline(wheels)}
        reply = await ra.create(json.dumps({"pip": whole}), timeout_s=int(BUILD_S))
        assert (await probe(reply.context, "alpha_pkg"))["alpha_pkg"][0] == "alpha 1.0"
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_an_index_line_outside_the_allowed_roots_or_a_local_one_is_permission_denied(
    base: Path, wheels: Path
) -> None:
    """Before: INVALID_ARGUMENT, as an option line. Now a line's index is a place pip reads,
    checked as an option's is: outside the roots, or a local index inside them (its pages may
    link anywhere), PERMISSION_DENIED before pip runs; and a line reading a file is refused."""
    allowed, outside = base / "allowed", base / "outside"
    for index in (allowed / "simple", outside / "simple"):
        index.mkdir(parents=True)
    async with running_agent(allow_file_roots=(str(allowed),)) as ra:
        for line in (
            f"--index-url {(outside / 'simple').as_uri()}",
            f"--extra-index-url={(allowed / 'simple').as_uri()}",
            f"--find-links {outside}",
        ):
            code, message = await refusal(ra, json.dumps({"pip": [line, "alpha-pkg"]}))
            assert code == DENIED, (line, message)
        code, message = await refusal(ra, json.dumps({"pip": [f"-r {allowed}/r.txt", "a"]}))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert "reads a requirements file" in message, message
        await nothing_left(ra)
        await still_serves(ra)
