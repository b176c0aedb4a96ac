"""The uv of a ``uv_version``, its pure parts: when an env names one (the agent's uv not
satisfying the specifier), the set that installs it (the env's places, ``--no-build``), its
place among the env's packages and nowhere on the worker, and a create's installs that start a
uv venv only once the env's tools are installed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent.app.ensures import start_ensures
from agent.core.context import build_context
from agent.core.dialect import RAY
from agent.core.errors import InstallerFailed
from agent.core.packages import Package, tool_package
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from agent.core.uris import UriKey, UriKind
from agent.core.uv_spec import UvSpec, options_among, parse_uv
from agent.core.uv_tool import SCHEME, uv_set, uv_tool
from agent.install.installers.pip_venv import refused_an_option

INDEX = "http://127.0.0.1:1/simple"


def spec(value: Any) -> UvSpec:
    parsed = parse_uv(value)
    assert parsed is not None
    return parsed


def parse(value: Any, agent_uv: str = "0.13.9", **kwargs: Any) -> RuntimeEnv:
    return parse_runtime_env(json.dumps(value), EnvLimits(), agent_uv=agent_uv, **kwargs)


@pytest.mark.parametrize(
    ("uv_version", "agent_uv", "fetched"),
    [
        ("", "0.13.9", False),  # no uv_version: the agent's uv
        ("==0.13.9", "0.13.9", False),
        (">=0.5,<1", "0.13.9", False),
        ("==0.4.0", "0.13.9", True),
        ("<0.5", "0.13.9", True),
        ("==0.13.9", "", True),  # the agent's uv tells no version: never taken as satisfying
    ],
)
def test_a_uv_is_fetched_only_when_the_agents_does_not_satisfy_the_specifier(
    uv_version: str, agent_uv: str, fetched: bool
) -> None:
    tool = uv_tool(spec({"packages": ["a"], "uv_version": uv_version}), agent_uv)
    assert (tool is not None) == fetched


def test_the_uv_is_installed_from_the_envs_places_as_a_wheel_only() -> None:
    options = ["--no-deps", "--index-url", INDEX, "--resolution", "lowest",
               "--extra-index-url=http://127.0.0.1:2/simple", "-f", "/wheels", "--no-index",
               "--prerelease", "allow", "--index-strategy", "unsafe-best-match"]  # fmt: skip
    value = {"packages": ["a"], "uv_version": "== 0.4.0", "uv_pip_install_options": options}
    tool = uv_tool(spec(value), "0.13.9")
    assert tool is not None
    assert tool.version == "==0.4.0"
    assert tool.spec.packages == ("uv==0.4.0",)
    assert tool.spec.options == (
        "--index-url", INDEX, "--extra-index-url=http://127.0.0.1:2/simple", "-f", "/wheels",
        "--no-index", "--index-strategy", "unsafe-best-match", "--no-build",
    )  # fmt: skip
    assert (tool.spec.uv_version, tool.spec.uv_check, tool.spec.sees) == ("", False, None)
    assert tool.uri.startswith(SCHEME)


@pytest.mark.parametrize("agent_uv", ["0.13.9", "0.4.0"])
def test_the_venv_gets_the_uv_of_its_uv_version_whichever_uv_builds_it(agent_uv: str) -> None:
    """Ray installs ``uv<uv_version>`` into the venv: the set is the uv package's own, so the
    agent's uv links the wheel that package's build put in the cache."""
    value = {"packages": ["a"], "uv_version": "==0.4.0", "uv_pip_install_options": ["-i", INDEX]}
    installs = uv_set(spec(value))
    assert installs is not None
    assert (installs.packages, installs.options) == (("uv==0.4.0",), ("-i", INDEX, "--no-build"))
    tool = uv_tool(spec(value), agent_uv)
    assert (None if tool is None else tool.spec) == (None if agent_uv == "0.4.0" else installs)
    assert uv_set(spec({"packages": ["a"]})) is None, "no uv_version: no uv installed"


def test_options_among_takes_each_flag_with_its_value_in_either_spelling() -> None:
    options = ("--resolution", "--index-url", "-i", "x", "--index-url=y", "--offline")
    # "--index-url" here is --resolution's value (nonsense, but a value): not taken as a flag
    assert options_among(options, frozenset({"--index-url", "-i", "--offline"})) == (
        "-i", "x", "--index-url=y", "--offline",
    )  # fmt: skip


def test_envs_of_one_uv_version_and_places_share_one_uv_and_others_do_not() -> None:
    def uri(packages: list[str], version: str, options: list[str]) -> str:
        value = {"packages": packages, "uv_version": version, "uv_pip_install_options": options}
        tool = uv_tool(spec(value), "0.13.9")
        assert tool is not None
        return tool.uri

    here = ["--index-url", INDEX]
    assert uri(["a"], "==0.4.0", here) == uri(["b", "c"], "==0.4.0", [*here, "--no-deps"])
    assert uri(["a"], "==0.4.0", here) != uri(["a"], "==0.4.1", here)
    assert uri(["a"], "==0.4.0", here) != uri(["a"], "==0.4.0", ["--index-url", INDEX + "2"])


def test_the_env_names_its_uv_before_the_venv_it_builds_and_its_id_is_the_same() -> None:
    value = {"uv": {"packages": ["a"], "uv_version": "==0.4.0"}, "working_dir": "file:///w.zip"}
    env = parse(value)
    kinds = [p.key.kind for p in env.packages]
    assert kinds == [UriKind.WORKING_DIR, UriKind.UV_TOOL, UriKind.UV]
    tool, venv = env.packages[1:]
    assert tool == tool_package(venv.recipe, "0.13.9")  # type: ignore[arg-type]
    satisfied = parse(value, agent_uv="0.4.0")
    assert [p.key.kind for p in satisfied.packages] == [UriKind.WORKING_DIR, UriKind.UV]
    assert satisfied.env_id == env.env_id, "one env: the uv that builds it is not its identity"
    assert satisfied.packages[1] == venv, "one venv: its key keeps uv_version"
    assert '"uv_version":"==0.4.0"' in env.canonical


def test_the_ray_doors_venv_and_a_set_naming_node_files_name_their_uv_too(
    tmp_path: Path,
) -> None:
    ray = parse({"uv": {"packages": ["a"], "uv_version": "==0.4.0"}}, dialect=RAY)
    assert [p.key.kind for p in ray.packages] == [UriKind.UV_TOOL, UriKind.RAY_UV]
    wheel = tmp_path / "a-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    local = parse({"uv": {"packages": [str(wheel)], "uv_version": "==0.4.0"}})
    assert local.local_venv is not None, "the venv is derived at create, from the file's bytes"
    assert [p.key.kind for p in local.packages] == [UriKind.UV_TOOL]


def test_the_uv_is_placed_nowhere_on_the_worker() -> None:
    env = parse({"uv": {"packages": ["a"], "uv_version": "==0.4.0"}})
    assert [p.key.kind for p in env.packages] == [UriKind.UV_TOOL, UriKind.UV]

    def path_for(key: UriKey) -> Path:
        return Path("/root/uris") / key.kind.value

    context = build_context(env, path_for, py_executable="/usr/bin/python3", limits=EnvLimits())
    assert context.py_executable == "/root/uris/uv/bin/python"
    assert "uv_tool" not in json.dumps(context.env_vars)
    assert (context.cwd, context.java_jars) == ("", ())


def test_an_older_uvs_refusal_of_an_argument_is_recognised() -> None:
    assert refused_an_option("error: unexpected argument '--default-index' found")
    assert refused_an_option("error: invalid value 'x' for '--resolution <RESOLUTION>'")
    assert not refused_an_option("error: No solution found when resolving dependencies")


async def test_a_uv_venv_starts_once_the_envs_uv_is_installed_and_not_if_it_failed() -> None:
    env = parse(
        {"uv": {"packages": ["a"], "uv_version": "==0.4.0"}, "py_modules": ["file:///m.zip"]}
    )
    events: list[str] = []
    tool_done = asyncio.Event()

    async def ensure(package: Package) -> Path:
        kind = package.key.kind.value
        events.append(f"start {kind}")
        if package.key.kind is UriKind.UV_TOOL:
            await tool_done.wait()
        events.append(f"end {kind}")
        return Path(kind)

    tasks = start_ensures(env.packages, ensure)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sorted(events) == ["end py_modules", "start py_modules", "start uv_tool"]
    tool_done.set()
    assert [p.name for p in await asyncio.gather(*tasks)] == ["py_modules", "uv_tool", "uv"]
    assert events.index("start uv") > events.index("end uv_tool")

    started: list[UriKind] = []

    async def failing(package: Package) -> Path:
        started.append(package.key.kind)
        if package.key.kind is UriKind.UV_TOOL:
            raise InstallerFailed("no such uv")
        return Path()

    tasks = start_ensures(env.packages, failing)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r).__name__ for r in results] == [
        "PosixPath",
        "InstallerFailed",
        "InstallerFailed",
    ]
    assert UriKind.UV not in started, "no build without its uv"
