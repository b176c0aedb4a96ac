"""``rtenv-agent ray stop`` run as a user runs it, on stand-in nodes: real processes whose command
lines name a Ray session as a node's processes do (no Ray needed): it stops every process of
the temp dir's or the address's nodes and their descendants, SIGKILLs one that ignores SIGTERM
after the grace period, leaves every other process alone, and says when there is nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.agent_process import REPO
from tests.harness.processes import gone, poll
from tests.harness.tempdirs import short_tempdir

SESSION = "session_2026-12-07_12-21-39_614323_4242"
# named by the stand-ins only, one address a test: two of these tests running at once (on two
# workers) must not stop each other's stand-ins, as an address's stop would
GCS = "127.0.0.9:46123"
GCS_OF_TEMP_DIR_TEST = "127.0.0.9:46124"
GCS_OF_NOTHING_TEST = "127.0.0.9:46125"
EXIT_S = 60.0
# A stand-in: says it is ready (its SIGTERM handler set, its child started), then sleeps.
STAND_IN = """\
import os, signal, subprocess, sys, time
if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--with-child" in sys.argv:  # a worker: no session on its command line, a session of its own
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    print(child.pid, flush=True)
print("ready", flush=True)
time.sleep(600)
"""


@dataclass
class StandIns:
    """The stand-in processes a test started, each stopped by its PID at the end."""

    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    children: list[int] = field(default_factory=list)

    def start(self, *args: str) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, *args], stdout=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        if "--with-child" in args:
            self.children.append(int(proc.stdout.readline()))
        assert proc.stdout.readline() == "ready\n"
        return proc.pid

    def alive(self, pid: int) -> bool:
        for proc in self.procs:
            if proc.pid == pid:
                return proc.poll() is None
        return not gone(pid)

    def stop(self) -> None:
        for pid in [p.pid for p in self.procs] + self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(EXIT_S)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def stand_ins() -> Iterator[StandIns]:
    started = StandIns()
    try:
        yield started
    finally:
        started.stop()


def ray_stop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "ray", "stop", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _reaped(stand_ins: StandIns, pids: list[int]) -> bool | None:
    """Each of ``pids`` gone (our children reaped as they end)."""
    return True if not any(stand_ins.alive(pid) for pid in pids) else None


def test_a_temp_dirs_nodes_are_stopped_with_their_descendants_and_nothing_else(
    stand_ins: StandIns,
) -> None:
    base = short_tempdir()
    try:
        ours, other = base / "a", base / "a2"  # one's name a prefix of the other's
        session = f"{ours}/{SESSION}"
        (ours / SESSION).mkdir(parents=True)
        node = [
            stand_ins.start(f"--raylet_socket_name={session}/sockets/raylet", "--with-child"),
            stand_ins.start(f"--logs-dir={session}/logs", f"--gcs-address={GCS_OF_TEMP_DIR_TEST}"),
            stand_ins.start(f"--session-dir={session}", "--ignore-sigterm"),
        ]
        worker = stand_ins.children[0]
        others = [
            stand_ins.start(f"--session-dir={other}/{SESSION}"),
            stand_ins.start(f"{session}/logs/raylet.out"),  # a bare path: a tail -f, a less
            stand_ins.start(f"--file={ours}/session_latest/logs/raylet.out"),
        ]
        stopped = ray_stop("--temp-dir", str(ours), "--grace-period", "1.5")
        assert stopped.returncode == 0, stopped.stderr
        lines = stopped.stdout.splitlines()
        assert lines[0] == (
            f"rtenv-agent ray stop: the nodes of temp dir {str(ours)!r} ({SESSION}): 4 processes"
        ), lines
        said = {int(line.split()[0]): line for line in lines[1:-1]}
        assert set(said) == {*node, worker}
        assert said[node[2]].endswith("killed (SIGKILL after the grace period)"), said
        assert said[node[0]].endswith("stopped (SIGTERM)"), said
        assert lines[-1] == "rtenv-agent ray stop: stopped 4 processes (1 with SIGKILL)"
        poll(lambda: _reaped(stand_ins, [*node, worker]), EXIT_S, "the node's processes to end")
        assert all(map(stand_ins.alive, others)), "another node's or a bystander's was stopped"
        again = ray_stop("--temp-dir", str(ours))
        assert again.returncode == 3, again
        assert again.stderr == (
            f"rtenv-agent ray stop: no Ray node to stop: the nodes of temp dir {str(ours)!r}: "
            "none of its 1 session has a running process\n"
        ), again.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_address_stops_the_processes_of_its_nodes_sessions_and_nothing_else(
    stand_ins: StandIns,
) -> None:
    """The GCS server names no address, only its session: it goes with the session of the
    processes that name the address."""
    base = short_tempdir()
    try:
        session = f"{base}/c/{SESSION}"
        node = [
            stand_ins.start(f"--session-dir={session}"),
            stand_ins.start(f"--session_dir={session}", f"--gcs-address={GCS}"),
        ]
        others = [
            stand_ins.start(f"--session-dir={base}/d/{SESSION}", "--gcs-address=127.0.0.9:1"),
            stand_ins.start(f"--address={GCS}"),  # a driver given the address
        ]
        stopped = ray_stop("--address", GCS, "-g", "1")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.splitlines()[0] == (
            f"rtenv-agent ray stop: the nodes of GCS address {GCS} ({SESSION}): 2 processes"
        )
        poll(lambda: _reaped(stand_ins, node), EXIT_S, "the node's processes to end")
        assert all(map(stand_ins.alive, others))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_nothing_to_stop_is_one_line_and_exit_3_with_no_ray_installed(tmp_path: Path) -> None:
    """The stop needs no Ray: with an ``import ray`` that fails, it still runs."""
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no ray here (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    (tmp_path / "empty").mkdir()
    for folder, why in [("empty", "it holds no session of Ray's"), ("none", "no such folder")]:
        result = ray_stop("--temp-dir", str(tmp_path / folder), env=env)
        assert result.returncode == 3, result.stderr
        assert result.stdout == ""
        assert result.stderr == (
            f"rtenv-agent ray stop: no Ray node to stop: the nodes of temp dir "
            f"{str(tmp_path / folder)!r}: {why}\n"
        )
    nowhere = ray_stop("--address", GCS_OF_NOTHING_TEST, env=env)
    assert nowhere.returncode == 3
    assert nowhere.stderr.endswith("no process on this machine names it (as --gcs-address=)\n")
    helped = ray_stop("--help", env=env)
    assert helped.returncode == 0, helped.stderr
    assert "--temp-dir DIR" in helped.stdout
    assert "--grace-period" in helped.stdout
