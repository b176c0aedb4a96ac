"""uv's option table (``agent.core.uv_options``) is the agent's uv's own: every option ``uv pip
install --help`` prints (each spelling, and whether it takes a value), every hidden spelling in
the table taken by that uv as the table says, and the option lines uv reads from a requirements
file read there (those it ignores, ignored; others, refused by uv's parser). A uv upgrade that
adds, drops or changes an option fails here, naming it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from agent.core.uv_options import (
    ALLOWED,
    DROPPED,
    IGNORED_LINES,
    REFUSED,
    REQUIREMENTS_FILE,
    SPLITS,
    UV_HIDDEN,
    UV_PIP_INSTALL,
)
from agent.install.venvs.wheel_cache import find_uv

UV = find_uv()
pytestmark = pytest.mark.skipif(UV is None, reason="no uv beside the python nor on PATH")

# an option's line in the help: "  -r, --requirements <REQUIREMENTS>", "  -q, --quiet...",
# "      --no-deps", "  -p, --python <PYTHON>      The Python..." (its text on the same line)
_OPTION = re.compile(r"^ {2,6}(?:(-[A-Za-z]), )?(--[a-z0-9-]+)(?:\.\.\.)?( <[^>]+>)?(?:\s|$)")


def uv(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert UV is not None
    return subprocess.run(
        [UV, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
        env={**os.environ, "UV_NO_CONFIG": "1"},
    )  # fmt: skip


def helps_table() -> dict[str, bool]:
    done = uv("pip", "install", "--help")
    assert done.returncode == 0, done.stderr
    table: dict[str, bool] = {}
    for line in done.stdout.splitlines():
        if found := _OPTION.match(line):
            short, long, value = found.groups()
            table |= {spelling: value is not None for spelling in (long, short) if spelling}
    return table


def test_the_table_is_the_agents_uvs_own_help() -> None:
    """Each spelling the installed uv's help prints, with whether it takes a value."""
    helps = helps_table()
    assert sorted(helps.keys() - UV_PIP_INSTALL.keys()) == [], "uv's options the table lacks"
    assert sorted(UV_PIP_INSTALL.keys() - helps.keys()) == [], "the table's options uv lacks"
    assert {k: v for k, v in helps.items() if v != UV_PIP_INSTALL[k]} == {}, "values differ"


@pytest.mark.parametrize("option", sorted(UV_HIDDEN))
def test_each_hidden_spelling_is_taken_by_the_agents_uv_as_the_table_says(option: str) -> None:
    """uv's parser reads the arguments in order: an unknown one fails before ``--help`` is read;
    one that takes a value takes nothing that starts with a '-', so it lacks one (uv names it by
    the spelling it is an alias of: ``--trusted-host`` is ``--allow-insecure-host``)."""
    assert option not in UV_PIP_INSTALL, "a hidden spelling is not in the help"
    done = uv("pip", "install", option, "--help")
    if UV_HIDDEN[option]:
        assert "error: a value is required for '--" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_allowed_is_the_table_but_the_refused_each_saying_why() -> None:
    table = UV_PIP_INSTALL | UV_HIDDEN
    assert {k: v for k, v in table.items() if k not in REFUSED} == ALLOWED
    assert REFUSED.keys() <= table.keys(), "a refusal of what uv does not take"
    assert all(reason for reason in REFUSED.values())
    assert set(DROPPED) <= ALLOWED.keys()
    assert SPLITS.keys() <= ALLOWED.keys()


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("uv-lines")
    done = uv("venv", "--quiet", str(folder / "venv"))
    assert done.returncode == 0, done.stderr
    return str(folder / "venv" / "bin" / "python")


def read_line(line: str, venv_python: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """uv reading a requirements file of that one line (a dry run, offline)."""
    (folder / "r.txt").write_text(line + "\n")
    return uv("pip", "install", "--dry-run", "--offline", "--python", venv_python, "-r", "r.txt",
              cwd=folder)  # fmt: skip


_VALUE = {"--no-binary": ":all:", "--only-binary": ":all:", "--find-links": "/tmp", "-f": "/tmp"}


@pytest.mark.parametrize("flag", sorted(REQUIREMENTS_FILE))
def test_each_line_the_table_takes_is_one_uv_reads_from_a_requirements_file(
    flag: str, venv_python: str, tmp_path: Path
) -> None:
    value = _VALUE.get(flag, "http://127.0.0.1:9/simple")
    done = read_line(f"{flag} {value}" if REQUIREMENTS_FILE[flag] else flag, venv_python, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Ignoring" not in done.stderr, done.stderr


@pytest.mark.parametrize("flag", IGNORED_LINES)
def test_each_line_the_table_leaves_out_is_one_uv_reads_and_ignores(
    flag: str, venv_python: str, tmp_path: Path
) -> None:
    done = read_line(f"{flag} x" if flag in ("--trusted-host", "--use-feature") else flag,
                     venv_python, tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Ignoring unsupported option in `r.txt`: `{flag}`" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "line",
    [
        "--upgrade",
        "--index http://127.0.0.1:9/s",
        "--no-deps",
        "--index-strategy unsafe-best-match",
        "--default-index x",
    ],
)
def test_other_options_are_no_line_of_uvs_requirements_file(
    line: str, venv_python: str, tmp_path: Path
) -> None:  # fmt: skip
    assert line.split()[0] not in REQUIREMENTS_FILE
    done = read_line(line, venv_python, tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Unexpected '-'" in done.stderr, done.stderr
