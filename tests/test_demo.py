"""The demo, as CI runs it: a small workload, its exit code and its summary checked line by line."""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raylet_sim.demo import run_demo
from raylet_sim.sidecar import MAX_UNIX_PATH_BYTES
from tests.harness.command_line import assert_refused_in_one_line
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]


def field(pattern: str, text: str) -> tuple[int, ...]:
    """The integers a summary line's pattern captures; fail naming the line if it is absent."""
    match = re.search(pattern, text, re.MULTILINE)
    assert match is not None, f"no line matching {pattern!r} in:\n{text}"
    return tuple(int(g) for g in match.groups())


def check_summary(text: str, *, tasks: int, envs: int, packages: int) -> None:
    """Every line of the summary says the run was clean, and the numbers agree."""
    (done, failed) = field(r"^tasks\s+(\d+) done, (\d+) failed", text)
    assert (done, failed) == (tasks, 0)
    started, ran, exited, reused = field(
        r"^workers\s+(\d+) started \((\d+) ran tasks\), (\d+) exited; "
        r"idle workers reused for (-?\d+) tasks",
        text,
    )
    assert 1 <= ran <= started == exited
    assert started + reused == tasks
    distinct, created, live, deleted = field(
        r"^envs\s+(\d+) distinct, (\d+) create calls, (\d+) live before the drain, "
        r"(\d+) delete calls",
        text,
    )
    assert 1 <= distinct <= envs
    assert distinct <= created, "each env the tasks used was created at least once"
    assert created == deleted, "every env created was deleted"
    assert live <= distinct
    gets, fetched = field(r"^downloads\s+(\d+) GETs for (\d+) packages: each downloaded once", text)
    assert gets == fetched <= packages
    (installs,) = field(r"^cache\s+\d+ hits, (\d+) installs, 0 evictions", text)
    assert installs == fetched
    (latencies,) = field(r"^create\s+p50 \d+ ms, p99 \d+ ms over (\d+) creates", text)
    assert latencies == created
    field(r"^references\s+all 0 \((0) envs left at the agent, (0) slots in the pool\)", text)
    (cached,) = field(r"^files\s+nothing stray \((\d+) packages cached", text)
    assert cached == fetched


def run_with_private_tmp(extra: list[str], base: Path) -> subprocess.CompletedProcess[str]:
    """The demo command with TMPDIR in ``base/tmp``: what it leaves in the temp dir shows."""
    (base / "tmp").mkdir()
    args = [
        sys.executable, "-m", "raylet_sim", "demo", "--tasks", "60", "--envs", "8",
        "--concurrency", "4", "--package-kib", "16", "--idle-timeout", "30", *extra,
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(base / "tmp")}
    return subprocess.run(
        args, capture_output=True, text=True, timeout=90, cwd=REPO, env=env, check=False
    )


def raylet_sim(*args: str) -> subprocess.CompletedProcess[str]:
    """``raylet-sim ARGS`` (as ``python -m raylet_sim``), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "raylet_sim", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def test_the_demo_command_runs_a_small_workload_cleanly_and_its_summary_adds_up() -> None:
    base = short_tempdir()
    try:
        proc = run_with_private_tmp([], base)
        assert list((base / "tmp").iterdir()) == [], "the demo left files in the temp dir"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "node up: agent pid" in proc.stdout
    assert "60/60 tasks" in proc.stdout  # the progress reached the end
    # 8 envs over 2 working dirs and 3 py_modules (samples.build_samples)
    check_summary(proc.stdout, tasks=60, envs=8, packages=5)


async def test_run_demo_in_process_returns_0_and_keeps_its_workdir_when_asked() -> None:
    base = short_tempdir()
    args = argparse.Namespace(
        tasks=24, envs=6, concurrency=3, workdir=str(base / "work"), keep=True, seed=3,
        idle_timeout=30.0, package_kib=4,
    )  # fmt: skip
    out = io.StringIO()
    try:
        code = await run_demo(args, out)
        text = out.getvalue()
        assert code == 0, text
        check_summary(text, tasks=24, envs=6, packages=5)
        assert f"kept {base / 'work'}" in text
        assert (base / "work" / "agent-root" / "uris").is_dir()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_demo_whose_socket_needed_the_short_fallback_folder_removes_that_folder() -> None:
    """Issue 12: a workdir too deep for an AF_UNIX path puts the agent's socket in a short
    rtenv-* folder of the temp dir; the demo left that folder behind, empty."""
    base = short_tempdir()
    workdir = base / ("d" * 90) / "work"
    assert len(os.fsencode(str(workdir / "agent-root" / "agent.sock"))) > MAX_UNIX_PATH_BYTES
    workdir.parent.mkdir()  # the demo makes its workdir, not the workdir's parents
    try:
        proc = run_with_private_tmp(["--workdir", str(workdir)], base)
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        assert "using" in proc.stderr, "the short fallback socket was not used"
        assert list((base / "tmp").iterdir()) == [], "the demo left files in the temp dir"
        assert (workdir / "agent-root").is_dir(), "a --workdir given is the user's: kept"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workdir", "FILE"], "--workdir '.*FILE' cannot be a folder: File exists"),
        (["--workdir", "FILE/sub"], "--workdir '.*FILE/sub' cannot be a folder: Not a directory"),
        (["--tasks", "0"], "--tasks must be from 1 to 1000000, got 0$"),
        (["--tasks", "1000001"], "--tasks must be from 1 to 1000000, got 1000001$"),
        (["--envs", "100001"], "--envs must be from 1 to 100000, got 100001$"),
        (["--concurrency", "65"], "--concurrency must be from 1 to 64, got 65$"),
        (["--seed", "-1"], "--seed must be from 0 to 4294967295, got -1$"),
        (["--seed", "9" * 400], "--seed must be from 0 to 4294967295, got 9{30}... .400 digits.$"),
        (
            ["--idle-timeout", "0"],
            "--idle-timeout must be a number above 0 and at most 3600, got 0",
        ),
        (["--idle-timeout", "3601"], "--idle-timeout must be a number above 0 and at most 3600"),
        (["--idle-timeout", "nan"], "--idle-timeout must be a number above 0 and at most 3600"),
        (["--idle-timeout", "1e300"], "--idle-timeout must be a number above 0 and at most 3600"),
        (["--package-kib", "-1"], "--package-kib must be from 0 to 65536, got -1$"),
        (["--package-kib", "999999999"], "--package-kib must be from 0 to 65536, got 999999999$"),
        (["--bogus"], r"unrecognized arguments: --bogus \(see raylet-sim --help\)$"),
    ],
)
def test_a_command_line_mistake_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    """Issue 12: --workdir naming a file gave a traceback. Issue 37: every number is bounded
    (--package-kib 999999999 ended in an OverflowError traceback), and the message names the
    bounds."""
    assert_refused_in_one_line(
        [sys.executable, "-m", "raylet_sim", "demo"], args, f"raylet-sim: {message}"
    )


def test_a_workdir_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_made() -> None:
    """Issue 37: --workdir /nonexistent/x silently made both folders. The demo makes its
    workdir (as mkdir does), not its parents."""
    base = short_tempdir()
    try:
        workdir = base / "absent" / "work"
        proc = raylet_sim("demo", "--workdir", str(workdir))
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == (
            f"raylet-sim: --workdir '{workdir}': no folder '{base / 'absent'}' to make it in "
            "(the demo makes the workdir, not its parents)\n"
        )
        assert list(base.iterdir()) == [], "the refused command made a folder"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("command", [[], ["demo"]], ids=["raylet-sim", "demo"])
def test_the_help_shows_no_rest_markup_and_each_number_its_bounds(command: list[str]) -> None:
    """Issue 37: raylet-sim --help showed its module docstring's reST backticks."""
    proc = raylet_sim(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "`" not in proc.stdout, proc.stdout
    if command:
        text = " ".join(proc.stdout.split())
        for bounds in (
            "(400; from 1 to 1000000)",
            "(36; from 1 to 100000)",
            "(8; from 1 to 64)",
            "(2; above 0 and at most 3600)",
            "(256; from 0 to 65536)",
        ):
            assert bounds in text, text


async def test_the_envs_line_tells_distinct_envs_from_create_calls() -> None:
    """Issue 37: "envs 648 created" against --envs 144 counted create calls as envs. Over 3
    envs, a worker idle for 10 ms exits and its env is deleted, so each env is created again
    and again: the line says 3 distinct, and how many create calls."""
    base = short_tempdir()
    args = argparse.Namespace(
        tasks=40,
        envs=3,
        concurrency=1,
        workdir=str(base / "work"),
        keep=False,
        seed=1,
        idle_timeout=0.01,
        package_kib=0,
    )
    out = io.StringIO()
    try:
        code = await run_demo(args, out)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = out.getvalue()
    assert code == 0, text
    check_summary(text, tasks=40, envs=3, packages=5)
    distinct, created = field(r"^envs\s+(\d+) distinct, (\d+) create calls", text)
    assert distinct == 3, "the seeded workload's 40 tasks use each of the 3 envs"
    assert created > 3, "envs were created again after their last worker exited"
