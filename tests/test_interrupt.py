"""Ctrl-C (issue 12): SIGINT to the whole process group, as a terminal sends it, while the demo
or the chaos runner is under way: one line on stderr, no traceback, exit 130, the node stopped
(no agent, no worker left) and the temp folder it made removed. SIGTERM and SIGHUP (kill,
timeout, a closing terminal), to the demo or to its group, are treated alike (exit 128 + the
signal); a worker whose pool is gone exits quietly. A closed stdout (``raylet-sim demo | head``)
ends the demo as SIGPIPE would: quietly, exit 141. Over 100,000 envs the demo runs in bounded
memory and stops within seconds of SIGTERM. A stopped demo's temp files are removed by a detached
process its line names, which ends, leaving nothing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from raylet_sim.removal import TRASH_SUFFIX, remove_detached
from tests.harness.processes import (
    cmdline,
    gone,
    is_agent,
    is_worker,
    live_pids,
    poll,
    rss_bytes,
    workers_in,
)
from tests.harness.ray_nodes import group_and_descendants
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]
UNDER_WAY_S = 90.0  # deadline for the run to be under way (tasks finishing)
STOP_S = 30.0  # deadline for the run to stop after the SIGINT
REMOVED_S = 60.0  # deadline for a stopped run's remover to have removed its temp files
# The demo over 100,000 envs, with --idle-timeout 60 piling idle workers up to the pool's limit:
# its processes (the demo, the agent, 8 busy and at most 64 idle workers, about 17 MiB each) hold
# about 1.4 GiB at most; measured, 1.3 GiB at 78 processes. Before issue 37 it built every
# sample in memory first: 8.6 GB, past this bound within seconds.
MEMORY_BOUND = 2 * 1024**3
PILED_UP = 60  # processes in the demo's tree: idle workers have piled up near the pool's limit
# After SIGTERM it stops within this: generous for a loaded machine. Measured by hand on this
# project's 2-core machine shared with other jobs (docs/development.md, "Stopping"): 0.3 to 0.7 s
# at any point of the run, its workers and agent stopped at once and its temp files (10,000 after
# 90 s) left to a detached remover; before, 0.5 s a few seconds in, 1.8 s after 40 s, 3.1 s after
# 90 s (most of it removing those files).
SIGTERM_STOP_S = 10.0


def interrupt_when(
    args: list[str],
    under_way: str,
    sig: signal.Signals = signal.SIGINT,
    *,
    group: bool = True,
    watch: Callable[[int], bool] | None = None,
    stop_s: float = STOP_S,
) -> tuple[int, str, str, Path]:
    """Start ``args`` in a session of its own with a private TMPDIR; once its stdout matches
    ``under_way`` (and ``watch``, called with its pid at each look until it exits, says True),
    send ``sig`` to its process group (or, not ``group``, to it alone); wait ``stop_s`` for it
    to exit; return (exit code, stdout, stderr, that TMPDIR). Everything it started is killed by
    PID if the test fails on the way."""
    base = short_tempdir()
    tmp = base / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    out_path, err_path = base / "stdout", base / "stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            args, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
        )
    agent: list[int] = []

    def ready() -> bool | None:
        if watch is not None and not watch(proc.pid):
            return None
        return re.search(under_way, out_path.read_text(errors="replace")) is not None or None

    def ended() -> int | None:
        if watch is not None:
            watch(proc.pid)
        return proc.poll()

    try:
        poll(ready, UNDER_WAY_S, f"{under_way!r} in the output")
        agent += [int(m) for m in re.findall(r"agent pid (\d+)", out_path.read_text())]
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        code = poll(ended, stop_s, f"the run to exit within {stop_s} s of {sig.name}")
        check_node_stopped(agent, base)
        return code, out_path.read_text(), err_path.read_text(), tmp
    finally:
        stop_everything(proc, agent, base)


def removers_in(base: Path) -> list[int]:
    """The remover processes (``raylet_sim.removal``) of a run under ``base``."""
    return [
        pid
        for pid in live_pids()
        if "raylet_sim.removal" in (argv := cmdline(pid)) and str(base) in " ".join(argv)
    ]


def check_files_removed(err: str, tmp: Path, base: Path) -> None:
    """The temp files a stopped run made are removed, by the remover its line names (if any),
    which ends: nothing is left under ``tmp`` and no remover of the run's runs, within a deadline
    (the run exits before its remover has finished)."""
    for pid in (int(n) for n in re.findall(r"being removed by process (\d+)", err)):
        poll(exited(pid), REMOVED_S, f"the remover {pid} to exit")

    def removed() -> bool | None:
        empty = not tmp.exists() or list(tmp.iterdir()) == []
        return (empty and removers_in(base) == []) or None

    poll(removed, REMOVED_S, f"the stopped run's temp files in {tmp} to be removed")


def check_node_stopped(agent: list[int], base: Path) -> None:
    """The agent exits (soon), and no worker of the run under ``base`` is left."""
    for pid in agent:
        poll(exited(pid), STOP_S, f"the agent {pid} to exit")
    assert workers_in(base) == [], "a worker outlived the interrupted run"


def stop_everything(proc: subprocess.Popen[bytes], agent: list[int], base: Path) -> None:
    """Kill by PID what the run under ``base`` started and what is left of it; remove ``base``."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in [*agent, *workers_in(base)]:
        if not gone(pid) and (is_agent(pid) or is_worker(pid)):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid in removers_in(base):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=STOP_S)
    shutil.rmtree(base, ignore_errors=True)


def check_stop_line(err: str, sig: signal.Signals) -> None:
    """The demo's one line: the signal, and the process removing its temp files."""
    assert re.fullmatch(
        f"raylet-sim: interrupted by {sig.name}; the node stopped, "
        r"its temp files are being removed by process \d+\n",
        err,
    ), err[-4000:]


def exited(pid: int) -> Callable[[], bool | None]:
    return lambda: gone(pid) or None


def check_clean_interrupt(
    code: int, err: str, tmp: Path, prog: str, sig: signal.Signals = signal.SIGINT
) -> None:
    assert code == 128 + sig, f"exit {code}; stderr:\n{err[-4000:]}"
    assert "Traceback" not in err, err[-4000:]
    lines = err.splitlines()
    assert len(lines) <= 2, f"{len(lines)} lines on stderr:\n{err[-4000:]}"
    said = "interrupted" if sig == signal.SIGINT else f"interrupted by {sig.name}"
    assert lines[-1].startswith(f"{prog}: {said};"), err
    check_files_removed(err, tmp, tmp.parent)


@pytest.mark.timeout(180)
def test_ctrl_c_during_the_demo_stops_the_node_cleanly_says_one_line_and_exits_130() -> None:
    args = [
        sys.executable, "-m", "raylet_sim", "demo", "--tasks", "100000", "--envs", "12",
        "--package-kib", "16",
    ]  # fmt: skip
    code, _, err, tmp = interrupt_when(args, r"\d+/100000 tasks")
    check_clean_interrupt(code, err, tmp, "raylet-sim")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "SIGTERM"])
def test_a_stop_signal_during_the_chaos_runner_stops_the_nodes_cleanly_in_one_line(
    sig: signal.Signals,
) -> None:
    """Ctrl-C exits 130; SIGTERM (kill, timeout), which killed it outright, 143."""
    args = [
        sys.executable, str(REPO / "scripts" / "chaos.py"), "--seed", "3", "--rounds", "50",
        "--agent-kills", "10", "--tasks", "60",
    ]  # fmt: skip
    started = time.monotonic()
    code, _, err, tmp = interrupt_when(args, r"round 1\b", sig)
    assert time.monotonic() - started < 170
    check_clean_interrupt(code, err, tmp, "chaos", sig)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("group", [False, True], ids=["process", "group"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_during_the_demo_stops_the_node_as_ctrl_c_does_exiting_128_plus_it(
    sig: signal.Signals, group: bool
) -> None:
    """As ``kill``, ``timeout`` or a closing terminal send them: one line, no traceback (from a
    worker's broken pipe either), the node stopped, the temp folder removed, exit 143 or 129."""
    args = [
        sys.executable, "-m", "raylet_sim", "demo", "--tasks", "100000", "--envs", "200",
        "--package-kib", "16",
    ]  # fmt: skip
    started = time.monotonic()
    code, _, err, tmp = interrupt_when(args, r"\d+/100000 tasks", sig, group=group)
    assert time.monotonic() - started < 30
    assert code == 128 + sig, f"exit {code}; stderr:\n{err[-4000:]}"
    assert "Traceback" not in err, err[-4000:]
    assert "BrokenPipeError" not in err, err[-4000:]
    check_stop_line(err, sig)
    check_files_removed(err, tmp, tmp.parent)


def test_a_worker_whose_replies_pipe_is_closed_exits_1_quietly() -> None:
    """Its pool is gone (killed, say): the ready line it writes finds no reader. In Python's dev
    mode, which shows what a closing file fails to flush."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-X", "dev", "-m", "raylet_sim.worker"],
            stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(write)
    try:
        _, err = proc.communicate(timeout=STOP_S)
    finally:
        with suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=STOP_S)
    assert (proc.returncode, err.decode(errors="replace")) == (1, "")


class TreeMemory:
    """Watches a run: its processes (its group and their descendants: workers have sessions of
    their own) must hold at most MEMORY_BOUND at each look; ready once PILED_UP of them run."""

    def __init__(self) -> None:
        self.peak = 0
        self.most = 0

    def __call__(self, pid: int) -> bool:
        tree = group_and_descendants(pid)
        self.peak = max(self.peak, rss_bytes(tree))
        self.most = max(self.most, len(tree))
        assert self.peak <= MEMORY_BOUND, (
            f"{len(tree)} processes of the demo hold {self.peak / 1024**2:.0f} MiB"
        )
        return len(tree) >= PILED_UP


@pytest.mark.timeout(240)
def test_the_demo_over_100000_envs_runs_in_bounded_memory_and_stops_soon_after_sigterm() -> None:
    """Issue 37: ``--envs 100000`` grew to 8.6 GB and ignored SIGTERM for ten minutes: every
    sample was built in memory, on the event loop, before the first task."""
    memory = TreeMemory()
    demo = [sys.executable, "-m", "raylet_sim", "demo", "--tasks", "100000"]
    args = [*demo, "--envs", "100000", "--idle-timeout", "60"]
    code, _, err, tmp = interrupt_when(
        args, r"\d+/100000 tasks", signal.SIGTERM, group=False, watch=memory, stop_s=SIGTERM_STOP_S
    )
    assert code == 128 + signal.SIGTERM, f"exit {code}; stderr:\n{err[-4000:]}"
    check_stop_line(err, signal.SIGTERM)
    check_files_removed(err, tmp, tmp.parent)
    assert memory.most >= PILED_UP


@pytest.mark.timeout(120)
def test_a_closed_stdout_ends_the_demo_quietly_with_exit_141_and_the_node_stopped() -> None:
    """Issue 37: ``raylet-sim demo | head -3`` ended in a BrokenPipeError traceback. Its reader
    gone, the demo stops as SIGPIPE stops a program: no line, exit 128 + SIGPIPE, the node
    stopped, its temp folder removed."""
    base = short_tempdir()
    tmp = base / "tmp"
    tmp.mkdir()
    # a line per 200 tasks when not on a terminal: the third comes at 200 of 2,000, and the next
    # (seconds later, the pipe closed) fails with EPIPE
    args = [sys.executable, "-m", "raylet_sim", "demo", "--tasks", "2000", "--envs", "12"]
    env = {**os.environ, "TMPDIR": str(tmp)}
    with (base / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=env, start_new_session=True
        )
    agent: list[int] = []
    try:
        assert proc.stdout is not None
        head = [proc.stdout.readline() for _ in range(3)]  # as `head -3` reads, then it exits
        agent += [int(m) for m in re.findall(rb"agent pid (\d+)", head[0])]
        assert agent, head
        proc.stdout.close()
        code = proc.wait(timeout=STOP_S)
        check_node_stopped(agent, base)
        assert (code, (base / "stderr").read_text()) == (128 + signal.SIGPIPE, "")
        check_files_removed("", tmp, base)
    finally:
        stop_everything(proc, agent, base)


def test_a_detached_removal_frees_the_name_at_once_and_its_remover_ends_leaving_nothing(
    tmp_path: Path,
) -> None:
    """``remove_detached``: the folder renamed to a trash name beside it before it returns, and a
    process in a session of its own removes it, then exits 0; nothing is left in the parent."""
    root = tmp_path / "raylet-run"
    for package in range(40):
        folder = root / "agent-root" / "uris" / f"pkg-{package}" / "module"
        folder.mkdir(parents=True)
        for n in range(25):
            (folder / f"f{n}.py").write_text("x = 1\n")
    remover = remove_detached(root)
    assert remover is not None
    try:
        assert not root.exists(), "the run's folder name is free at once"
        assert [p.name for p in tmp_path.iterdir()] in ([], [f".raylet-run{TRASH_SUFFIX}"])
        assert os.getsid(remover.pid) == remover.pid, "the remover has a session of its own"
        assert remover.wait(timeout=REMOVED_S) == 0
        assert list(tmp_path.iterdir()) == [], "the remover left files"
    finally:
        if remover.poll() is None:
            remover.kill()
            remover.wait(timeout=STOP_S)
