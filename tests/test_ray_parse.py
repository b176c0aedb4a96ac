"""Ray's own spellings of a runtime env parse, as its driver serialises them (pure): Ray's
extension keys and ``config`` (with ``log_files``) are accepted and are not part of identity;
Ray's normalised pip form parses; unknown fields are still refused by name over gRPC
(the Ray door ignores them: tests/test_ray_unknown_fields.py)."""

from __future__ import annotations

import json

import pytest

from agent.core.dialect import RAY
from agent.core.errors import InvalidRuntimeEnv
from agent.core.pip_spec import PipSpec
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uv_spec import UvSpec

LIMITS = EnvLimits()


def parse(obj: object) -> str:
    """The env id of ``obj`` serialised."""
    return parse_runtime_env(json.dumps(obj), LIMITS).env_id


def test_spacing_does_not_change_the_env_id() -> None:
    spaced = parse_runtime_env('{"env_vars": {"A": "1"}}', LIMITS)
    tight = parse_runtime_env('{"env_vars":{"A":"1"}}', LIMITS)
    assert spaced.env_id == tight.env_id


@pytest.mark.parametrize(
    "extra",
    [
        {"_ray_commit": "b7f4259e944bf6959f721b106adc366ddfa0c356"},
        {"_ray_release": "2.60.0"},
        {"_inject_current_ray": True},
        {"excludes": ["*.log", "data/"]},
        {"worker_process_setup_hook": "setup_logging"},  # the worker runs it, not the agent
        {"config": {"setup_timeout_seconds": 600, "eager_install": True, "log_files": []}},
        {"config": {"log_files": ["worker.log"]}},
    ],
)
def test_ray_extension_keys_are_accepted_and_not_identity(extra: dict[str, object]) -> None:
    base = {"env_vars": {"A": "1"}, "working_dir": "https://example.com/p.zip"}
    assert parse({**base, **extra}) == parse(base)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"_ray_commit": 5}, "_ray_commit must be a string"),
        ({"_ray_release": ["x"]}, "_ray_release must be a string"),
        ({"_inject_current_ray": "yes"}, "_inject_current_ray must be a boolean"),
        ({"excludes": "x"}, "excludes must be a list of strings"),
        ({"worker_process_setup_hook": 1}, "worker_process_setup_hook must be a string"),
        ({"excludes": [1]}, "excludes must be a list of strings"),
        ({"config": {"log_files": "x.log"}}, "config.log_files must be a list of strings"),
    ],
)
def test_ray_extension_keys_of_the_wrong_type_are_refused(
    extra: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidRuntimeEnv, match=words):
        parse({"env_vars": {"A": "1"}, **extra})


def test_unknown_fields_are_still_refused_by_name() -> None:
    with pytest.raises(InvalidRuntimeEnv) as caught:
        parse({"env_vars": {"A": "1"}, "_ray_secret": 1, "nsight": "x", "conda": "x"})
    assert "'_ray_secret'" in caught.value.message
    assert "'nsight'" in caught.value.message
    assert "Ray spells 'nsight' as '_nsight'" in caught.value.message
    assert "'conda'" not in caught.value.message, "conda is Ray's: refused as unsupported here"


def test_ray_normalised_pip_parses_as_the_list_form() -> None:
    listed = parse({"pip": ["requests"]})
    normalised = parse({"pip": {"packages": ["requests"], "pip_check": False}})
    with_version_unset = parse({"pip": {"packages": ["requests"], "pip_version": None}})
    assert listed == normalised == with_version_unset


def test_pip_check_true_is_taken_and_names_another_env() -> None:
    """Before: refused. Ray's agent runs ``pip check`` after the install: so does this one."""
    checked = parse({"pip": {"packages": ["requests"], "pip_check": True}})
    assert checked != parse({"pip": ["requests"]})


def test_a_pip_version_is_taken_and_names_another_env() -> None:
    """Before: refused. Ray's agent installs ``pip<version>`` into the venv: so does this one."""
    pinned = parse({"pip": {"packages": ["requests"], "pip_version": "==23.0"}})
    assert pinned != parse({"pip": ["requests"]})
    with pytest.raises(InvalidRuntimeEnv, match=r"pip_version 'latest' is not a version spec"):
        parse({"pip": {"packages": ["requests"], "pip_version": "latest"}})


def test_a_200kb_env_var_is_refused_with_the_limit() -> None:
    with pytest.raises(InvalidRuntimeEnv) as caught:
        parse({"env_vars": {"BIG": "x" * 200_000}})
    assert "131072" in caught.value.message
    assert "'BIG'" in caught.value.message


@pytest.mark.parametrize("field", ["pip", "uv"])
def test_a_venv_read_as_ray_reads_it_is_another_package_and_env(field: str) -> None:
    """The Ray door's venvs (Ray's semantics: they see the node's packages) never share a key
    with the gRPC door's isolated ones; the gRPC door's keys are unchanged by the option."""
    text = json.dumps({field: ["requests"], "env_vars": {"A": "1"}})
    grpc = parse_runtime_env(text, LIMITS)
    ray = parse_runtime_env(text, LIMITS, dialect=RAY)
    assert grpc.env_id != ray.env_id
    assert grpc.packages[0].key != ray.packages[0].key
    assert grpc.packages[0].key.kind == field
    assert ray.packages[0].key.kind == f"ray_{field}"  # info tells them apart by kind
    assert ray.packages[0].key.uri.startswith(f"{field}://")
    isolated, rays = grpc.packages[0].recipe, ray.packages[0].recipe
    assert isinstance(isolated, PipSpec | UvSpec)
    assert isinstance(rays, PipSpec | UvSpec)
    assert isolated.sees is None
    assert rays.sees is not None
    # an env with no venv is the same env through either door
    plain = json.dumps({"env_vars": {"A": "1"}})
    assert parse_runtime_env(plain, LIMITS).env_id == parse(json.loads(plain))
    assert parse_runtime_env(plain, LIMITS, dialect=RAY).env_id == parse(json.loads(plain))


@pytest.mark.parametrize("field", ["pip", "uv"])
def test_a_ray_venv_of_another_node_python_is_another_package(field: str) -> None:
    """A Ray-semantics venv adds the site folders of the node's python: two agents on one shared
    root with different node pythons (of one version) never share such a venv."""
    text = json.dumps({field: ["requests"]})
    one = parse_runtime_env(text, LIMITS, dialect=RAY, node_python="/opt/a/bin/python3")
    two = parse_runtime_env(text, LIMITS, dialect=RAY, node_python="/opt/b/bin/python3")
    again = parse_runtime_env(text, LIMITS, dialect=RAY, node_python="/opt/a/bin/python3")
    assert one.packages[0].key != two.packages[0].key
    assert one.packages[0].key == again.packages[0].key
    # the gRPC door's isolated venv does not depend on it
    grpc = parse_runtime_env(text, LIMITS, node_python="/opt/b/bin/python3")
    assert grpc.packages[0].key == parse_runtime_env(text, LIMITS).packages[0].key


def test_the_grpc_doors_pip_key_is_pinned() -> None:
    """The isolated venv's digest is what it was before Ray's semantics came (a root's existing
    venvs keep their keys)."""
    pip = PipSpec(packages=("requests",), options=(), python="3.11", platform="linux-x86_64")
    uv = UvSpec(
        packages=("requests",), options=(), uv_version="", uv_check=False, python="3.11",
        platform="linux-x86_64",
    )  # fmt: skip
    assert pip.digest == "d4a1cdb3dd33e4170240f43d5f4ff9b9"
    assert uv.digest == "4865fcfc343d46ce3fdec766f96e8dcc"
