"""The test tiers (tests/harness/tiers.py): every test file has one; a run whose tests have no tier
or two fails at collection; ``-m TIER`` runs one tier; the line that sums each tier's tests and
seconds comes just above pytest's summary line, which stays the last one (CI's output ends so).
The plugin's runs are small suites in a pytest subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.harness.tiers import FILES, TIERS, tiers_line

REPO = Path(__file__).resolve().parents[1]
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n" + "".join(
    f"    {tier}: the {tier} tier\n" for tier in TIERS
)
MARKED = """\
import pytest

pytestmark = pytest.mark.unit


def test_one() -> None:
    pass


def test_two() -> None:
    pass


@pytest.mark.skip(reason="a skipped test is counted in its tier too")
def test_three() -> None:
    pass
"""
SOCKETS = """\
import pytest


@pytest.mark.sockets
def test_over_a_socket() -> None:
    pass
"""
UNMARKED = """\
import pytest


def test_nowhere() -> None:
    pass


@pytest.mark.unit
@pytest.mark.process
def test_in_two() -> None:
    pass
"""


def _run(base: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    suite = base / "suite"
    suite.mkdir()
    for name, source in files.items():
        (suite / name).write_text(source)
    (suite / "pytest.ini").write_text(INI)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.harness.tiers",
         "-p", "no:cacheprovider", "-c", str(suite / "pytest.ini"), *args, str(suite)],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_every_test_file_has_a_tier_and_every_file_named_exists() -> None:
    files = {path.name for path in (REPO / "tests").glob("test_*.py")}
    assert set(FILES) == files
    assert set(FILES.values()) == set(TIERS)


def test_the_tiers_line_is_the_one_just_above_pytests_summary_line(base: Path) -> None:
    done = _run(base, {"test_marked.py": MARKED, "test_sockets.py": SOCKETS})
    assert done.returncode == 0, done.stdout + done.stderr
    *_, tiers, summary = done.stdout.splitlines()
    assert re.fullmatch(
        r"tiers: unit 3 tests \d+\.\d s; sockets 1 tests \d+\.\d s; "
        r"process 0 tests 0\.0 s; ray 0 tests 0\.0 s",
        tiers,
    ), done.stdout
    assert re.fullmatch(r"3 passed, 1 skipped in .*", summary), done.stdout


def test_minus_m_runs_one_tier(base: Path) -> None:
    done = _run(base, {"test_marked.py": MARKED, "test_sockets.py": SOCKETS}, "-m", "sockets")
    assert done.returncode == 0, done.stdout + done.stderr
    *_, tiers, summary = done.stdout.splitlines()
    assert tiers.startswith("tiers: unit 0 tests 0.0 s; sockets 1 tests "), done.stdout
    assert re.fullmatch(r"1 passed, 3 deselected in .*", summary), done.stdout


def test_a_test_with_no_tier_or_two_fails_the_run_naming_each(base: Path) -> None:
    done = _run(base, {"test_marked.py": MARKED, "test_unmarked.py": UNMARKED})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "every test needs exactly one tier mark" in done.stderr, done.stderr
    assert "2 have not" in done.stderr, done.stderr
    assert "test_unmarked.py: no tier (give the file a line in FILES)" in done.stderr, done.stderr
    assert "test_unmarked.py::test_in_two: process and unit" in done.stderr, done.stderr
    assert "passed" not in done.stdout


def test_the_tiers_line_says_each_tier_in_order_with_thousands_separated() -> None:
    assert tiers_line({"process": (3, 40.04), "unit": (1234, 12.34)}) == (
        "tiers: unit 1,234 tests 12.3 s; sockets 0 tests 0.0 s; process 3 tests 40.0 s; "
        "ray 0 tests 0.0 s"
    )
