"""A cluster of the chaos run, and each attempt of its driver.

A ``Cluster`` is a folder (its ``RAY_TMPDIR``) and a driver spec: a bare ``ray.init()`` (mode
``init``: the driver's own one-node cluster) or a ``ray.cluster_utils.Cluster`` of several
nodes (mode ``cluster``), run by the Ray python the switch is on in. An ``Attempt`` is one run of
its driver (``driver.py SPEC``): a process in a session of its own whose ``CHAOS {json}`` lines
are read as they come (``start``, ``ready``, one ``outcome`` per unit of work, ``done``). After
``done`` the driver waits for a line on stdin (``release``) before it stops its cluster: the
runner's quiet point, when every cluster has done its work and none has stopped yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosray import procs

LINE = "CHAOS "
LEAVE_S = 30.0  # a cluster's processes to go once its driver has ended
AFTER_DEAD_S = 5.0  # a driver whose cluster died, to end on its own before it is killed
_MAX_LINES = 100_000  # bounded: a driver prints a line a unit of work


@dataclass
class Cluster:
    index: int
    mode: str  # "init" or "cluster"
    nodes: int
    ray_tmp: Path
    attempts: int = 0


@dataclass
class Attempt:
    cluster: Cluster
    number: int
    crash_point: str = ""  # RTENV_CRASH_AT in its environment: its agents die there
    pid: int = 0  # the driver's (its start line)
    started: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)  # it said done (and waits)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # its process exited
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    code: int | None = None
    stderr: str = ""
    killed: str = ""  # the fault that ended its cluster (the runner's), "" if none
    logs: str = ""  # its cluster's last log lines, when it ended with no fault to end it
    proc: asyncio.subprocess.Process | None = None
    follower: asyncio.Future[None] | None = None  # reads its output until it exits

    @property
    def label(self) -> str:
        return f"cluster {self.cluster.index} attempt {self.number}"

    def why(self) -> str:
        """How it ended, for a violation."""
        tail = self.stderr.strip().splitlines()[-3:]
        said = "done" if self.done.is_set() else "not done"
        logs = f"; its cluster's logs: {self.logs[-1200:]}" if self.logs else ""
        return f"exit {self.code}, {said}; its last words: {' | '.join(tail)[-400:]}{logs}"


async def _read(stream: asyncio.StreamReader, attempt: Attempt) -> None:
    for _ in range(_MAX_LINES):
        line = await stream.readline()
        if not line:
            return
        text = line.decode(errors="replace")
        if not text.startswith(LINE):
            continue
        with contextlib.suppress(ValueError):
            event = json.loads(text[len(LINE) :])
            kind = event.get("kind")
            if kind == "start":
                attempt.pid = int(event["pid"])
            elif kind == "ready":
                attempt.ready.set()
            elif kind == "outcome":
                attempt.outcomes.append(event)
            elif kind == "done":
                attempt.done.set()


async def start(
    cluster: Cluster,
    python: str,
    driver: Path,
    spec: Mapping[str, Any],
    env: Mapping[str, str],
    crash_point: str = "",
) -> Attempt:
    """A new attempt of ``cluster``'s driver, running."""
    cluster.attempts += 1
    attempt = Attempt(cluster, cluster.attempts, crash_point)
    folder = cluster.ray_tmp.parent
    spec_path = folder / f"spec-{cluster.index}-{attempt.number}.json"
    spec_path.write_text(json.dumps({**spec, "mode": cluster.mode, "nodes": cluster.nodes}))
    environ = {**env, "RAY_TMPDIR": str(cluster.ray_tmp)}
    if crash_point:
        environ["RTENV_CRASH_AT"] = crash_point
    attempt.started = time.time()
    attempt.proc = await asyncio.create_subprocess_exec(
        python, str(driver), str(spec_path), cwd=folder, env=environ,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    attempt.follower = asyncio.ensure_future(_follow(attempt))
    return attempt


async def _follow(attempt: Attempt) -> None:
    proc = attempt.proc
    assert proc is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read())
    await _read(proc.stdout, attempt)
    attempt.code = await proc.wait()
    attempt.stderr = (await errors).decode(errors="replace")[-4000:] + attempt.stderr
    attempt.ended.set()


def release(attempt: Attempt) -> None:
    """Tell a driver that said done to stop its cluster and exit."""
    proc = attempt.proc
    if proc is not None and proc.stdin is not None and not attempt.ended.is_set():
        with contextlib.suppress(ConnectionError, RuntimeError):
            proc.stdin.write(b"release\n")


def kill_group(attempt: Attempt) -> None:
    """SIGKILL the driver's session (the driver and whatever it runs in its group)."""
    if attempt.proc is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(attempt.proc.pid, signal.SIGKILL)


async def wait_ended(attempt: Attempt, timeout_s: float) -> bool:
    """Wait for the driver to exit; past ``timeout_s`` kill its group and wait. True if it
    exited on its own."""
    try:
        await asyncio.wait_for(attempt.ended.wait(), timeout_s)
        return True
    except TimeoutError:
        attempt.stderr += "(its group killed by the runner)\n"
        kill_group(attempt)
        await asyncio.wait_for(attempt.ended.wait(), 30.0)
        return False


_LOGS = ("raylet.out", "runtime_env_agent.err", "runtime_env_agent.log", "gcs_server.out")
_LOG_LINES = 4


def last_words(cluster: Cluster) -> str:
    """The last lines of its newest session's raylet, agent and GCS logs (for a violation: the
    run removes its file system at the end). Blocking."""
    sessions = sorted((cluster.ray_tmp / "ray").glob("session_2*"))
    if not sessions:
        return "(no Ray session)"
    out = []
    for name in _LOGS:
        for path in sorted((sessions[-1] / "logs").glob(f"{name}*"))[:1]:
            with contextlib.suppress(OSError):
                lines = path.read_text(errors="replace").splitlines()[-_LOG_LINES:]
                out.append(f"{path.name}: " + " | ".join(line[-200:] for line in lines))
    return "; ".join(out)


def _cluster_alive(cluster: Cluster) -> bool:
    """Its GCS and its head node's raylet are running. Blocking."""
    roles = procs.roles(cluster.ray_tmp)
    return bool(roles.gcs) and roles.head() is not None


async def until_over(attempt: Attempt) -> None:
    """Wait until the attempt says done or its driver exits. A driver whose cluster died (a
    fault killed it, a crash point fired, or it died on its own) may wait on it for minutes:
    ``AFTER_DEAD_S`` after the cluster was seen dead, its group is killed, as its user would
    stop it to relaunch."""
    dead_at = 0.0
    for _ in range(1_000_000):  # bounded by the attempt's end (or the round's deadline)
        if attempt.done.is_set() or attempt.ended.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attempt.ended.wait(), 2.0)
        if attempt.done.is_set() or attempt.ended.is_set():
            return
        if not dead_at and attempt.ready.is_set():
            alive = not attempt.killed and await asyncio.to_thread(_cluster_alive, attempt.cluster)
            dead_at = 0.0 if alive else time.monotonic()
        if dead_at and time.monotonic() - dead_at > AFTER_DEAD_S:
            await wait_ended(attempt, 0.0)
            return


async def clear(cluster: Cluster, timeout_s: float = LEAVE_S) -> list[str]:
    """Wait for the cluster's processes to go; those left after ``timeout_s`` are SIGKILLed
    and named."""
    deadline = time.monotonic() + timeout_s
    for _ in range(10_000):  # bounded by the deadline
        pids = await asyncio.to_thread(procs.naming, cluster.ray_tmp)
        if not pids or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    if not pids:
        return []
    everything = await asyncio.to_thread(procs.all_procs)
    left = [everything[p].title for p in pids if p in everything]
    procs.kill_all(pids)
    return left
