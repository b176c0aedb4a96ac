"""Recovery's kill of the installers a dead agent left running (``kill_orphaned_installers``),
reading staging folders an installer (a package's setup.py) could write: real files, FIFOs,
links and real process groups. A blocking or unbounded read would stall the reaper inside the
root's write transaction, so each hostile case runs in a child process with a deadline and a
memory cap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.install.venvs.build import PGID_FILE, kill_orphaned_installers

CHILD_S = 30  # the child reads a few bytes: one still running by then is blocked
_CHILD = textwrap.dedent(
    """
    import logging, resource, sys
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # an unbounded read dies
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from agent.install.venvs.build import kill_orphaned_installers
    print(kill_orphaned_installers(Path(sys.argv[1])))
    """
)


def kill_in_child(tmp: Path) -> tuple[str, str]:
    """kill_orphaned_installers(tmp) in a child, bounded in time and memory: (stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp)],
        capture_output=True, text=True, timeout=CHILD_S, check=False,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A staging folder and a process group of its own whose command line names that folder
    (what an installer a dead agent left looks like)."""
    staging = tmp_path / "tmp" / "s1"
    staging.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(600)", str(staging)],
        start_new_session=True,
    )
    try:
        yield staging, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=CHILD_S)


def test_a_regular_pgid_file_kills_the_group_that_names_its_staging_folder(
    victim: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    staging, proc = victim
    (staging / PGID_FILE).write_text(str(proc.pid))
    assert kill_orphaned_installers(staging.parent) == 1
    assert proc.wait(timeout=CHILD_S) == -signal.SIGKILL


def test_a_pgid_file_that_is_a_fifo_is_no_pgid_and_never_waited_on(tmp_path: Path) -> None:
    staging = tmp_path / "tmp" / "s1"
    staging.mkdir(parents=True)
    os.mkfifo(staging / PGID_FILE)
    out, err = kill_in_child(staging.parent)
    assert out == "0"
    assert f"ignoring {staging / PGID_FILE}: not a regular file" in err, err


def test_a_pgid_file_linked_to_dev_zero_is_no_pgid_and_never_read(tmp_path: Path) -> None:
    staging = tmp_path / "tmp" / "s1"
    staging.mkdir(parents=True)
    os.symlink("/dev/zero", staging / PGID_FILE)
    out, err = kill_in_child(staging.parent)
    assert out == "0"
    assert f"ignoring {staging / PGID_FILE}" in err, err


def test_a_pgid_file_linked_to_a_file_with_a_live_group_kills_nothing(
    victim: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    """A link is no record the installer's agent wrote: never followed, even to a real pgid."""
    staging, proc = victim
    (staging.parent.parent / "elsewhere").write_text(str(proc.pid))
    os.symlink(staging.parent.parent / "elsewhere", staging / PGID_FILE)
    assert kill_orphaned_installers(staging.parent) == 0
    assert proc.poll() is None


@pytest.mark.parametrize("content", ["0", "1", "-5", "12abc", "9" * 40, ""])
def test_a_pgid_file_that_holds_no_group_id_kills_nothing(tmp_path: Path, content: str) -> None:
    """0 would be this process's own group; 1 init's."""
    staging = tmp_path / "tmp" / "s1"
    staging.mkdir(parents=True)
    (staging / PGID_FILE).write_text(content)
    assert kill_orphaned_installers(staging.parent) == 0
