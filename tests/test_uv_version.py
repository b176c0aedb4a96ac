"""A uv env's ``uv_version`` through a real in-process agent and a real package index on
127.0.0.1: the env is built by that uv (a real uv wheel of another version than the agent's,
``tests/harness/old_uv.py``), fetched once from the env's index and shared by the envs that ask
for it, a package of the env like any other; a uv no index has fails FAILED_PRECONDITION in the
installer's own words, and the agent keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.old_uv import FILL, OLD_UV, old_uv_wheel
from tests.harness.pip_wheels import isolate_pip, run
from tests.harness.simple_index import SimpleIndex, loopback_only, simple_index
from tests.harness.uv_wheels import agents_uv_version, have_uv, write_wheel
from tests.harness.venvs import probe

pytestmark = pytest.mark.skipif(not have_uv(), reason="no uv beside the python nor on PATH")

BUILD_S = 120  # one create: the uv's fetch and install, then the env's venv, on a loaded machine


@pytest.fixture(autouse=True)
def loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pip configuration of this machine; only loopback is reached."""
    isolate_pip(monkeypatch)
    loopback_only(monkeypatch)


@pytest.fixture
def old_uv() -> Path:
    wheel = old_uv_wheel()
    if wheel is None:
        why = f"no uv {OLD_UV} wheel fetched on this machine: run `{FILL}` once"
        if os.environ.get("CI") == "true":  # .ci/run fetches it before the tests
            pytest.fail(f"{why}; CI fetches it, so this test must run there")
        pytest.skip(why)
    return wheel


def env(index: SimpleIndex, package: str, uv_version: str) -> str:
    options = ["--index-url", index.simple]
    uv = {"packages": [package], "uv_version": uv_version, "uv_pip_install_options": options}
    return json.dumps({"uv": uv})


def dirs(ra: RunningAgent, kind: str) -> list[Path]:
    return [ra.root / "uris" / name for name in ra.uri_dirs() if name.startswith(f"{kind}-")]


def built_by(venv: Path) -> str:
    """The uv that made the venv, as ``uv venv`` writes it in its pyvenv.cfg."""
    lines = (venv / "pyvenv.cfg").read_text().splitlines()
    return next(line for line in lines if line.startswith("uv = ")).removeprefix("uv = ")


async def test_two_envs_of_one_uv_version_are_built_by_that_uv_fetched_once(
    tmp_path: Path, old_uv: Path
) -> None:
    wheels = [old_uv, write_wheel(tmp_path, "uvvera"), write_wheel(tmp_path, "uvverb")]
    async with simple_index(wheels) as index, running_agent() as ra:
        agents_uv = agents_uv_version()
        assert agents_uv, "the agent's own uv tells its version"
        assert agents_uv != OLD_UV, "the agent's own uv is another version"
        a, b = await asyncio.gather(
            ra.create(env(index, "uvvera", f"=={OLD_UV}"), timeout_s=BUILD_S),
            ra.create(env(index, "uvverb", f"=={OLD_UV}"), timeout_s=BUILD_S),
        )
        assert index.gets_of("uv") == 1, "one download of the uv, shared by the two envs"
        [tool] = dirs(ra, "uv_tool")
        assert (tool / "bin" / "uv").is_file()
        venvs = dirs(ra, "uv")
        assert len(venvs) == 2
        assert [built_by(venv) for venv in venvs] == [OLD_UV, OLD_UV], "built by uv 0.4.0"
        [tool_a] = [u for u in a.uris if u.startswith("uv_tool:uvtool://")]
        assert [u for u in b.uris if u.startswith("uv_tool:")] == [tool_a], "one package"
        seen = await probe(a.context, "uvvera")
        assert seen["uvvera"][0] == "uvvera 1.0"
        assert seen["uvvera"][1].startswith(str(ra.root.resolve() / "uris"))
        [held] = [u for u in (await ra.info()).uris if u.kind == "uv_tool"]
        assert (held.state, held.references) == ("ready", 2), "counted like any package"

        for reply in (a, b):
            assert await ra.delete(reply.runtime_env_id) == 0
        await ra.settle()
        [unused] = [u for u in (await ra.info()).uris if u.kind == "uv_tool"]
        assert (unused.state, unused.references) == ("unused", 0), "evictable once unnamed"

        again = await ra.create(env(index, "uvvera", f"=={OLD_UV}"), timeout_s=BUILD_S)
        assert again.uris == a.uris
        assert index.gets_of("uv") == 1, "kept in the root: not fetched again"


WORKER_UV = "import importlib.metadata as m, sys; print(m.version('uv'), sys.prefix)"


async def test_the_worker_sees_the_uv_of_its_uv_version_installed_in_its_venv(
    tmp_path: Path, old_uv: Path
) -> None:
    """Ray installs ``uv<uv_version>`` into the env's venv, and its test asks the worker
    ``importlib.metadata.version("uv")``: here too, a distribution of the venv's own (its
    ``bin/uv`` too), linked from the wheel cache the uv package's build filled: one download."""
    wheels = [old_uv, write_wheel(tmp_path, "uvvere")]
    async with simple_index(wheels) as index, running_agent() as ra:
        reply = await ra.create(env(index, "uvvere", f"=={OLD_UV}"), timeout_s=BUILD_S)
        context = reply.context
        code, out, err = await run(
            context.py_executable, "-c", WORKER_UV, env={**os.environ, **context.env_vars}
        )
        assert code == 0, err
        version, prefix = out.split()
        assert version == OLD_UV, out
        [venv] = dirs(ra, "uv")
        assert Path(prefix) == venv.resolve(), "the venv's own distribution"
        _, told, _ = await run(str(venv / "bin" / "uv"), "--version")
        assert told.split()[:2] == ["uv", OLD_UV], told
        assert index.gets_of("uv") == 1, "the venv's uv linked from the wheel cache"


async def test_a_uv_version_no_index_has_fails_failed_precondition_in_the_installers_words(
    tmp_path: Path, old_uv: Path
) -> None:
    wheels = [old_uv, write_wheel(tmp_path, "uvverc")]
    async with simple_index(wheels) as index, running_agent() as ra:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(env(index, "uvverc", "==0.0.1"), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "uv.uv_version '==0.0.1': the uv it asks for was not installed" in details
        assert "uv_tool:uvtool://" in details, details  # the package that failed, named
        assert "No solution found when resolving dependencies" in details, details
        assert "uv==0.0.1" in details, details  # uv's words, naming what it could not find
        assert index.gets_of("uv") == 0
        await ra.settle()
        assert dirs(ra, "uv_tool") == dirs(ra, "uv") == [], "nothing half-built is kept"

        served = await ra.create(env(index, "uvverc", ">=0.1"), timeout_s=BUILD_S)
        assert (await probe(served.context, "uvverc"))["uvverc"][0] == "uvverc 1.0"


async def test_an_option_the_older_uv_does_not_take_fails_saying_so(
    tmp_path: Path, old_uv: Path
) -> None:
    """``--default-index`` came in uv 0.4.23: the agent's uv fetches uv 0.4.0 with it, and uv
    0.4.0 refuses it when it builds the env; the error says which uv refused, and why."""
    wheels = [old_uv, write_wheel(tmp_path, "uvverd")]
    async with simple_index(wheels) as index, running_agent() as ra:
        options = ["--default-index", index.simple]
        uv = {
            "packages": ["uvverd"],
            "uv_version": f"=={OLD_UV}",
            "uv_pip_install_options": options,
        }
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(json.dumps({"uv": uv}), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "unexpected argument '--default-index'" in details, details  # uv 0.4.0's words
        assert f"built by the uv of uv.uv_version '=={OLD_UV}'" in details, details
        assert "does not take an option" in details, details
        assert index.gets_of("uv") == 1, "the uv was fetched, with the option"
