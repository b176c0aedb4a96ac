""".ci/run, on a small git repository of its own whose README's second code block is the "test
command": it runs the committed command in a fresh clone under a path with a space and
hyphens, with a temp dir of its own that must be left empty, and removes everything
afterwards. The repo's own path has a space too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = "```"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=ci-test", "-c", "user.email=ci-test@localhost", *args],
        cwd=repo, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def _repo(base: Path, command: str, second_pass: str | None = None) -> Path:
    """A git repo holding .ci/run and a README whose second code block is ``command``; with
    ``second_pass``, a .ci/uvloop-pass of that body too."""
    if shutil.which("git") is None:
        pytest.skip("git is not on PATH")
    repo = base / "the repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(REPO / ".ci" / "run", repo / ".ci" / "run")
    if second_pass is not None:
        (repo / ".ci" / "uvloop-pass").write_text(f"#!/usr/bin/env bash\n{second_pass}\n")
        (repo / ".ci" / "uvloop-pass").chmod(0o755)
    (repo / "README.md").write_text(
        f"# t\n\n{FENCE}\necho the demo\n{FENCE}\n\ntests:\n\n{FENCE}\n{command}\n{FENCE}\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "t")
    return repo


def _ci(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / ".ci" / "run")], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"},
    )  # fmt: skip


def _where(out: str, key: str) -> Path:
    match = re.search(rf"^{key}=(.*)$", out, re.MULTILINE)
    assert match, out
    return Path(match[1])


def test_the_committed_command_runs_in_a_fresh_clone_under_a_path_with_a_space(base: Path) -> None:
    repo = _repo(base, 'echo "cwd=$PWD"; echo "tmp=$TMPDIR"; echo "head=$(git rev-parse HEAD)"')
    readme = repo / "README.md"
    readme.write_text(readme.read_text().replace("echo ", "echo uncommitted "))  # not used
    done = _ci(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    cwd, tmp = _where(done.stdout, "cwd"), _where(done.stdout, "tmp")
    assert " " in cwd.parent.name, cwd
    assert "-" in cwd.parent.name, cwd
    assert cwd != repo
    assert "uncommitted" not in done.stdout
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert _where(done.stdout, "head") == Path(head)
    assert not cwd.exists(), "the clone was left behind"
    assert not tmp.exists(), "the run's temp dir was left behind"


def test_a_command_that_leaves_files_in_its_temp_dir_fails_naming_them(base: Path) -> None:
    done = _ci(_repo(base, 'echo "cwd=$PWD"; touch "$TMPDIR/rtenv-leaked"'))
    assert done.returncode == 1
    assert "left files in its temp dir" in done.stderr
    assert "rtenv-leaked" in done.stderr
    assert not _where(done.stdout, "cwd").exists()


def test_a_failing_command_fails_the_run(base: Path) -> None:
    done = _ci(_repo(base, 'echo "cwd=$PWD"; exit 3'))
    assert done.returncode == 3
    assert not _where(done.stdout, "cwd").exists()


def test_the_second_pass_runs_in_the_same_clone_after_the_command_and_its_failures_count(
    base: Path,
) -> None:
    """.ci/uvloop-pass (the uvloop pass) runs after the README's command, in the same clone and
    temp dir; its failure fails the run, and so do files it leaves in the temp dir."""
    command = 'echo "cwd=$PWD"; touch first-pass-was-here'
    done = _ci(_repo(base / "ok", command, 'echo "second=$PWD"; test -e first-pass-was-here'))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _where(done.stdout, "second") == _where(done.stdout, "cwd")
    assert done.stdout.index("cwd=") < done.stdout.index("second=")
    failed = _ci(_repo(base / "fails", command, "exit 4"))
    assert failed.returncode == 4, failed.stdout + failed.stderr
    leaks = _ci(_repo(base / "leaks", command, 'touch "$TMPDIR/pass-two-leaked"'))
    assert leaks.returncode == 1
    assert "the uvloop pass left files in its temp dir" in leaks.stderr
    assert "pass-two-leaked" in leaks.stderr
