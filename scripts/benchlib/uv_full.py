"""uv-full (run only when named: ``--only uv-full``; root): issue 39 item 2, the disk that fills
anyway. The seed user's K experiments under ``uv run`` filled the machine's /tmp (``ENOSPC`` in
unrelated code, hundreds of tasks recorded as errors). Here a tmpfs made for the run holds the
Ray temp dirs, TMPDIR, the agent's root and uv's cache, sized to hold one env but not two; the
projects and their own ``.venv`` (the user's home) are on the ordinary disk, and uv copies
(``UV_LINK_MODE=copy``: what it does from a cache on another disk, as the seed user's was).

One round per agent, stock Ray's first, then this agent's (switched on by ``uv_run.switch_ours``),
each on a tmpfs of its own: the projects (K on lock A, one on lock B: another version of the
large dependency) are made and synced, filling uv's cache on the tmpfs; then the tmpfs is sized
to what it holds plus one env (experiment 1's ``.venv``) plus ``ROOM_OF_BIG`` of the large
dependency: room for one env, not for a second one, even one sharing Ray's wheels with the first.
Then: the K experiments on A start (a bare ``ray.init()``, ``uv run python held.py``: the
project's unmodified ``launch.py``, then probe tasks, each reporting how it ended), one after
another, each holding once its tasks have run, till all K run at once; B is launched while they
hold, and awaited; what is on the tmpfs is looked at (venvs built in part, the agent's staging);
A's experiments are released (their probes again: are they untouched?) and awaited; B is
relaunched on a fresh Ray temp dir.

Recorded for each agent: how each driver ended (exit code, the first error's class and first
line, tasks failed), the tasks, driver outputs and worker logs that saw ENOSPC, B's time to its
first failed task, what was left. ``benchlib/uv_full_oracle.py`` judges: goals on this agent's
figures, stock Ray's the baseline (recorded, never judged).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib.config import Sizes
from benchlib.disk_sampler import disk_bytes
from benchlib.figures import Measure, WorkloadResult
from benchlib.procs import BenchError
from benchlib.small_disk import (
    logs_naming_no_space,
    make_small_disk,
    remove_small_disk,
    resize,
    used_bytes,
    venvs_in_part,
)
from benchlib.uv_full_oracle import (
    End,
    Outcome,
    broken,
    cluster_unstarted,
    figures,
    misses,
    mode_of,
    saw_no_space,
)
from benchlib.uv_run import LEAVE_S, switch_ours
from tests.harness.ray_wheelhouse import BIG, big_wheel, ray_wheelhouse
from tests.harness.uv_projects import (
    FACT,
    Project,
    kill_all,
    leftover_processes,
    make_project,
    processes_naming,
    ray_environ,
    run_uv,
    user_uv,
)

MiB = 2**20
ROOM_OF_BIG = 0.7  # the room past one env, in large dependencies: B's own bytes do not fit
SETUP_DISK = 16 * 2**30  # the tmpfs while the projects are synced (uses only what it holds)
SESSIONS_SLACK = 24 * MiB  # Ray's sessions' files on the tmpfs (logs, sockets, working dirs)
# Ray's raylet waits this long (ms; Ray's default 30 s) for its agents; the same for both agents.
# (A driver gives its raylet a fixed 30 s to come up, which a cluster starting beside another's
# start or build on this loaded 2-core machine passed: the drivers on A start one after another,
# each once the previous one holds, its tasks run; all K then hold at once.)
AGENT_REGISTER_MS = "120000"
STARTS = 3  # a driver whose local cluster did not start (Ray's 30 s passed): started again
# at most, for a driver to hold or end (a hung driver: killed; stock Ray's, whose workers die in
# `uv run` on the full disk, restarts them for ever); for those that build a lock's env, longer
WAIT_S = 120.0
BUILD_S = 300.0
PROBES = 8  # each driver's probe tasks, per stage

HELD_PY = '''"""uv-full's driver (written by scripts/benchlib/uv_full.py): the project's launch.py
as its user wrote it, then probe tasks, each reporting how it ended; with EXPERIMENT_HOLD, held
until that file exists, then the probes again."""
import json
import os
import runpy
import sys
import time
import traceback

failed = 0


def fact(kind, **more):
    print("FACT " + json.dumps({"kind": kind, "t": time.time(), **more}), flush=True)


def error(stage, exc):
    global failed
    failed += 1
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    lines = str(exc).strip().splitlines() or [""]
    fact("error", stage=stage, error_class=type(exc).__name__, first_line=lines[0][:300],
         text=text[-6000:])


try:
    runpy.run_path("launch.py", run_name="__main__")
except Exception as exc:
    error("launch", exc)
import ray


@ray.remote
def probe(i):
    import bigdep

    return bigdep.VERSION, bigdep.size()


def probes(stage):
    if not ray.is_initialized():
        return
    deadline = time.monotonic() + float(os.environ.get("EXPERIMENT_PROBE_S") or 120)
    for ref in [probe.remote(i) for i in range(PROBES)]:
        try:
            version, size = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
            fact("probe", stage=stage, version=version, size=size)
        except Exception as exc:
            error(stage, exc)


probes("before")
hold = os.environ.get("EXPERIMENT_HOLD")
if hold and ray.is_initialized():
    fact("held")
    until = time.monotonic() + float(os.environ.get("EXPERIMENT_HOLD_S") or 600)
    while not os.path.exists(hold) and time.monotonic() < until:
        time.sleep(0.1)
    probes("after")
fact("end")
sys.exit(1 if failed else 0)
'''.replace("PROBES)", f"{PROBES})")


# -- a driver ------------------------------------------------------------------------------------


@dataclass
class Driver:
    """One experiment's ``uv run python held.py``, its output read as it comes."""

    name: str
    project: Project
    ray_tmp: Path
    env: dict[str, str]
    started: float = 0.0
    ended: float = 0.0
    killed: bool = False
    logs_no_space: bool = False  # a log file of its Ray session names ENOSPC
    free_bytes: int = -1  # on the small disk when it ended
    code: int | None = None
    facts: list[dict[str, Any]] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # its stderr's lines
    _proc: asyncio.subprocess.Process | None = None
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def start(self) -> None:
        command = [str(user_uv()), "run", "--offline", "python", "held.py"]
        self.started = time.time()
        self._proc = proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=self.project.path,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=2**20,
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read(proc.stdout, True)),
            asyncio.create_task(self._read(proc.stderr, False)),
            asyncio.create_task(proc.wait()),
        ]

    async def _read(self, stream: asyncio.StreamReader, facts: bool) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            self.output.append(line)
            if not facts:
                self.errors.append(line)
            elif line.startswith(FACT):
                with contextlib.suppress(ValueError):
                    self.facts.append(json.loads(line[len(FACT) :]))

    def exited(self) -> bool:
        return bool(self._tasks) and self._tasks[-1].done()

    async def until(self, kinds: tuple[str, ...], timeout_s: float) -> bool:
        """Whether it printed a fact of ``kinds`` or exited within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.exited() or any(f.get("kind") in kinds for f in self.facts):
                return True
            await asyncio.sleep(0.1)
        return False

    async def finish(self, timeout_s: float) -> None:
        """Its exit, at most ``timeout_s`` away: else its session (uv and python) is killed."""
        proc = self._proc
        assert proc is not None
        done, _ = await asyncio.wait(self._tasks[-1:], timeout=timeout_s)
        if not done:
            self.killed = True
            self.kill()
        await asyncio.gather(*self._tasks)
        self.ended, self.code = time.time(), proc.returncode
        used, size = used_bytes(self.ray_tmp.parent)  # the small disk (one statvfs)
        self.free_bytes = size - used

    def kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def end(self, stages: tuple[str, ...]) -> End:
        """How it ended, counting the tasks of ``stages`` ("launch": launch.py's own)."""
        ran = [
            f
            for f in self.facts
            if (f.get("kind") in ("task", "actor") and "launch" in stages)
            or (f.get("kind") == "probe" and f.get("stage") in stages)
        ]
        failed = [f for f in self.facts if f.get("kind") == "error" and f.get("stage") in stages]
        first = failed[0] if failed else {}
        last_words = next((line for line in reversed(self.errors) if line.strip()), "")
        return End(
            code=None if self.killed else self.code,
            error_class=first.get("error_class", ""),
            first_line=first.get("first_line", "" if self.code == 0 else last_words[:300]),
            error_text=first.get("text", ""),
            tasks=len(ran) + len(failed),
            failed=len(failed),
            no_space_tasks=sum(saw_no_space(f.get("text", "")) for f in failed),
            output_no_space=saw_no_space("\n".join(self.output)),
            logs_no_space=self.logs_no_space,
            free_bytes=self.free_bytes,
            seconds=self.ended - self.started,
            first_error_s=min((f["t"] - self.started for f in failed), default=math.nan),
        )


# -- one round -----------------------------------------------------------------------------------


@dataclass
class Round:
    outcome: Outcome
    notes: list[str]


async def run_round(folder: Path, agent: str, links: list[Path], k: int, big_bytes: int) -> Round:
    """One agent's round: its projects in ``folder``, the rest on a tmpfs of its own."""
    mount = await asyncio.to_thread(make_small_disk, SETUP_DISK)
    drivers: list[Driver] = []
    try:
        return await _round_on(mount, folder, agent, links, k, big_bytes, drivers)
    finally:  # whatever happened: every driver and process of a cluster stopped, by PID
        for d in drivers:
            d.kill()
        await asyncio.to_thread(kill_all, processes_naming(folder))
        await asyncio.to_thread(remove_small_disk, mount)


async def _round_on(
    mount: Path,
    folder: Path,
    agent: str,
    links: list[Path],
    k: int,
    big_bytes: int,
    drivers: list[Driver],
) -> Round:
    cache, root, tmp, release = mount / "cache", mount / "root", mount / "tmp", folder / "release"
    for path in (cache, root, tmp, folder):
        path.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    how = ""

    def environ(ray_tmp: Path, **extra: str) -> dict[str, str]:
        mine = {"RTENV_ROOT": str(root)} if agent == "ours" else {}
        return ray_environ(
            cache, ray_tmp, TMPDIR=str(tmp), UV_LINK_MODE="copy",
            RAY_agent_register_timeout_ms=AGENT_REGISTER_MS, **mine, **extra,
        )  # fmt: skip

    projects: list[Project] = []
    for i, version in enumerate(["1.0"] * k + ["1.1"]):
        name = f"a{i + 1}" if version == "1.0" else "b"
        first = projects[0] if projects else None
        project = await asyncio.to_thread(
            make_project,
            folder / name,
            links,
            environ(mount / "rs"),
            big_version=version,
            note=f"experiment {name}",
            lock_from=first,
        )
        (project.path / "held.py").write_text(HELD_PY)
        await asyncio.to_thread(run_uv, ["sync", "--offline"], project.path, environ(mount / "rs"))
        if agent == "ours":
            how = await asyncio.to_thread(switch_ours, project.venv / "bin" / "python", root)
        projects.append(project)
    env_bytes = await asyncio.to_thread(disk_bytes, [projects[0].venv])
    used, _ = used_bytes(mount)
    room = env_bytes + int(ROOM_OF_BIG * big_bytes)
    size = -(-(used + room) // MiB) * MiB
    await asyncio.to_thread(resize, mount, size)
    floor = min(2**30, size // 20)  # the agent's min-free-disk default: min of 1 GiB and 5%
    sized = env_bytes + floor + SESSIONS_SLACK <= room < env_bytes + big_bytes
    notes.append(
        f"{agent}: the tmpfs is {size / MiB:.0f} MiB: {used / MiB:.0f} MiB held before "
        f"the clock (uv's cache), room {room / MiB:.0f} MiB for one env of "
        f"{env_bytes / MiB:.0f} MiB and {big_bytes / MiB:.0f} MiB of {BIG} each lock"
    )

    retried: list[str] = []

    async def launch(name: str, project: Project, hold: bool, wait_s: float = WAIT_S) -> Driver:
        """``name``'s driver started, then held (``hold``) or ended; started again on a fresh Ray
        temp dir while its local cluster did not start for the machine's load (not the disk's)."""
        for attempt in range(STARTS):
            ray_tmp = mount / (f"r{name}" + (f"x{attempt}" if attempt else ""))
            extra = {"EXPERIMENT_HOLD": str(release)} if hold else {}
            d = Driver(name, project, ray_tmp, environ(ray_tmp, **extra))
            drivers.append(d)
            await d.start()
            if hold:
                await d.until(("held",), wait_s)
            if d.exited() or not hold:
                await d.finish(WAIT_S if hold else wait_s)
                d.logs_no_space = any(await asyncio.to_thread(logs_naming_no_space, [ray_tmp]))
            if not (d.exited() and cluster_unstarted(d.end(("launch",)))):
                break
            retried.append(
                f"{name}: {await asyncio.to_thread(leftover_processes, ray_tmp, LEAVE_S)}"
            )
        return d

    # one after another, each once the previous one holds
    a_drivers = [
        await launch(f"a{i + 1}", p, hold=True, wait_s=WAIT_S if i else BUILD_S)
        for i, p in enumerate(projects[:k])
    ]
    b = await launch("b", projects[k], hold=False)
    after_b = used_bytes(mount)[0]
    places = [mount / name for name in os.listdir(mount) if name != cache.name]
    in_part = await asyncio.to_thread(venvs_in_part, places, BIG, big_bytes)
    staging = await asyncio.to_thread(disk_bytes, [root / "tmp", root / "trash"])
    release.touch()
    await asyncio.gather(*(d.finish(WAIT_S) for d in a_drivers))
    left: list[str] = []
    for d in (*a_drivers, b):
        left += await asyncio.to_thread(leftover_processes, d.ray_tmp, LEAVE_S)
    b_again = await launch("b2", projects[k], hold=False, wait_s=BUILD_S)
    left += await asyncio.to_thread(leftover_processes, b_again.ray_tmp, LEAVE_S)
    worker_logs, other_logs = await asyncio.to_thread(
        logs_naming_no_space, [d.ray_tmp for d in drivers]
    )
    for d in drivers:
        d.logs_no_space = any(await asyncio.to_thread(logs_naming_no_space, [d.ray_tmp]))
    outcome = Outcome(
        agent=agent,
        a=tuple(d.end(("launch", "before")) for d in a_drivers),
        a_after=tuple(d.end(("after",)) for d in a_drivers),
        b=b.end(("launch", "before")),
        b_again=b_again.end(("launch", "before")),
        worker_logs_no_space=len(worker_logs),
        half_built=len(in_part),
        staging_bytes=staging,
        processes_left=len(left),
        sized=sized,
    )
    end_used = used_bytes(mount)[0]
    for d, e, after in zip(a_drivers, outcome.a, outcome.a_after, strict=True):
        notes.append(f"{agent}: {d.name} on lock A: {e.describe()}; after B: {after.describe()}")
    if retried:
        notes.append(f"{agent}: started again, a cluster not up (load; processes left): {retried}")
    notes.append(
        f"{agent}: B while A's held: {outcome.b.describe()}; ended after "
        f"{outcome.b.seconds:.1f}s, first failed task after {outcome.b.first_error_s:.1f}s"
    )
    said = [line for line in outcome.b.error_text.splitlines() if "need" in line]
    if said:  # the line of B's error that names the figures (a refusal's), cut
        notes.append(f"{agent}: B's error says: {said[-1].strip()[:500]}")
    notes.append(f"{agent}: B relaunched after A's ended: {outcome.b_again.describe()}")
    notes.append(
        f"{agent}: after B's failure: {after_b / MiB:.0f} of {size / MiB:.0f} MiB used; "
        f"venvs built in part: {len(in_part)} ({', '.join(in_part[:4])}); the agent's "
        f"staging and trash {staging} bytes; at the end {end_used / MiB:.0f} MiB used"
    )
    notes.append(
        f"{agent}: log files naming ENOSPC: workers' {len(worker_logs)} "
        f"({', '.join(worker_logs[:4])}), others {len(other_logs)} "
        f"({', '.join(other_logs[:4])}); processes left {len(left)}: {left[:3]}"
    )
    if not sized:
        notes.append(f"{agent}: the tmpfs's room is not one env but not two (floor {floor} bytes)")
    if how:
        notes.append(f"{agent}: switched on by {how}")
    return Round(outcome, notes)


async def bench_uv_full(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("uv-full")
    k, big_bytes = sizes.uv_full_experiments, int(sizes.uv_full_big_mib * MiB)
    house = await asyncio.to_thread(ray_wheelhouse)
    links = work / "links"
    for version, seed in (("1.0", 0), ("1.1", 1)):
        await asyncio.to_thread(big_wheel, links, sizes.uv_full_big_mib, version=version, seed=seed)
    outcomes: dict[str, Outcome] = {}
    for agent in ("ours",) if sizes.uv_full_ours_only else ("ray", "ours"):
        who = "Ray's agent" if agent == "ray" else "this agent"
        print(f"[uv-full] {who}: {k} experiments on lock A, then B, on a small disk", flush=True)
        done = await run_round(work / agent, agent, [house.path, links], k, big_bytes)
        outcomes[agent] = done.outcome
        result.notes += done.notes
        m = Measure(f"{agent}: B's first launch", wall_s=done.outcome.b.seconds, requests=1)
        result.measures.append(m)
    stock, ours = outcomes.get("ray"), outcomes["ours"]
    rows = figures(result, stock, ours)
    result.notes += misses(rows, ours)
    result.notes.append(f"this agent's mode: {mode_of(ours)}")
    if stock is None:
        result.notes.append("--uv-full-ours-only: no round on Ray's agent, its baselines NaN")
    bad = [p for o in outcomes.values() for p in broken(o)]
    if bad:
        raise BenchError(
            "the uv-full oracle: " + "; ".join(bad) + "\nnotes:\n" + "\n".join(result.notes)
        )
    return result
