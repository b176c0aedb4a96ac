"""One round of the uv-scale workload: K experiments' drivers at once, and in round two a
driver and another experiment's raylet SIGKILLed mid-round and those experiments relaunched.

``Experiment`` is a project folder with its own ``RAY_TMPDIR`` and environment. ``run_round``
spawns each experiment's ``uv run python launch.py`` (a session of its own), reads its facts as
they come, and, with ``kills``, waits for the target's first task result, then SIGKILLs its
driver (the python ``uv run`` started: its pid is in its start fact) or its raylet (the
``raylet`` process naming its ``RAY_TMPDIR``). A killed experiment's driver is given
``AFTER_KILL_S`` to end (then its process group is killed), its cluster's processes
``LEAVE_S`` to go (then they are killed by pid), and it is relaunched in the same folder, as its
user relaunches a crashed experiment. What each attempt reported is kept for the oracle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib.uv_scale_oracle import KILLED_DRIVER, RELAUNCH, RUN
from benchlib.uv_scale_project import REPO  # first: it puts tests/harness on the path
from tests.harness.uv_projects import (
    FACT,
    Project,
    launch_command,
    leftover_processes,
    processes_naming,
)

LEAVE_S = 30.0  # a cluster's processes to be gone after its driver exited
AFTER_KILL_S = 90.0  # a driver whose raylet was killed, to end on its own
UNREGISTERED = b"have not registered within the timeout"


@dataclass
class Experiment:
    index: int
    project: Project
    ray_tmp: Path
    env: Mapping[str, str]
    uv_args: tuple[str, ...] = ()  # --plant: the line that keys a second venv


@dataclass
class Run:
    """One attempt of an experiment's driver."""

    experiment: Experiment
    kind: str  # RUN, KILLED_DRIVER, KILLED_RAYLET, RELAUNCH
    started: float = 0.0
    ended: float = 0.0
    code: int | None = None
    facts: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    kill_landed: bool = False
    processes_left: list[str] = field(default_factory=list)
    first_task: asyncio.Event = field(default_factory=asyncio.Event)
    over: asyncio.Event = field(default_factory=asyncio.Event)  # ended, its cluster gone
    deadline: float = 0.0  # time.monotonic() by which it is killed


async def _read_facts(stream: asyncio.StreamReader, run: Run) -> None:
    for _ in range(100_000):  # bounded: a driver prints a few dozen lines
        line = await stream.readline()
        if not line:
            return
        text = line.decode(errors="replace")
        if text.startswith(FACT):
            with contextlib.suppress(ValueError):
                fact = json.loads(text[len(FACT) :])
                run.facts.append(fact)
                if fact.get("kind") in ("task", "failed"):
                    run.first_task.set()


async def attempt(run: Run, timeout_s: float, delay_s: float = 0.0) -> Run:
    """After ``delay_s``, run the experiment's driver to its end (or ``run.deadline``), then
    wait for its cluster's processes to go (those left are killed and named)."""
    await asyncio.sleep(delay_s)
    e = run.experiment
    run.started = time.time()
    run.deadline = time.monotonic() + timeout_s
    proc = await asyncio.create_subprocess_exec(
        *launch_command(e.uv_args), cwd=e.project.path, env=dict(e.env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    reader = asyncio.create_task(_read_facts(proc.stdout, run))
    errors = asyncio.create_task(proc.stderr.read())
    try:
        for _ in range(100_000):  # bounded by the deadline: one step a second at most
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 1.0)
                break
            if time.monotonic() > run.deadline:
                _kill_group(proc.pid)
                await proc.wait()
                run.stderr += "(killed at its deadline)\n"
                break
    except asyncio.CancelledError:  # the round was stopped (its disk floor): uv goes too
        _kill_group(proc.pid)
        raise
    run.code = proc.returncode
    run.ended = time.time()
    await reader
    run.stderr = (await errors).decode(errors="replace")[-3000:] + run.stderr
    run.processes_left = await asyncio.to_thread(leftover_processes, e.ray_tmp, LEAVE_S)
    run.over.set()
    return run


def _kill_group(pgid: int) -> None:
    """SIGKILL a driver's session: uv and the driver (gone already: fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def raylet_of(ray_tmp: Path) -> int | None:
    """The pid of the raylet naming ``ray_tmp``, None when there is none."""
    for pid in processes_naming(ray_tmp):
        with contextlib.suppress(OSError):
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
            if os.path.basename(argv0) == b"raylet":
                return pid
    return None


def _driver_of(run: Run) -> int | None:
    return next((int(f["pid"]) for f in run.facts if f.get("kind") == "start"), None)


async def _kill_then_relaunch(run: Run, kind: str, timeout_s: float) -> Run | None:
    """At ``run``'s first task result: SIGKILL its driver or its raylet (``kind``); once it has
    ended, relaunch it. The relaunch (None when the first attempt ended first)."""
    ended = asyncio.ensure_future(run.over.wait())
    first = asyncio.ensure_future(run.first_task.wait())
    await asyncio.wait([ended, first], return_when=asyncio.FIRST_COMPLETED)
    first.cancel()
    if not ended.done():
        pid = _driver_of(run) if kind == KILLED_DRIVER else raylet_of(run.experiment.ray_tmp)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                run.kill_landed = True
        run.deadline = min(run.deadline, time.monotonic() + AFTER_KILL_S)
    await ended
    relaunch = Run(run.experiment, RELAUNCH)
    return await attempt(relaunch, timeout_s)


async def run_round(
    experiments: Sequence[Experiment], kills: Mapping[int, str], timeout_s: float,
    stagger_s: float = 0.0,
) -> list[Run]:  # fmt: skip
    """Every experiment's driver, each ``stagger_s`` after the one before (0: all at once);
    ``kills``: experiment index -> KILLED_DRIVER or KILLED_RAYLET (then relaunched). Every
    attempt, in the order they started."""
    runs = [Run(e, kills.get(e.index, RUN)) for e in experiments]
    firsts = [attempt(r, timeout_s, i * stagger_s) for i, r in enumerate(runs)]
    killers = [_kill_then_relaunch(r, r.kind, timeout_s) for r in runs if r.kind != RUN]
    done = await asyncio.gather(*firsts, *killers)
    return runs + [r for r in done[len(runs) :] if isinstance(r, Run)]


def unregistered(ray_tmp: Path, sessions: Sequence[str]) -> int:
    """The "have not registered within the timeout" lines in ``sessions``' logs. Blocking."""
    count = 0
    for name in sessions:
        logs = ray_tmp / "ray" / name / "logs"
        for path in logs.glob("*") if logs.is_dir() else []:
            with contextlib.suppress(OSError):
                if path.is_file():
                    count += path.read_bytes().count(UNREGISTERED)
    return count


def sessions(ray_tmp: Path) -> set[str]:
    """The session folders under ``ray_tmp`` (not the ``session_latest`` link)."""
    folder = ray_tmp / "ray"
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.glob("session_*") if not p.is_symlink()}


def agent_leftovers(root: Path) -> list[str]:
    """What of an agent is left in ``root`` once no agent serves it: its sockets, holder files
    and rows, staging (``tmp/``) and trash entries. Blocking."""
    out = [f"socket {p.name}" for p in root.glob("agent*.sock")]
    for sub in ("holders", "tmp", "trash"):
        folder = root / sub
        if folder.is_dir():
            out += [f"{sub}/{name}" for name in sorted(os.listdir(folder))]
    out += [f"holder row {h}" for h in _holder_rows(root)]
    return out


def _holder_rows(root: Path) -> list[str]:
    """The holders ``rtenv-agent info --root`` lists (alive or dead)."""
    import subprocess
    import sys

    if not (root / "state.db").exists():
        return []
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "agent", "info", "--root", str(root), "--json"], env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return [f"(info --root failed: {done.stderr.strip()[-200:]})"]
    info = json.loads(done.stdout)
    holders = info.get("holders") or info.get("agents") or []
    return [str(h.get("id", h)) if isinstance(h, dict) else str(h) for h in holders]
