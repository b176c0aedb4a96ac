"""The worker context in Ray's format (pure): exactly Ray's five keys (Ray's worker does
``RuntimeEnvContext(**json.loads(...))``: an unknown key crashes it), the working dir as a quoted
``cd`` prefix, PYTHONPATH in Ray's order, a pip venv's site-packages and bin, the base python."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from agent.core.dialect import RAY
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from agent.core.uris import UriKey
from agent.doors.ray_context import RAY_CONTEXT_KEYS, build_ray_context

BASE = "/usr/bin/python3"


def path_for(key: UriKey) -> Path:
    return Path("/root/uris") / f"{key.kind.value}-{key.uri.rsplit('/', 1)[-1]}"


def env(obj: object) -> RuntimeEnv:
    return parse_runtime_env(json.dumps(obj), EnvLimits())


def context(obj: object, node_pythonpath: str = "/node/lib") -> dict[str, object]:
    return build_ray_context(
        env(obj), path_for, py_executable=BASE, node_pythonpath=node_pythonpath,
        python_version=(3, 11),
    )  # fmt: skip


def test_the_keys_are_exactly_those_of_rays_runtime_env_context() -> None:
    from ray._private.runtime_env.context import RuntimeEnvContext  # the test may import ray

    ray_keys = tuple(inspect.signature(RuntimeEnvContext.__init__).parameters)[1:]
    assert ray_keys == RAY_CONTEXT_KEYS
    built = context({"working_dir": "https://h/wd.zip", "pip": ["requests"]})
    assert tuple(built) == ray_keys
    RuntimeEnvContext.deserialize(json.dumps(built))  # type: ignore[no-untyped-call]  # as Ray's worker


def test_an_empty_env_changes_nothing() -> None:
    assert context({}) == {
        "command_prefix": [],
        "env_vars": {},
        "py_executable": BASE,
        "override_worker_entrypoint": None,
        "java_jars": [],
    }


def test_the_working_dir_is_a_quoted_cd_prefix() -> None:
    """Ray joins the prefix with spaces and runs it with bash -c: a root with a space or a
    quote in it must stay one word."""

    def odd_root(key: UriKey) -> Path:
        return Path("/it's a root/uris") / key.kind.value

    built = build_ray_context(
        env({"working_dir": "https://h/wd.zip"}), odd_root, py_executable=BASE,
        node_pythonpath="", python_version=(3, 11),
    )  # fmt: skip
    assert built["command_prefix"] == ["cd", "'/it'\"'\"'s a root/uris/working_dir'", "&&"]


def test_pythonpath_is_working_dir_then_modules_then_venv_then_own_then_node() -> None:
    built = context(
        {
            "py_modules": ["https://h/m1.zip", "https://h/m2.zip"],
            "working_dir": "https://h/wd.zip",
            "pip": ["requests"],
            "env_vars": {"PYTHONPATH": "/own", "X": "1"},
        }
    )
    env_vars = built["env_vars"]
    assert isinstance(env_vars, dict)
    pip_folder = next(p for p in env_vars["PYTHONPATH"].split(":") if "pip-" in p)
    assert env_vars["PYTHONPATH"].split(":") == [
        "/root/uris/working_dir-wd.zip",
        "/root/uris/py_modules-m1.zip",
        "/root/uris/py_modules-m2.zip",
        pip_folder,
        "/own",
        "/node/lib",
    ]
    assert pip_folder.endswith("/lib/python3.11/site-packages")
    venv = pip_folder.removesuffix("/lib/python3.11/site-packages")
    assert env_vars["PATH"] == f"{venv}/bin:${{PATH}}"
    assert env_vars["X"] == "1"
    assert built["py_executable"] == BASE  # a Ray worker must import ray: the base python


def test_a_pip_env_keeps_its_own_path_after_the_venv_bin() -> None:
    built = context({"pip": ["requests"], "env_vars": {"PATH": "/opt/bin"}})
    env_vars = built["env_vars"]
    assert isinstance(env_vars, dict)
    assert env_vars["PATH"].endswith("/bin:/opt/bin")
    assert env_vars["PATH"].startswith("/root/uris/pip-")


def test_env_vars_alone_leave_pythonpath_and_path_unset() -> None:
    assert context({"env_vars": {"A": "1"}})["env_vars"] == {"A": "1"}
    assert context({"env_vars": {"PYTHONPATH": "/own"}})["env_vars"] == {"PYTHONPATH": "/own"}


def test_without_a_node_pythonpath_none_is_appended() -> None:
    built = context({"working_dir": "https://h/wd.zip"}, node_pythonpath="")
    assert built["env_vars"] == {"PYTHONPATH": "/root/uris/working_dir-wd.zip"}


def test_the_envs_py_executable_is_rays_worker_command_even_with_a_pip_venv() -> None:
    """Ray's py_executable plugin runs after its pip plugin: the env's command wins; a bare
    ``python`` in it finds the venv's first on the PATH the context sets."""
    from ray._private.runtime_env.context import RuntimeEnvContext

    built = context({"py_executable": "python -X faulthandler", "pip": ["requests"]})
    assert built["py_executable"] == "python -X faulthandler"
    env_vars = built["env_vars"]
    assert isinstance(env_vars, dict)
    assert env_vars["PATH"].startswith("/root/uris/pip-")
    ray = RuntimeEnvContext.deserialize(json.dumps(built))  # type: ignore[no-untyped-call]
    assert ray.py_executable == "python -X faulthandler"
    assert context({})["py_executable"] == BASE


def test_a_uv_run_line_naming_no_program_left_to_uv_gets_python() -> None:
    """Ray 2.51's hook writes ``<uv> run <flags>`` (the worker's script after it); left to uv,
    the worker is given ``<uv> run <flags> python``, whose project is the working dir's."""
    built = context({"working_dir": "https://h/wd.zip", "py_executable": "/u/uv run --offline"})
    assert built["py_executable"] == "/u/uv run --offline python"


def test_java_jars_are_the_folders_rays_java_worker_puts_on_its_class_path() -> None:
    built = context({"java_jars": ["https://h/a.jar", "file:///j/libs.zip"]})
    assert built["java_jars"] == ["/root/uris/java_jars-a.jar", "/root/uris/java_jars-libs.zip"]
    assert built["env_vars"] == {}, "no python path for jars"
    assert built["command_prefix"] == []


def test_the_base_python_is_one_shell_word_for_rays_bash_command() -> None:
    import shlex

    built = build_ray_context(
        env({}), path_for, py_executable="/my python/bin/python3", node_pythonpath="",
        python_version=(3, 11),
    )  # fmt: skip
    assert isinstance(built["py_executable"], str)
    assert shlex.split(built["py_executable"]) == ["/my python/bin/python3"]


def test_a_venv_with_rays_semantics_runs_the_worker_under_its_python() -> None:
    """As Ray's pip and uv plugins do: the venv's python (quoted), VIRTUAL_ENV, its bin first on
    PATH; its site-packages is the python's own, not on PYTHONPATH (so .pth files count)."""
    for field in ("pip", "uv"):
        ray_env = parse_runtime_env(
            json.dumps({field: ["requests"], "working_dir": "https://h/wd.zip"}), EnvLimits(),
            dialect=RAY,
        )  # fmt: skip
        built = build_ray_context(
            ray_env, path_for, py_executable=BASE, node_pythonpath="/node/lib",
            python_version=(3, 11),
        )  # fmt: skip
        env_vars = built["env_vars"]
        assert isinstance(env_vars, dict)
        venv = env_vars["VIRTUAL_ENV"]
        assert venv.startswith(f"/root/uris/ray_{field}-"), env_vars
        assert built["py_executable"] == f"{venv}/bin/python"
        assert env_vars["PATH"] == f"{venv}/bin:${{PATH}}"
        assert env_vars["PYTHONPATH"] == "/root/uris/working_dir-wd.zip:/node/lib"
