"""tests/harness/gc_pause.py, on a pytest run of its own: a failing test that leaves a future whose
exception nobody retrieved, for the cyclic collector to free while pytest parses the test's
file to report the failure, is reported as one failure, and the run ends with its summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One collection frees one Relay and its future (logged with its traceback: 3.11 parses each
# line of it), and leaves the next Relay: one is pending at every collection, the report's
# parse of this file among them (PADDING makes that parse allocate enough to start some).
CHILD = """
import asyncio

LOOP = asyncio.new_event_loop()
LOOP.close()


def raised() -> BaseException:
    try:
        raise RuntimeError("never retrieved")
    except RuntimeError as exc:
        return exc


class Relay:
    left = 200

    def __init__(self) -> None:
        self.me = self
        self.future = LOOP.create_future()
        self.future.set_exception(raised())

    def __del__(self) -> None:
        if Relay.left > 0:
            Relay.left -= 1
            Relay()


def test_fails() -> None:
    Relay()
    assert 1 + 1 == 3


PADDING = [
@
]
""".replace("@", "    0, 0, 0, 0, 0, 0, 0, 0, 0, 0,\n" * 500)


def _pytest(where: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """pytest on CHILD in ``where`` (its own ini: nothing of this repo's configuration)."""
    (where / "pytest.ini").write_text("[pytest]\n")
    (where / "test_child.py").write_text(CHILD)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:asyncio",
         *options, "test_child.py"],
        cwd=where, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def test_a_failure_whose_report_parse_frees_a_logged_future_is_reported(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "-p", "tests.harness.gc_pause")
    out = done.stdout + done.stderr
    assert "INTERNALERROR" not in out, out
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "1 failed" in done.stdout.splitlines()[-1], out
    assert "assert (1 + 1) == 3" in done.stdout, out


def _ast_depth_shared() -> bool:
    """Whether this CPython's AST constructor keeps its depth in shared state (gh-106905)."""
    version = sys.version_info[:3]
    return sys.implementation.name == "cpython" and (
        (3, 11) <= version < (3, 11, 8) or (3, 12) <= version < (3, 12, 2)
    )


@pytest.mark.skipif(not _ast_depth_shared(), reason="this python's AST constructor is fixed")
def test_without_the_plugin_that_failure_stops_pytest_on_this_python(tmp_path: Path) -> None:
    """The control: the child is of the shape that crashes pytest here."""
    done = _pytest(tmp_path)
    out = done.stdout + done.stderr
    assert "SystemError: AST constructor recursion depth mismatch" in out, out
    assert done.returncode == pytest.ExitCode.INTERNAL_ERROR, out
