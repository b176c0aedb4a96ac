"""Unit tests for build_context: PYTHONPATH order, cwd, and the process-size check."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.core.context import build_context
from agent.core.errors import InvalidRuntimeEnv
from agent.core.packages import Package
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from agent.core.uris import UriKey, UriKind, parse_uri
from agent.doors.ray_context import build_ray_context

LIMITS = EnvLimits()
WD = "file:///pkgs/wd.zip"
M1 = "http://127.0.0.1:1/m1.zip"
M2 = "file:///pkgs/m2.zip"


def env(**fields: Any) -> RuntimeEnv:
    return parse_runtime_env(json.dumps(fields), LIMITS)


def path_for(key: UriKey) -> Path:
    """A stand-in for UriStore.path_for: distinct per (kind, uri)."""
    return Path("/store/uris") / f"{key.kind.value}-{key.uri.rsplit('/', 1)[-1]}"


def test_pythonpath_is_working_dir_then_py_modules_in_order_then_the_env_own() -> None:
    e = env(working_dir=WD, py_modules=[M2, M1], env_vars={"PYTHONPATH": "/own/a:/own/b"})
    ctx = build_context(e, path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert ctx.env_vars["PYTHONPATH"].split(os.pathsep) == [
        "/store/uris/working_dir-wd.zip",
        "/store/uris/py_modules-m2.zip",
        "/store/uris/py_modules-m1.zip",
        "/own/a",
        "/own/b",
    ]
    assert ctx.cwd == "/store/uris/working_dir-wd.zip"
    assert ctx.py_executable == "/usr/bin/python3"


def test_env_vars_are_passed_through_and_the_parsed_env_is_not_mutated() -> None:
    e = env(py_modules=[M1], env_vars={"A": "1", "B": "two"})
    ctx = build_context(e, path_for, py_executable="py", limits=LIMITS)
    assert ctx.env_vars == {"A": "1", "B": "two", "PYTHONPATH": "/store/uris/py_modules-m1.zip"}
    assert "PYTHONPATH" not in e.env_vars


def test_cwd_is_empty_without_a_working_dir() -> None:
    ctx = build_context(env(py_modules=[M1, M2]), path_for, py_executable="py", limits=LIMITS)
    assert ctx.cwd == ""
    assert ctx.env_vars["PYTHONPATH"].split(os.pathsep) == [
        "/store/uris/py_modules-m1.zip",
        "/store/uris/py_modules-m2.zip",
    ]


def test_an_empty_env_gets_no_pythonpath_and_no_cwd() -> None:
    ctx = build_context(env(), path_for, py_executable="py", limits=LIMITS)
    assert ctx.env_vars == {}
    assert ctx.cwd == ""


def test_the_env_own_pythonpath_alone_is_kept() -> None:
    ctx = build_context(
        env(env_vars={"PYTHONPATH": "/own"}), path_for, py_executable="py", limits=LIMITS
    )
    assert ctx.env_vars["PYTHONPATH"] == "/own"


def test_working_dir_also_used_as_a_py_module_appears_twice_on_the_path() -> None:
    ctx = build_context(
        env(working_dir=M1, py_modules=[M1]), path_for, py_executable="py", limits=LIMITS
    )
    assert ctx.env_vars["PYTHONPATH"].split(os.pathsep) == [
        "/store/uris/working_dir-m1.zip",
        "/store/uris/py_modules-m1.zip",
    ]
    assert ctx.cwd == "/store/uris/working_dir-m1.zip"


def test_the_size_check_counts_the_added_pythonpath() -> None:
    """An env that fits alone is refused once a long store path is added to PYTHONPATH."""
    e = env(py_modules=[M1], env_vars={"A": "1"})
    limits = EnvLimits(max_env_var_bytes=200)
    build_context(e, path_for, py_executable="py", limits=limits)

    def long_path_for(key: UriKey) -> Path:
        return Path("/store") / ("d" * 300)

    with pytest.raises(InvalidRuntimeEnv) as info:
        build_context(e, long_path_for, py_executable="py", limits=limits)
    assert "the limit is 200 bytes" in info.value.message
    assert "max_env_var_bytes" in info.value.message


def test_a_pythonpath_pushed_over_max_arg_strlen_is_refused_naming_it() -> None:
    """The env's own PYTHONPATH fits one execve string; with a store path prepended, not."""
    e = env(py_modules=[M1], env_vars={"PYTHONPATH": "/o" * 65_520})
    with pytest.raises(InvalidRuntimeEnv) as info:
        build_context(e, path_for, py_executable="py", limits=EnvLimits(max_env_var_bytes=1 << 30))
    assert "env_vars['PYTHONPATH']" in info.value.message
    assert "MAX_ARG_STRLEN" in info.value.message


def test_a_pip_env_runs_its_venv_python_and_stays_off_the_path_behind_the_zip_kinds() -> None:
    """Each kind placed as ``PLACEMENTS`` says: the venv gives the python only; the working dir
    the cwd and the first PYTHONPATH entry; py_modules follow."""
    e = env(pip=["requests"], py_modules=[M1], working_dir=WD)
    ctx = build_context(e, path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    venv = path_for(e.uri_keys[-1])
    assert venv.name.startswith("pip-")
    assert ctx.py_executable == str(venv / "bin" / "python")
    assert ctx.env_vars["PYTHONPATH"].split(os.pathsep) == [
        "/store/uris/working_dir-wd.zip",
        "/store/uris/py_modules-m1.zip",
    ]
    assert ctx.cwd == "/store/uris/working_dir-wd.zip"


def test_the_envs_own_py_executable_wins_over_the_agents_python_and_a_pip_venvs() -> None:
    """As in Ray, whose py_executable plugin runs after its pip plugin and replaces the python."""
    plain = build_context(env(), path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert plain.py_executable == "/usr/bin/python3"
    own = env(py_executable="python3 -X utf8")
    ctx = build_context(own, path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert ctx.py_executable == "python3 -X utf8"
    with_pip = env(py_executable="/opt/wrap.sh --fast", pip=["requests"])
    ctx = build_context(with_pip, path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert ctx.py_executable == "/opt/wrap.sh --fast"


def test_java_jars_are_their_folders_in_order_and_on_no_python_path() -> None:
    e = env(java_jars=["file:///jars/b.jar", "http://127.0.0.1:1/a.zip"], py_modules=[M1])
    ctx = build_context(e, path_for, py_executable="py", limits=LIMITS)
    assert ctx.java_jars == ("/store/uris/java_jars-b.jar", "/store/uris/java_jars-a.zip")
    assert ctx.env_vars["PYTHONPATH"] == "/store/uris/py_modules-m1.zip"
    assert (ctx.cwd, ctx.py_executable) == ("", "py")
    assert build_context(env(), path_for, py_executable="py", limits=LIMITS).java_jars == ()


def test_a_python_path_the_agent_gives_is_one_shell_word_whatever_it_holds() -> None:
    """py_executable is shell words: a venv under a root with a space (or the agent's python in
    such a folder) is quoted, and splitting it gives the path back; a plain path is as it is."""
    import shlex

    def spaced(key: UriKey) -> Path:
        return Path("/it's a root/uris") / key.kind.value

    ctx = build_context(env(pip=["requests"]), spaced, py_executable="py", limits=LIMITS)
    assert shlex.split(ctx.py_executable) == ["/it's a root/uris/pip/bin/python"]
    ctx = build_context(env(), path_for, py_executable="/my python/bin/py", limits=LIMITS)
    assert shlex.split(ctx.py_executable) == ["/my python/bin/py"]
    plain = build_context(env(), path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert plain.py_executable == "/usr/bin/python3"


def test_a_uv_run_env_runs_its_project_venvs_python_instead_of_its_uv_run_line() -> None:
    """A uv run env whose project venv the agent built: the worker runs the venv's python with
    VIRTUAL_ENV set, in both contexts (the gRPC door's and Ray's), PATH's first folder its bin
    for Ray's; the working dir stays the cwd and on the path."""
    uv_env = env(working_dir=WD, py_executable="uv run --python 3.11.7 python")
    project = Package(UriKey(UriKind.UV_PROJECT, "uvproject://x y"), parse_uri("x", WD))
    venv = path_for(project.key)
    context = build_context(
        uv_env, path_for, py_executable="/usr/bin/python3", limits=LIMITS, derived=(project,)
    )
    assert context.py_executable == "'/store/uris/uv_project-x y/bin/python'"
    assert context.env_vars["VIRTUAL_ENV"] == str(venv)
    assert context.cwd == str(path_for(uv_env.uri_keys[0]))
    ray = build_ray_context(
        uv_env, path_for, py_executable="/usr/bin/python3", node_pythonpath="",
        python_version=(3, 11), derived=(project,),
    )  # fmt: skip
    assert ray["py_executable"] == context.py_executable
    env_vars = ray["env_vars"]
    assert isinstance(env_vars, dict)
    assert env_vars["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert env_vars["VIRTUAL_ENV"] == str(venv)
    without = build_context(uv_env, path_for, py_executable="/usr/bin/python3", limits=LIMITS)
    assert without.py_executable == "uv run --python 3.11.7 python"  # not built: uv runs
