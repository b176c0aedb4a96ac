"""The doors' dialects are one table (``agent.core.dialect``): each column is in the module's
side-by-side table, and each is read where it applies: switching that one column from the gRPC
door's value to the Ray door's changes what a probe env parses to, or how it is answered."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import agent.core.dialect as dialect_module
from agent.app.config import Settings
from agent.app.contexts import EnvContexts
from agent.core.dialect import GRPC, RAY, Dialect
from agent.core.errors import InvalidRuntimeEnv
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uris import UriKey

_WD = "gcs://_ray_pkg_0123456789abcdef.zip"


def _parsed(obj: object, dialect: Dialect) -> str:
    """What the probe env parses to under ``dialect``: its packages' keys, or the error."""
    try:
        env = parse_runtime_env(
            json.dumps(obj), EnvLimits(), dialect=dialect, plugin_fields=frozenset({"MyPlugin"})
        )
    except InvalidRuntimeEnv as exc:
        return f"refused: {exc}"
    return " ".join(str(key) for key in env.uri_keys)


def _answered(dialect: Dialect) -> str:
    """How an env of the dialect is answered: in the gRPC door's format, or a bug."""
    env = parse_runtime_env("{}", EnvLimits(), dialect=dialect)
    contexts = EnvContexts(Settings(root=Path("/r")), lambda key: Path("/r") / str(key), {})
    try:
        return repr(contexts.worker(env))
    except AssertionError as exc:
        return f"bug: {exc}"


_PROBES: dict[str, Callable[[Dialect], str]] = {
    "unknown_fields": lambda d: _parsed({"not_a_field": 1}, d),
    "plugin_fields": lambda d: _parsed({"MyPlugin": {"a": 1}}, d),
    "pip_kind": lambda d: _parsed({"pip": ["requests"]}, d),
    "uv_kind": lambda d: _parsed({"uv": ["requests"]}, d),
    "py_modules_zip": lambda d: _parsed({"py_modules": ["https://h.example/m.zip"]}, d),
    "wd_requirements": lambda d: _parsed(
        {"working_dir": _WD, "pip": ["-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/r.txt"]}, d
    ),
    "context": _answered,
}
_COLUMNS = [f.name for f in dataclasses.fields(Dialect) if f.name != "name"]


def test_every_column_has_a_probe_and_a_line_in_the_side_by_side_table() -> None:
    assert sorted(_PROBES) == sorted(_COLUMNS)
    table = dialect_module.__doc__ or ""
    for column in _COLUMNS:
        assert f"``{column}``" in table, column


@pytest.mark.parametrize("column", _COLUMNS)
def test_switching_one_column_to_rays_changes_what_its_probe_sees(column: str) -> None:
    switched = dataclasses.replace(GRPC, **{column: getattr(RAY, column)})
    probe = _PROBES[column]
    assert probe(GRPC) != probe(switched)


def test_the_dialects_keep_the_same_env_apart_and_read_the_same_text_alike_without_venvs() -> None:
    """An env with nothing a dialect reads otherwise is one env through either door."""
    plain = json.dumps({"env_vars": {"A": "1"}, "working_dir": _WD})
    grpc = parse_runtime_env(plain, EnvLimits())
    ray = parse_runtime_env(plain, EnvLimits(), dialect=RAY)
    assert grpc.env_id == ray.env_id
    assert (grpc.dialect, ray.dialect) == (GRPC, RAY)
    assert UriKey in {type(k) for k in grpc.uri_keys}
