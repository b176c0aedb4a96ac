"""``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/<file>`` in a Ray env's pip or uv packages
(``agent.core.wd_requirements``): parsed at the Ray door into an env with no venv of its own,
refused elsewhere and in any other form; its files read from the working dir only, bounded,
nested ``-r`` files read in place; the venv they make is the field's as if written out."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from agent.core.dialect import RAY
from agent.core.errors import InvalidRuntimeEnv
from agent.core.kinds import NodeSite
from agent.core.packages import venv_package
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from agent.core.uris import UriKind
from agent.core.wd_requirements import (
    MAX_FILE_BYTES,
    MAX_FILES,
    WdRequirements,
    split,
    venv_spec,
)
from agent.install.venvs.wd_read import read_field

LIMITS = EnvLimits()
LINE = "-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt"
WD = "gcs://_ray_pkg_0123456789abcdef.zip"


def ray_env(obj: Mapping[str, object]) -> RuntimeEnv:
    return parse_runtime_env(json.dumps(obj), LIMITS, dialect=RAY, node_python="/py")


def wd_of(packages: list[object], tool: str = "pip") -> WdRequirements:
    found = split(tool, {"packages": packages}, RAY.venv_kind(tool), NodeSite("/py"))
    assert found is not None
    return found


@pytest.mark.parametrize(
    "line",
    [
        LINE,
        "-r $RAY_RUNTIME_ENV_CREATE_WORKING_DIR/requirements.txt",
        "--requirement=${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt",
        "--requirement ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt",
        "-r${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/requirements.txt",
    ],
)
def test_each_spelling_of_the_line_names_the_working_dirs_file(line: str) -> None:
    env = ray_env({"working_dir": WD, "pip": [line]})
    assert env.wd_requirements is not None
    assert env.packages == tuple(p for p in env.packages if p.key.kind is UriKind.WORKING_DIR)


def test_the_env_names_no_venv_of_its_own_and_its_identity_keeps_the_line() -> None:
    """Two envs whose lines differ are two envs; the working dir's URI is in both."""
    one = ray_env({"working_dir": WD, "uv": {"packages": [LINE]}})
    two = ray_env({"working_dir": WD, "uv": {"packages": [LINE.replace("req", "other-req")]}})
    assert one.env_id != two.env_id
    assert [p.key.kind for p in one.packages] == [UriKind.WORKING_DIR]


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"pip": [LINE]}, "the env names no working_dir"),
        (
            {"working_dir": WD, "pip": ["${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/pkg"]},
            "outside the one form this agent takes",
        ),
        (
            {"working_dir": WD, "pip": ["-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}"]},
            "names no file under the working dir",
        ),
        (
            {"working_dir": WD, "pip": {"packages": [LINE], "pip_install_options": ["--user"]}},
            "--user",
        ),
        ({"working_dir": WD, "pip": [LINE, "not a requirement!"]}, "is not a requirement"),
    ],
)
def test_what_the_ray_door_refuses_at_parse(obj: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRuntimeEnv, match=words):
        ray_env(obj)


def test_the_grpc_door_refuses_the_line_naming_the_ray_door() -> None:
    with pytest.raises(InvalidRuntimeEnv, match="only Ray's agent sets"):
        parse_runtime_env(json.dumps({"working_dir": WD, "pip": [LINE]}), LIMITS)


def test_a_uv_run_line_and_a_requirements_file_are_refused_together() -> None:
    obj = {"working_dir": WD, "pip": [LINE], "py_executable": "uv run --no-project"}
    with pytest.raises(InvalidRuntimeEnv, match="uv run line"):
        ray_env(obj)


def test_files_are_read_in_place_with_nested_files_comments_and_other_lines(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "requirements.txt").write_text(
        "# top\nalpha==1.0  # pinned\n\n-r sub/more.txt\n-r requirements.txt\nomega\n"
    )
    (tmp_path / "sub" / "more.txt").write_text("beta>=2\n--requirement=../requirements.txt\n")
    wd = wd_of(["first", LINE, "last"])
    got = read_field(wd, tmp_path, "env e's pip field")
    assert got == {"packages": ["first", "alpha==1.0", "beta>=2", "omega", "last"]}


def test_the_venv_is_the_one_the_field_written_out_makes(tmp_path: Path) -> None:
    """Same requirements, same venv key, whichever file they came from."""
    (tmp_path / "requirements.txt").write_text("gamma_pkg\nalpha\n")
    wd = wd_of([LINE], "uv")
    spec = venv_spec(wd, read_field(wd, tmp_path, "e"), ())
    written = ray_env({"uv": ["alpha", "gamma_pkg"]})
    assert spec is not None
    package = venv_package(wd.kind, spec)
    assert package.key.kind is UriKind.RAY_UV
    assert (package.key,) == written.uri_keys


def test_a_file_of_comments_only_makes_no_venv(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("# nothing yet\n")
    wd = wd_of([LINE])
    assert venv_spec(wd, read_field(wd, tmp_path, "e"), ()) is None


def _refused(tmp_path: Path, words: str, packages: list[object] | None = None) -> None:
    wd = wd_of(packages or [LINE])
    with pytest.raises(InvalidRuntimeEnv, match=words):
        read_field(wd, tmp_path / "wd", "env e's pip field")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    _refused(tmp_path, "the working dir has no requirements file 'requirements.txt'")


def test_a_link_out_of_the_working_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "secret.txt").write_text("x\n")
    (tmp_path / "wd" / "requirements.txt").symlink_to(tmp_path / "secret.txt")
    _refused(tmp_path, "is outside the working dir")


def test_a_nested_path_out_of_the_working_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "other.txt").write_text("x\n")
    (tmp_path / "wd" / "requirements.txt").write_text("-r ../other.txt\n")
    _refused(tmp_path, "is outside the working dir")


def test_a_fifo_is_not_opened_as_a_file(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    os.mkfifo(tmp_path / "wd" / "requirements.txt")
    _refused(tmp_path, "is not a regular file")


def test_a_file_over_the_limit_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "requirements.txt").write_bytes(b"a\n" * (MAX_FILE_BYTES // 2 + 1))
    _refused(tmp_path, f"is over {MAX_FILE_BYTES} bytes")


def test_more_files_than_the_limit_are_refused(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    for n in range(MAX_FILES + 1):
        (wd / f"r{n}.txt").write_text(f"-r r{n + 1}.txt\npkg{n}\n")
    (wd / "requirements.txt").write_text("-r r0.txt\n")
    _refused(tmp_path, f"the limit is {MAX_FILES}")


def test_a_file_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "requirements.txt").write_bytes(b"\xff\xfe\n")
    _refused(tmp_path, "is not UTF-8")
