"""uv-run (run only when named: ``--only uv-run``): issue 30's user. K experiments at once on one
machine, each a project folder (the folders differ by one file) whose ``pyproject.toml``
depends on Ray and a large incompressible package, each driver a bare ``ray.init(num_cpus=2)``
started with ``uv run --offline python launch.py``: K local Ray clusters, offline wheels, uv's
cache on the same file system (``UV_LINK_MODE=hardlink``) and, in a second pair of rounds,
copied (``UV_LINK_MODE=copy``: the cache on another disk). In each mode one round on stock Ray's
agent and one on this agent (``switch_ours``), interleaved.

Each round: the K projects are made and their own ``.venv`` synced (``uv sync``: the user's
driver env, made before the clock starts); then the disk under the round's Ray temp dirs, the
agent's root, uv's cache and the projects' ``.venv`` is sampled (``disk_sampler``: each inode
once) while the K drivers run. Figures, per mode: the peak disk ADDED by the K experiments over
the sample before they started, against one env's bytes (experiment 1's ``.venv`` alone; goal
for this agent <= 1.15x, stock expected ~Kx in copy mode); the wall of the K against stock's
(goal <= 0.8x); each experiment's time to its first task; the venvs built for the workers; the
workers that ran uv; and what is left in the Ray temp dirs' ``runtime_resources`` after the
drivers exit (goal: nothing).

The oracle tells three outcomes apart. A broken run (a driver failed, a worker lacks the
dependency or has another experiment's version, a process of a cluster outlived its driver,
stock Ray not on its uv-run path, this agent's venvs not one per distinct lock when it builds
them, or one shared across two locks) fails the workload: exit 1 with or without ``--check``.
A goal missed for a known reason is a miss labelled EXPECTED (this agent's workers still ran uv:
issue 30 item 1 is not in this checkout; or ``--plant``: one experiment's lock differs, so one
venv is impossible); any other miss is labelled UNEXPECTED. ``--check`` exits 1 on any miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib.config import Sizes
from benchlib.disk_sampler import Sampler, disk_bytes, file_bytes
from benchlib.figures import Measure, WorkloadResult
from benchlib.procs import BenchError
from benchlib.uv_run_oracle import Outcome, broken, figures, misses, mode_of

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the tests' offline material (tests/harness/), pytest-free
    sys.path.append(str(REPO))
from tests.harness.ray_wheelhouse import big_wheel, ray_wheelhouse  # noqa: E402
from tests.harness.uv_projects import (  # noqa: E402
    Project,
    check_driver_facts,
    first_task_s,
    kill_all,
    launch_command,
    leftover_processes,
    make_project,
    parse_facts,
    processes_naming,
    ray_environ,
    run_uv,
    worker_facts,
    workers_running_uv,
)

LEAVE_S = 30.0  # a cluster's processes to be gone after its driver exited
MODES = ("hardlink", "copy")  # UV_LINK_MODE: uv's cache on the same disk, on another


# -- the switch --------------------------------------------------------------------------------

_SWITCH = '''"""Written by scripts/benchlib/uv_run.py: Ray nodes this venv's python starts run
runtime-env-agent (the benchmark's stand-in for `rtenv-agent ray enable`)."""
import importlib.machinery
import sys

# this checkout for every python of the venv (the driver imports agent.launcher); the agent's own
# dependencies only for the agent's process (`python -u -I -m agent ray-agent`): on the driver's
# path, aiohttp and grpcio would make Ray start a dashboard this venv cannot run
_argv = list(getattr(sys, "orig_argv", []))
_agent = any(_argv[i : i + 2] == ["-m", "agent"] for i in range(len(_argv)))
for _path in {paths!r}[: None if _agent else 1]:
    if _path not in sys.path:
        sys.path.append(_path)


class _AfterServices:
    """Once Ray's ``ray._private.services`` (which starts the raylet) is loaded,
    ``agent.ray.install()`` (which wraps its start_ray_process, nothing more)."""

    def find_spec(self, name, path=None, target=None):
        if name != "ray._private.services":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                import agent.ray

                agent.ray.install()

            spec.loader.exec_module = exec_module
        return spec


# not in Ray's own processes (its dashboard, monitors, workers: scripts in Ray's package, whose
# folder, first on their path, holds a module named agent): only a driver starts a raylet
if not _agent and not any("/site-packages/ray/" in _arg for _arg in _argv):
    sys.meta_path.insert(0, _AfterServices())
'''


def switch_ours(python: Path, root: Path) -> str:
    """Make the Ray nodes ``python`` (a project's venv) starts run this agent on ``root``; say
    how. ``rtenv-agent ray enable --python PYTHON --root ROOT`` (issue 30 item 3: the agent then
    runs from the installation of the python running the benchmark); in a checkout without it,
    a .pth of the benchmark's own in that venv: this checkout and this python's site-packages
    appended to its path, ``agent.ray.install()`` once Ray's services load."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    probe = [sys.executable, "-m", "agent", "ray", "enable", "--help"]
    done = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 0 and "--python" in done.stdout:
        command = [sys.executable, "-m", "agent", "ray", "enable", "--python", str(python),
                   "--root", str(root)]  # fmt: skip
        enabled = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        if enabled.returncode != 0:
            raise BenchError(f"rtenv-agent ray enable failed: {enabled.stderr[-1000:]}")
        return "rtenv-agent ray enable --python <project>/.venv/bin/python --root <root>"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    paths = [str(REPO), sysconfig.get_paths()["purelib"]]
    Path(site, "rtenv_bench_switch.py").write_text(_SWITCH.format(paths=paths))
    Path(site, "rtenv_bench_switch.pth").write_text("import rtenv_bench_switch\n")
    return "a .pth in each project's .venv: agent.ray.install() once Ray's services load"


# -- one round ---------------------------------------------------------------------------------


@dataclass
class Experiment:
    index: int
    project: Project
    ray_tmp: Path
    started: float = 0.0  # time.time() at its spawn
    ended: float = 0.0
    code: int | None = None
    stdout: str = ""
    stderr: str = ""
    facts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RoundRun:
    """What one round (one agent, one link mode, K experiments) measured."""

    agent: str
    mode: str
    experiments: list[Experiment]
    env_bytes: int  # experiment 1's .venv alone
    before_bytes: int  # the sample before the drivers started
    peak_bytes: int
    wall_s: float
    venvs: list[str]  # pyvenv.cfg folders under the Ray temp dirs and the agent's root
    processes_left: list[str]
    left_files: int  # files left under the Ray temp dirs' runtime_resources
    left_bytes: int
    all_left_bytes: int  # everything left under the Ray temp dirs (logs too)
    sockets_left: list[str]  # agent-*.sock files left in the agent's root
    root_bytes: int  # the agent's root after the drivers exit (its cache: kept on purpose)
    samples: int = 0
    longest_walk_s: float = 0.0

    @property
    def added_bytes(self) -> int:
        return max(0, self.peak_bytes - self.before_bytes)

    def first_tasks(self) -> list[float]:
        return [first_task_s(e.facts, e.started) for e in self.experiments if e.code == 0]

    def workers(self) -> int:
        return sum(len(worker_facts(e.facts)) for e in self.experiments)

    def workers_on_uv(self) -> int:
        return sum(len(workers_running_uv(e.facts)) for e in self.experiments)


def venvs_under(roots: Sequence[Path]) -> list[str]:
    """The venv folders (holding a ``pyvenv.cfg``) under ``roots``, sorted. Blocking."""
    found = []
    for root in roots:
        for folder, dirs, names in os.walk(root):
            if "pyvenv.cfg" in names:
                found.append(folder)
                dirs.clear()
    return sorted(found)


async def _drive(e: Experiment, env: dict[str, str], timeout_s: float) -> None:
    e.started = time.time()
    proc = await asyncio.create_subprocess_exec(
        *launch_command(), cwd=e.project.path, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):  # uv and the driver: a session of their own
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        err += f"\n(killed after {timeout_s:.0f}s)".encode()
    e.ended = time.time()
    e.code = proc.returncode
    e.stdout, e.stderr = out.decode(errors="replace"), err.decode(errors="replace")
    e.facts = parse_facts(e.stdout)


async def run_round(
    folder: Path, agent: str, mode: str, links: Sequence[Path], k: int, plant: bool,
    timeout_s: float, root: Path | None = None,
) -> tuple[RoundRun, str]:  # fmt: skip
    """One round in ``folder`` (short: Ray's socket paths live under it); (its run, how this
    agent was switched on, "" for stock). ``root``: this agent's root, an earlier round's (the
    user's next batch of experiments on the machine-wide root); default a new one."""
    cache, tmp = folder / "cache", folder / "tmp"
    root = folder / "root" if root is None else root
    for path in (cache, root, tmp):
        path.mkdir(parents=True, exist_ok=True)
    experiments: list[Experiment] = []
    how = ""
    for i in range(1, k + 1):
        ray_tmp = folder / f"r{i}"
        env = ray_environ(cache, ray_tmp, TMPDIR=str(tmp), UV_LINK_MODE=mode)
        version = "1.1" if plant and i == k else "1.0"
        first = experiments[0].project if experiments else None
        project = await asyncio.to_thread(
            make_project, folder / f"p{i}", links, env, big_version=version,
            note=f"experiment {i}", lock_from=first,
        )  # fmt: skip
        await asyncio.to_thread(run_uv, ["sync", "--offline"], project.path, env)
        if agent == "ours":
            how = await asyncio.to_thread(switch_ours, project.venv / "bin" / "python", root)
        experiments.append(Experiment(i, project, ray_tmp))
    measured = [cache, root, *(folder / f"r{i}" for i in range(1, k + 1)),
                *(e.project.venv for e in experiments)]  # fmt: skip
    env_bytes = await asyncio.to_thread(disk_bytes, [experiments[0].project.venv])
    sampler = Sampler(measured)
    before = await asyncio.to_thread(sampler.sample)
    sampler.peak = before
    sampler.start()
    envs = []
    for e in experiments:
        extra = {"RTENV_ROOT": str(root)} if agent == "ours" else {}
        envs.append(ray_environ(cache, e.ray_tmp, TMPDIR=str(tmp), UV_LINK_MODE=mode, **extra))
    started = time.time()
    try:
        await asyncio.gather(
            *(_drive(e, env, timeout_s) for e, env in zip(experiments, envs, strict=True))
        )
    finally:
        peak = await asyncio.to_thread(sampler.stop)
    wall = max(e.ended for e in experiments) - started
    left: list[str] = []
    for e in experiments:
        left += await asyncio.to_thread(leftover_processes, e.ray_tmp, LEAVE_S)
    left_files = left_bytes = all_left = 0
    for e in experiments:
        sessions = [s for s in e.ray_tmp.glob("ray/session_*") if not s.is_symlink()]
        for resources in (s / "runtime_resources" for s in sessions):
            files, size = await asyncio.to_thread(file_bytes, resources)
            left_files, left_bytes = left_files + files, left_bytes + size
        all_left += (await asyncio.to_thread(file_bytes, e.ray_tmp))[1]
    venvs = await asyncio.to_thread(venvs_under, [root, *(e.ray_tmp for e in experiments)])
    sockets = sorted(p.name for p in root.glob("agent-*.sock"))
    root_bytes = await asyncio.to_thread(disk_bytes, [root])
    run = RoundRun(
        agent, mode, experiments, env_bytes, before, peak, wall, venvs, left, left_files,
        left_bytes, all_left, sockets, root_bytes, sampler.samples, sampler.longest_walk_s,
    )  # fmt: skip
    return run, how


def outcome(run: RoundRun, big_bytes: int) -> Outcome:
    problems: list[str] = []
    for e in run.experiments:
        if e.code != 0:
            problems.append(f"experiment {e.index}: its driver exited {e.code}: "
                            f"{e.stderr[-800:]}")  # fmt: skip
            continue
        problems += [f"experiment {e.index}: {p}" for p in check_driver_facts(e.facts, big_bytes)]
        problems += [
            f"experiment {e.index}: {f['kind']} pid {f['pid']} imported bigdep "
            f"{f['bigdep_version']}, its project has {e.project.big_version}"
            for f in worker_facts(e.facts)
            if f["bigdep_version"] != e.project.big_version
        ]
    locks = {e.project.lock.read_bytes() for e in run.experiments}
    firsts = run.first_tasks()
    return Outcome(
        agent=run.agent, mode=run.mode, experiments=len(run.experiments),
        distinct_locks=len(locks), problems=tuple(problems), workers=run.workers(),
        workers_on_uv=run.workers_on_uv(), venvs=len(run.venvs),
        processes_left=len(run.processes_left), env_bytes=run.env_bytes,
        added_bytes=run.added_bytes, wall_s=run.wall_s,
        first_task_s=statistics.median(firsts) if firsts else float("nan"),
        left_bytes=run.left_bytes,
    )  # fmt: skip


def short_base(work: Path, prefix: str = "ur") -> Path:
    """A folder for the rounds short enough for Ray's socket paths under it (a session's
    ``sockets/plasma_store`` adds ~70 bytes to RAY_TMPDIR; the limit is 107): under ``work``
    when that is short, else under /tmp."""
    parent = work if len(os.fsencode(str(work))) <= 24 else Path("/tmp")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def _note(run: RoundRun, how: str) -> str:
    mib = 2**20
    firsts = ", ".join(f"{t:.1f}" for t in run.first_tasks())
    # the rounds' base: a next batch uses an earlier round's root
    top = run.experiments[0].project.path.parent.parent
    places = [Path(v).relative_to(top).parts for v in run.venvs]
    where = [f"{p[0]}/{p[-2] if len(p) > 2 else ''}" for p in places]  # r1/_ray_pkg_..., root/...
    said = (
        f"{run.agent}, {run.mode}: wall {run.wall_s:.1f}s; first task {firsts}s; disk before "
        f"{run.before_bytes / mib:.0f} MiB, peak {run.peak_bytes / mib:.0f} MiB, added "
        f"{run.added_bytes / mib:.0f} MiB, one env {run.env_bytes / mib:.0f} MiB "
        f"({run.samples} samples, longest walk {run.longest_walk_s:.2f}s); workers on uv "
        f"{run.workers_on_uv()} of {run.workers()}; venvs {len(run.venvs)}: "
        f"{', '.join(where[:6])} (/.venv); left after the drivers: {run.left_files} files "
        f"({run.left_bytes / mib:.1f} MiB) in runtime_resources, "
        f"{run.all_left_bytes / mib:.1f} MiB in all, {len(run.processes_left)} processes, "
        f"{len(run.sockets_left)} agent sockets in the root; the agent's root after "
        f"{run.root_bytes / mib:.0f} MiB"
    )
    return said + (f"; switched on by {how}" if how else "")


async def bench_uv_run(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("uv-run")
    k, plant = sizes.uv_run_experiments, sizes.uv_run_plant
    base = short_base(work)
    try:
        house = await asyncio.to_thread(ray_wheelhouse)
        built = "found ready" if house.built_s is None else f"built in {house.built_s:.1f}s"
        result.notes.append(f"Ray's wheelhouse ({len(house.wheels)} wheels) {built}: {house.path}")
        links = base / "links"
        big_bytes = int(sizes.uv_run_big_mib * 2**20)
        for version, seed in (("1.0", 0), ("1.1", 1)):
            await asyncio.to_thread(big_wheel, links, sizes.uv_run_big_mib, version=version,
                                    seed=seed)  # fmt: skip
        bad: list[str] = []
        warm_walls: dict[str, float] = {}
        for n, mode in enumerate(MODES):
            outcomes: dict[str, Outcome] = {}
            order = ("ray", "ours") if n % 2 == 0 else ("ours", "ray")  # interleaved
            for agent in order:
                folder = base / f"{mode[0]}{agent[0]}"
                who = "Ray's agent" if agent == "ray" else "this agent"
                print(f"[uv-run] {mode}, {who}: {k} experiments", flush=True)
                run, how = await run_round(folder, agent, mode, [house.path, links], k, plant,
                                           sizes.phase_timeout_s)  # fmt: skip
                outcomes[agent] = outcome(run, big_bytes)
                result.notes.append(_note(run, how))
                m = Measure(f"{agent}, {mode}: {k} experiments", wall_s=run.wall_s, requests=k)
                m.latencies_s = run.first_tasks()
                result.measures.append(m)
                if agent == "ours":  # the user's next batch, on the same machine-wide root
                    again = base / f"{mode[0]}w"
                    print(f"[uv-run] {mode}, this agent, next batch on its root", flush=True)
                    warm, _ = await run_round(again, agent, mode, [house.path, links], k,
                                              plant, sizes.phase_timeout_s,
                                              root=folder / "root")  # fmt: skip
                    bad += [f"next batch: {p}" for p in broken(outcome(warm, big_bytes))]
                    warm_walls[mode] = warm.wall_s
                    result.notes.append("next batch on the same root: " + _note(warm, ""))
                    m = Measure(f"ours, {mode}: {k} experiments, next batch on the same root",
                                wall_s=warm.wall_s, requests=k)  # fmt: skip
                    m.latencies_s = warm.first_tasks()
                    result.measures.append(m)
                    await asyncio.to_thread(shutil.rmtree, again, True)
                await asyncio.to_thread(shutil.rmtree, folder, True)
            stock, ours = outcomes["ray"], outcomes["ours"]
            bad += broken(stock) + broken(ours)
            result.notes.append(
                f"{mode}: the next batch on this agent's root (its venv built, its cache warm): "
                f"wall {warm_walls[mode]:.1f}s, {warm_walls[mode] / stock.wall_s:.2f}x Ray's "
                "first (Ray's agent builds its workers' venvs anew in every session)"
            )
            rows = figures(result, stock, ours)
            result.notes += misses(rows, ours, plant)
            result.notes.append(f"{mode}: this agent's mode: {mode_of(ours) or 'mixed'}")
        if plant:
            result.notes.append(f"--plant: experiment {k}'s project depends on bigdep 1.1 (its "
                                "own lock): one venv for all is impossible")  # fmt: skip
        result.notes.append(
            "first task: from the driver's spawn (uv run) to its first task's result; peak disk "
            "added: the peak over the run of the Ray temp dirs, the agent's root, uv's cache and "
            "the projects' .venv (allocated bytes, each inode once), minus the same before the "
            "drivers started (their own .venv already synced)"
        )
        if bad:
            raise BenchError("the uv-run oracle: " + "; ".join(bad) + "\nnotes:\n"
                             + "\n".join(result.notes))  # fmt: skip
    finally:  # whatever happened: nothing of a cluster goes on running, then the files go
        await asyncio.to_thread(kill_all, processes_naming(base))
        await asyncio.to_thread(shutil.rmtree, base, True)
    return result
