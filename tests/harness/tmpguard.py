"""A pytest plugin: the test session gets a private temp dir, which must be empty at the end.

Every test, and every process a test starts (they inherit ``TMPDIR``), makes its temp files in a
folder of its own, so what is left there at the end was left by this suite and by nothing else
on the machine (other suites may be making ``rtenv-*`` folders in the shared temp dir at the same
time). Anything left but pytest's own ``tmp_path`` folders fails the run, naming what was left;
then the folder is removed, so a failing run leaves nothing behind either.

Under pytest-xdist (``-n``) the controller makes the folder before its workers start, and they
inherit it through ``TMPDIR``: a worker makes none of its own and checks nothing (what a worker
says at its end is never shown), so the controller, which ends after every worker has, checks
what all of them left.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_KEY = pytest.StashKey[tuple[Path, str | None]]()
_PYTEST_OWN = "pytest-of-"
# Unix socket paths (107 bytes at most) are made under it: keep it short.
_MAX_PARENT_BYTES = 40


def _parent() -> str:
    """Where the private folder goes: the temp dir in force, or /tmp if that path is long."""
    current = tempfile.gettempdir()
    return current if len(os.fsencode(current)) <= _MAX_PARENT_BYTES else "/tmp"


def _is_worker(config: pytest.Config) -> bool:
    """Whether this is a pytest-xdist worker (its controller guards the temp dir)."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_worker(config):
        return
    private = Path(tempfile.mkdtemp(prefix="rtt-", dir=_parent()))
    config.stash[_KEY] = (private, os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = str(private)


def leftovers(private: Path) -> list[str]:
    """What the session left in its temp dir, but pytest's own tmp_path folders."""
    return sorted(p.name for p in private.iterdir() if not p.name.startswith(_PYTEST_OWN))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_worker(session.config):
        return
    private, old = session.config.stash[_KEY]
    try:
        left = leftovers(private)
    except FileNotFoundError:
        left = ["(the session's temp dir itself was removed)"]
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the tests left {len(left)} entries in the temp dir: {', '.join(left[:20])}"
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(private, ignore_errors=True)
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None
