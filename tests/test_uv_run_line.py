"""The ``uv run`` line as a py_executable (pure): which lines the agent builds itself, what of
them decides the env, and why any other is left to uv."""

from __future__ import annotations

import json

import pytest

from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uv_run import Passthrough, UvRun, is_uv_run, parse_uv_run, with_program


def parsed(line: str) -> UvRun:
    run = parse_uv_run(line)
    assert isinstance(run, UvRun), run
    return run


def test_ray_hooks_form_is_built_with_its_python() -> None:
    """``<uv path> run --python X.Y.Z python``: Ray's hook's line."""
    run = parsed("/home/u/.local/bin/uv run --python 3.11.7 python")
    assert run == UvRun(python="3.11.7", lock="", sync_flags=(), with_packages=())


def test_ray_2_51s_form_naming_no_program_is_built_as_with_python() -> None:
    """``<uv path> run --offline``: Ray 2.51's hook's line (no ``--python``, no ``python``; the
    worker's script follows) is the same env as the line with ``python``."""
    run = parsed("/home/u/.local/bin/uv run --offline --frozen")
    assert run == parsed("/home/u/.local/bin/uv run --offline --frozen python")
    assert run == UvRun(python=None, lock="frozen", sync_flags=(), with_packages=())


@pytest.mark.parametrize(
    ("line", "python"),
    [("uv run --offline", "3.12"), ("uv run python", "3.12"), ("uv run -p 3.10 python", "3.10")],
)
def test_a_line_naming_no_python_takes_the_envs_uv_python(line: str, python: str) -> None:
    """``uv run`` in the worker reads the env's ``UV_PYTHON`` where the line names no
    ``--python`` (Ray 2.60's hook writes it into the line; 2.51's does not)."""
    obj = {"working_dir": "https://h/wd.zip", "py_executable": line,
           "env_vars": {"UV_PYTHON": "3.12"}}  # fmt: skip
    run = parse_runtime_env(json.dumps(obj), EnvLimits()).uv_run
    assert isinstance(run, UvRun)
    assert run.python == python


@pytest.mark.parametrize(
    ("line", "given"),
    [
        ("/u/uv run --offline", "/u/uv run --offline python"),
        ("uv run --extra gpu -p 3.11", "uv run --extra gpu -p 3.11 python"),
        ("uv run", "uv run python"),
        ("uv run --offline python", "uv run --offline python"),
        ("uv run --frozen my-wrapper", "uv run --frozen my-wrapper"),
        ("uv run --script", "uv run --script"),  # a flag of unknown arity: as it is
        ("python -X dev", "python -X dev"),
    ],
)
def test_a_line_naming_no_program_is_given_python_for_the_worker(line: str, given: str) -> None:
    """Left to uv, ``uv run <flags> <script.py>`` takes the project enclosing the script (where
    Ray is installed), not the working dir's: the worker is given ``python`` first."""
    assert with_program(line) == given


@pytest.mark.parametrize(
    ("line", "lock"),
    [
        ("uv run --frozen python", "frozen"),
        ("uv run --no-sync python3", "frozen"),  # uv: --no-sync implies --frozen
        ("uv run --locked python3.11", "locked"),
        ("uv run --locked --frozen python", "frozen"),
    ],
)
def test_the_lock_flags_say_how_the_lock_is_read(line: str, lock: str) -> None:
    assert parsed(line).lock == lock


def test_flags_that_change_what_is_installed_are_kept_in_one_order() -> None:
    """Two spellings of the same extras and groups are one identity; --with is kept."""
    a = parsed("uv run --extra gpu --group dev --no-dev --with rich,tqdm -p 3.12 python")
    b = parsed(
        "uv run --no-dev --group=dev --extra=gpu --with rich --with tqdm --python 3.12 python"
    )
    assert a.identity() == b.identity()
    assert a.with_packages == ("rich", "tqdm")
    assert a.python == "3.12"


def test_flags_of_how_uv_runs_do_not_change_the_identity() -> None:
    plain = parsed("uv run python")
    noisy = parsed("uv run --isolated -q --no-cache --offline --color never --exact python")
    assert plain.identity() == noisy.identity()


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("uv run --script python", "--script"),
        ("uv run --package member python", "--package"),
        ("uv run --with-requirements r.txt python", "--with-requirements"),
        ("uv run --python 3.11 my-wrapper", "not python"),
        ("uv run python -X dev", "not python"),
        ("uv run --python", "no value"),
    ],
)
def test_other_lines_are_left_to_uv_saying_why(line: str, said: str) -> None:
    run = parse_uv_run(line)
    assert isinstance(run, Passthrough)
    assert said in run.reason


@pytest.mark.parametrize(
    ("line", "is_it"),
    [
        ("uv run python", True),
        ("/opt/uv/bin/uv run --python 3.11 python", True),
        ("python -X faulthandler", False),
        ("uvx run python", False),
        ("uv pip install x", False),
        ("uv 'unclosed", False),
        (None, False),
    ],
)
def test_a_uv_run_line_is_told_by_its_first_two_words(line: str | None, is_it: bool) -> None:
    assert is_uv_run(line) is is_it


def test_rays_unquoted_uv_path_with_a_space_is_still_a_uv_run_line() -> None:
    """Ray's hook joins the driver's command unquoted: a uv at '/home/me/My Tools/uv' gives a
    line no shell splits right; the agent takes it up to its '/uv run' (Ray's agent could not
    run it at all)."""
    line = "/home/me/My Tools/uv run --python 3.11.7 python"
    assert is_uv_run(line)
    assert parsed(line).python == "3.11.7"
    assert not is_uv_run("/home/me/My Tools/uv runner python")
    assert not is_uv_run("python -c '/a b/uv run'")
