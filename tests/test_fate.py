"""Fate sharing, with whole processes: ``python -m raylet_sim demo`` (the pool), the agent it
starts as its sidecar, and its workers, found through /proc and killed by PID."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.processes import (
    gone,
    is_agent,
    is_worker,
    live_pids,
    poll,
    proc_stat,
    workers_in,
)
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]
START_S = 60.0  # deadline for the demo to be up with its workers
EXIT_S = 20.0  # deadline for a process to exit once it should
POOL_EXIT_S = 10.0  # the pool's own deadline: its workers' 3 s grace, then a prompt exit


@dataclass
class Demo:
    proc: subprocess.Popen[bytes]
    base: Path
    seen: set[int] = field(default_factory=set)  # every child pid found, for the cleanup

    def children(self) -> list[int]:
        kids = [p for p in live_pids() if (proc_stat(p) or ("", 0))[1] == self.proc.pid]
        self.seen.update(kids)
        return kids

    def agent(self) -> int | None:
        agents = [p for p in self.children() if is_agent(p)]
        return agents[0] if len(agents) == 1 else None

    def workers(self, at_least: int) -> list[int] | None:
        workers = [p for p in self.children() if is_worker(p)]
        return workers if len(workers) >= at_least else None

    def stderr(self) -> str:
        return (self.base / "stderr").read_text(errors="replace")


@pytest.fixture
def demo() -> Iterator[Demo]:
    """A long demo (the pool) with its agent and 2+ workers up; everything killed by PID after."""
    base = short_tempdir()
    args = [
        sys.executable, "-m", "raylet_sim", "demo", "--tasks", "100000", "--envs", "4",
        "--concurrency", "4", "--idle-timeout", "30", "--workdir", str(base / "work"),
    ]  # fmt: skip
    with (base / "stdout").open("wb") as out, (base / "stderr").open("wb") as err:
        proc = subprocess.Popen(args, stdout=out, stderr=err, cwd=REPO, start_new_session=True)
    running = Demo(proc, base)
    try:
        poll(running.agent, START_S, "the demo's agent")
        running.seen.update(poll(lambda: running.workers(2), START_S, "two workers"))
        yield running
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the demo and the agent: the demo's group
        for pid in running.seen | set(workers_in(base)):  # workers have sessions of their own
            if not gone(pid) and (is_worker(pid) or is_agent(pid)):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=EXIT_S)
        shutil.rmtree(base, ignore_errors=True)


def test_killing_the_agent_kills_the_workers_and_the_pool_exits_non_zero_saying_so(
    demo: Demo,
) -> None:
    agent = demo.agent()
    workers = demo.workers(2)
    assert agent is not None
    assert workers is not None
    os.kill(agent, signal.SIGKILL)
    killed = time.monotonic()
    poll(lambda: all(gone(p) for p in workers) or None, EXIT_S, f"workers {workers} to exit")
    try:
        code = demo.proc.wait(timeout=max(0.0, killed + POOL_EXIT_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the pool was still running {POOL_EXIT_S:g}s after its agent died; "
            f"stderr:\n{demo.stderr()}"
        )
    assert code != 0
    err = demo.stderr()
    assert re.search(rf"agent \(pid {agent}\) exited with code -9", err), err
    assert re.search(r"killed \d+ worker", err), err
    assert workers_in(demo.base) == [], "a worker of the dead pool is still running"


def test_killing_the_pool_makes_the_agent_exit_within_seconds_and_its_workers_exit(
    demo: Demo,
) -> None:
    agent = demo.agent()
    assert agent is not None
    assert demo.workers(2) is not None
    demo.proc.kill()  # SIGKILL: the pool gets no chance to stop its agent
    demo.proc.wait(timeout=EXIT_S)
    killed = time.monotonic()
    poll(lambda: gone(agent) or None, 10.0, f"agent {agent} to exit after its parent died")
    assert time.monotonic() - killed < 10.0
    poll(lambda: not workers_in(demo.base) or None, EXIT_S, "workers to exit at stdin's EOF")
