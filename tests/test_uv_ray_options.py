"""Ray's ``uv`` field as Ray's agent takes it, through a real in-process agent on a real socket,
the agent's uv and a real package index on 127.0.0.1: the option lines of a list (Ray writes the
list into a requirements file for ``uv pip install -r``), ``uv_pip_install_options`` the agent
refused before and takes now, and a place a line names checked against the allowed roots as
every place uv reads is. No request leaves loopback: every proxy is a closed port but for
127.0.0.1, so only the test's index answers."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.pip_wheels import isolate_pip, offline
from tests.harness.uv_wheels import have_uv, no_network
from tests.harness.venvs import BUILD_S, nothing_left, probe, status_of, still_serves
from tests.harness.wheel_index import wheel_index

pytestmark = pytest.mark.skipif(not have_uv(), reason="no uv beside the python nor on PATH")

DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_pip(monkeypatch)
    no_network(monkeypatch)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the test's index, and only it, answers


def alpha(wheels: Path) -> Path:
    [found] = wheels.glob("alpha_pkg-*.whl")
    return found


def site_packages(python: str) -> Path:
    [found] = Path(python).parent.parent.glob("lib/python*/site-packages")
    return found


async def refusal(ra: RunningAgent, text: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await ra.create(text, timeout_s=int(BUILD_S))
    return status_of(refused.value)


async def test_an_index_url_line_in_a_uv_list_builds_the_venv_from_that_index(
    wheels: Path,
) -> None:
    """Before: the line refused as an option line (INVALID_ARGUMENT). As Ray's agent writes the
    list into a requirements file, uv's ``--index-url`` line says where uv finds the set: only
    the index on 127.0.0.1 has alpha-pkg (the default index is behind a closed proxy)."""
    async with wheel_index(alpha(wheels)) as simple, running_agent() as ra:
        packages = [f"--index-url {simple}", "alpha-pkg"]
        reply = await ra.create(json.dumps({"uv": packages}), timeout_s=int(BUILD_S))
        assert [uri.partition(":")[0] for uri in reply.uris] == ["uv"]
        seen = await probe(reply.context, "alpha_pkg")
        assert seen["alpha_pkg"][0] == "alpha 1.0"
        assert seen["alpha_pkg"][1].startswith(str(site_packages(reply.context.py_executable)))
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_uv_options_the_agent_refused_before_now_build_the_venv(wheels: Path) -> None:
    """Before: '--reinstall-package' was 'not an option an env may pass'. Every option of
    ``uv pip install`` but those that break the agent's guarantees is taken and given to uv:
    here --no-installer-metadata shows in the venv (no INSTALLER file beside the package)."""
    options = [*offline(wheels), "--reinstall-package", "alpha-pkg", "--no-installer-metadata"]
    field = {"packages": ["alpha-pkg"], "uv_pip_install_options": options}
    async with running_agent() as ra:
        reply = await ra.create(json.dumps({"uv": field}), timeout_s=int(BUILD_S))
        assert (await probe(reply.context, "alpha_pkg"))["alpha_pkg"][0] == "alpha 1.0"
        [info] = site_packages(reply.context.py_executable).glob("alpha_pkg-*.dist-info")
        assert not (info / "INSTALLER").exists(), sorted(p.name for p in info.iterdir())
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_a_uv_line_naming_a_place_outside_the_allowed_roots_is_permission_denied(
    base: Path,
) -> None:
    """Before: INVALID_ARGUMENT, as an option line. A line's place is one uv reads, checked
    as an option's is (each of a --find-links uv splits at commas): outside the roots,
    PERMISSION_DENIED before uv runs; a line reading a file is refused naming why."""
    allowed, outside = base / "allowed", base / "outside"
    for folder in (allowed, outside):
        folder.mkdir()
    async with running_agent(allow_file_roots=(str(allowed),)) as ra:
        for line in (
            f"--index-url {outside.as_uri()}",
            f"--find-links={allowed},{outside}",
            f"--extra-index-url {(allowed / 'simple').as_uri()}",
        ):
            code, message = await refusal(ra, json.dumps({"uv": [line, "alpha-pkg"]}))
            assert code == DENIED, (line, message)
        code, message = await refusal(ra, json.dumps({"uv": [f"-c {allowed}/c.txt", "a"]}))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, message
        assert "reads a constraints file" in message, message
        await nothing_left(ra)
        await still_serves(ra)
