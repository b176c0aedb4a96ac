"""The session's temp-dir guard (tests/harness/tmpguard.py), run on small suites in a pytest
subprocess: a suite that leaves a folder in the temp dir fails, naming it; a clean one passes;
and neither leaves anything behind, its private temp dir included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEAKY = """\
import tempfile

def test_leaves_a_folder() -> None:
    tempfile.mkdtemp(prefix="rtenv-")
"""
CLEAN = """\
import shutil, tempfile

def test_removes_its_folder(tmp_path) -> None:
    shutil.rmtree(tempfile.mkdtemp(prefix="rtenv-"))
    (tmp_path / "kept-by-pytest").write_text("pytest's own tmp_path is not a leak")
"""


def _run_suite(base: Path, source: str) -> subprocess.CompletedProcess[str]:
    suite = base / "suite"
    suite.mkdir()
    (suite / "test_it.py").write_text(source)
    (suite / "pytest.ini").write_text("[pytest]\n")
    temp = base / "temp"
    temp.mkdir()
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.harness.tmpguard",
         "-p", "no:cacheprovider", "-c", str(suite / "pytest.ini"), str(suite)],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(temp), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_suite_that_leaves_a_folder_in_the_temp_dir_fails_naming_it(base: Path) -> None:
    done = _run_suite(base, LEAKY)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "the tests left 1 entries in the temp dir: rtenv-" in done.stdout
    assert list((base / "temp").iterdir()) == [], "the guard's own folder was left"


def test_a_suite_that_cleans_up_passes_and_leaves_nothing(base: Path) -> None:
    done = _run_suite(base, CLEAN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left" not in done.stdout
    assert list((base / "temp").iterdir()) == []
