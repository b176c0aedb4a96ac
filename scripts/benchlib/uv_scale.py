"""uv-scale (run only when named: ``--only uv-scale``): issue 39's user at scale. K = 5
experiments at once, each a project folder whose ``pyproject.toml`` depends on Ray and a real
many-file stack from the package index (numpy, scipy, pandas, scikit-learn; ``--heavy`` adds
torch with its CUDA wheels), each driver an unmodified bare ``ray.init()`` started with ``uv
run --offline python launch.py`` whose tasks import the stack (``benchlib/uv_scale_project.py``).
Offline: Ray's wheelhouse repacked from this venv and the stack's wheels, downloaded once into
a folder of this user's and kept (``benchlib/stack_wheelhouse.py``). With the light stack uv
copies (``UV_LINK_MODE=copy``: its cache on another disk, the case where the disk fills); with
``--heavy`` it hardlinks (its cache on the same disk), because copies do not fit a machine: on
2026-12-07 a copying heavy run at K=3 filled 77 GB in stock Ray's first round (each of its workers
copied the 5.7 GB env into its Ray temp dir, and the projects' own venvs were copies too).
``FLOOR``: a round that takes the machine's free space below it is stopped (its clusters killed
by pid) and the run fails saying so, before the disk fills.

For each agent (stock Ray's, and this one switched on as the uv-run workload does, by
``uv_run.switch_ours``) the K projects are made and their own ``.venv`` synced (the user's
driver env, before the clock), then uv's cache is emptied: round 1 is cold. Three rounds on ONE
root (the same projects, Ray temp dirs, uv cache and agent root), the agents' rounds
interleaved; in round 2, once their first task reported, experiment 1's driver and experiment
2's raylet are SIGKILLed, and each is relaunched once it has ended
(``benchlib/uv_scale_round.py``). Measured per round, both agents: the disk under the agent's
folder (sampled, each inode once), every attempt's time to first task and failed tasks, the
CPU seconds of every cluster's processes by role (sampled from /proc: ``benchlib/proc_cpu.py``),
the workers that never registered (their raylets' logs), what is left in the Ray temp dirs'
``runtime_resources`` and of the agent in its root. The oracle is ``benchlib/uv_scale_oracle``.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchlib.config import Sizes
from benchlib.disk_sampler import Sampler, disk_bytes, file_bytes
from benchlib.figures import Measure, WorkloadResult
from benchlib.proc_cpu import CpuSampler, Proc, by_role
from benchlib.procs import BenchError
from benchlib.stack_wheelhouse import HEAVY_MODULES, MODULES, StackHouse, stack_wheelhouse
from benchlib.uv_run import short_base, switch_ours, venvs_under
from benchlib.uv_scale_oracle import (
    KILLED,
    KILLED_DRIVER,
    KILLED_RAYLET,
    Attempt,
    Round,
    Run,
    broken,
    figures,
    misses,
)
from benchlib.uv_scale_project import (
    LAUNCH,
    failures,
    first_task_at,
    worker_executables,
    wrong_versions,
)
from benchlib.uv_scale_round import (
    Experiment,
    agent_leftovers,
    run_round,
    sessions,
    unregistered,
)
from benchlib.uv_scale_round import Run as Attempted
from tests.harness.ray_wheelhouse import ray_wheelhouse, user_base
from tests.harness.uv_projects import (
    kill_all,
    make_project,
    processes_naming,
    ray_environ,
    run_uv,
    worker_facts,
    workers_running_uv,
)

ROUNDS = 3
LINK_MODES = {False: "copy", True: "hardlink"}  # UV_LINK_MODE, by --heavy (see above)
FLOOR = 10 * 2**30  # free bytes a round keeps on the machine, or it is stopped
_FLOOR_PERIOD_S = 1.0
KILLS = {1: KILLED_DRIVER, 2: KILLED_RAYLET}  # in round 2: experiment -> what is killed


@dataclass
class Side:
    """One agent's folder, experiments and what its rounds measured."""

    agent: str
    folder: Path
    experiments: list[Experiment]
    root: Path
    sampler_roots: list[Path]
    env_bytes: int = 0
    before_bytes: int = 0
    peak_bytes: int = 0
    rounds: list[Round] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    executables: set[str] = field(default_factory=set)  # its workers' pythons so far


async def _setup(
    folder: Path, agent: str, links: Sequence[Path], house: StackHouse, k: int, plant: bool
) -> Side:
    """The agent's K projects, their .venv synced, uv's cache then emptied; this agent
    switched on in each venv."""
    cache, root, tmp = folder / "cache", folder / "root", folder / "tmp"
    for path in (cache, root, tmp):
        path.mkdir(parents=True, exist_ok=True)
    modules = ",".join(HEAVY_MODULES if "torch==" in " ".join(house.pins) else MODULES)
    experiments: list[Experiment] = []
    for i in range(1, k + 1):
        ray_tmp = folder / f"r{i}"
        extra = {"RTENV_ROOT": str(root)} if agent == "ours" else {}
        link = LINK_MODES["torch==" in " ".join(house.pins)]
        env = ray_environ(cache, ray_tmp, TMPDIR=str(tmp), UV_LINK_MODE=link,
                          SCALE_MODULES=modules, **extra)  # fmt: skip
        first = experiments[0].project if experiments else None
        project = await asyncio.to_thread(
            make_project, folder / f"p{i}", links, env, big_version="stack",
            note=f"experiment {i}", lock_from=first, requires=house.pins, launch=LAUNCH,
        )  # fmt: skip
        await asyncio.to_thread(run_uv, ["sync", "--offline"], project.path, env, 1800)
        if agent == "ours":
            await asyncio.to_thread(switch_ours, project.venv / "bin" / "python", root)
        uv_args = ("--locked",) if plant and i == k else ()
        experiments.append(Experiment(i, project, ray_tmp, env, uv_args))
    await asyncio.to_thread(run_uv, ["cache", "clean"], folder, experiments[0].env)
    roots = [cache, root, *(e.ray_tmp for e in experiments),
             *(e.project.venv for e in experiments)]  # fmt: skip
    side = Side(agent, folder, experiments, root, roots)
    side.env_bytes = await asyncio.to_thread(disk_bytes, [experiments[0].project.venv])
    side.before_bytes = await asyncio.to_thread(disk_bytes, roots)
    return side


def _attempt(run: Attempted, side: Side, pins: Sequence[str]) -> Attempt:
    at = first_task_at(run.facts)
    kinds = [f.get("kind") for f in run.facts]
    workers = worker_facts(run.facts)
    problems = wrong_versions(run.facts, pins)
    return Attempt(
        experiment=run.experiment.index, kind=run.kind, code=run.code, done="done" in kinds,
        tasks=kinds.count("task"), failures=tuple(failures(run.facts)),
        first_task_s=None if at is None else at - run.started, problems=tuple(problems),
        workers=len(workers), workers_on_uv=len(workers_running_uv(run.facts)),
        reused=bool(workers) and worker_executables(run.facts) <= side.executables,
        kill_landed=run.kill_landed,
    )  # fmt: skip


async def _round(side: Side, index: int, pins: Sequence[str], sizes: Sizes) -> str:
    """Run round ``index`` of ``side``; its note."""
    before = {e.index: await asyncio.to_thread(sessions, e.ray_tmp) for e in side.experiments}
    disk = Sampler(side.sampler_roots)
    disk.peak = side.before_bytes
    places = {f"e{e.index}": e.ray_tmp for e in side.experiments}
    cpu = CpuSampler({**places, "root": side.root})
    disk.start()
    cpu.start()
    try:
        kills = KILLS if index == 2 else {}
        rounds = asyncio.ensure_future(
            run_round(side.experiments, kills, sizes.phase_timeout_s, sizes.uv_scale_stagger_s)
        )
        floor = asyncio.ensure_future(_floor_crossed(side.folder, sizes.phase_timeout_s * 4))
        await asyncio.wait({rounds, floor}, return_when=asyncio.FIRST_COMPLETED)
        if not rounds.done():
            rounds.cancel()
            await asyncio.to_thread(kill_all, processes_naming(side.folder))
            raise BenchError(
                f"{side.agent}, round {index}: stopped with {floor.result() / 2**30:.1f} GiB "
                f"free on the machine (the floor is {FLOOR / 2**30:.0f} GiB), before its disk "
                f"filled; disk added so far +{(disk.peak - side.before_bytes) / 2**30:.1f} GiB "
                f"(one env {side.env_bytes / 2**30:.1f} GiB)"
            )
        floor.cancel()
        runs = rounds.result()
    finally:
        side.peak_bytes = max(side.peak_bytes, await asyncio.to_thread(disk.stop))
        procs = await asyncio.to_thread(cpu.stop)
    attempts = [_attempt(r, side, pins) for r in runs]
    for r in runs:
        side.executables |= worker_executables(r.facts)
    fresh = {e.index: sorted(await asyncio.to_thread(sessions, e.ray_tmp) - before[e.index])
             for e in side.experiments}  # fmt: skip
    unreg = left_bytes = left_files = 0
    for e in side.experiments:
        unreg += await asyncio.to_thread(unregistered, e.ray_tmp, fresh[e.index])
        for name in fresh[e.index]:
            files, size = await asyncio.to_thread(
                file_bytes, e.ray_tmp / "ray" / name / "runtime_resources"
            )
            left_files, left_bytes = left_files + files, left_bytes + size
    left_agent = await asyncio.to_thread(agent_leftovers, side.root)
    left_procs = sum(len(r.processes_left) for r in runs if r.kind not in KILLED)
    rnd = Round(index, tuple(attempts), unreg, left_bytes, tuple(left_agent), left_procs)
    side.rounds.append(rnd)
    return _note(side, rnd, runs, procs, left_files)


async def _floor_crossed(folder: Path, limit_s: float) -> int:
    """Once the free space of ``folder``'s file system is below ``FLOOR``: the free bytes then.
    Checked every ``_FLOOR_PERIOD_S`` for at most ``limit_s`` (then it waits no more)."""
    for _ in range(int(limit_s / _FLOOR_PERIOD_S) + 1):
        free = (await asyncio.to_thread(shutil.disk_usage, folder)).free
        if free < FLOOR:
            return free
        await asyncio.sleep(_FLOOR_PERIOD_S)
    await asyncio.Event().wait()  # past the limit: the round's own timeouts end it
    return 0


def _note(side: Side, rnd: Round, runs: list[Attempted], procs: list[Proc], files: int) -> str:
    mib = 2**20
    cpu = by_role(procs)
    workers = sorted((p.cpu_s for p in procs if p.role == "worker"), reverse=True)
    reported: dict[tuple[int, int], float] = {}  # (attempt, worker pid) -> its getrusage
    for n, r in enumerate(runs):
        for f in worker_facts(r.facts):
            key = (n, int(f["pid"]))
            reported[key] = max(reported.get(key, 0.0), float(f.get("cpu_s", 0.0)))
    firsts = ", ".join(
        f"e{a.experiment}{'' if a.kind == 'run' else '(' + a.kind + ')'} "
        + ("-" if a.first_task_s is None else f"{a.first_task_s:.1f}")
        for a in rnd.attempts
    )
    fails = [f"e{a.experiment} {a.kind}: {f}" for a in rnd.attempts for f in a.failures]
    ended = [f"e{r.experiment.index} {r.kind} exit {r.code} ({_last_line(r.stderr)})"
             for r in runs if r.code != 0]  # fmt: skip
    left = [f"e{r.experiment.index} {r.kind}: {len(r.processes_left)}" for r in runs
            if r.processes_left]  # fmt: skip
    reused = [f"e{a.experiment}: {'reused' if a.reused else 'new'}" for a in rnd.attempts
              if a.kind == "relaunch"]  # fmt: skip
    return (
        f"{side.agent}, round {rnd.index}: first task (s) {firsts}; drivers not exiting 0: "
        f"{'; '.join(ended) or 'none'}; tasks failed: {len(fails)} ({'; '.join(fails[:6])}); "
        f"CPU s: workers {cpu['worker']:.1f} ({len(workers)} workers, max "
        f"{workers[0] if workers else 0:.1f}; as the {len(reported)} that ran a task report "
        f"their own: {sum(reported.values()):.1f}), their setup and uv run "
        f"{cpu['worker-uv']:.1f}, raylets "
        f"{cpu['raylet']:.1f}, GCS {cpu['gcs']:.1f}, agents {cpu['agent']:.1f}, other Ray "
        f"{cpu['other']:.1f}; unregistered workers {rnd.unregistered}; left: "
        f"{files} files ({rnd.left_runtime_bytes / mib:.0f} MiB) in runtime_resources, the "
        f"agent's {list(rnd.left_agent)[:6]}, processes {'; '.join(left) or 'none'}; relaunch "
        f"{', '.join(reused) or '-'}; disk peak so far +"
        f"{(side.peak_bytes - side.before_bytes) / mib:.0f} MiB (one env "
        f"{side.env_bytes / mib:.0f})"
    )


def _last_line(text: str) -> str:
    """A failed driver's reason: the last line of its stderr, short."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _run_of(side: Side, plant: bool) -> Run:
    locks = {e.project.lock.read_bytes() for e in side.experiments}
    roots = [side.root, *(e.ray_tmp for e in side.experiments)]
    return Run(
        agent=side.agent, experiments=len(side.experiments), distinct_locks=len(locks),
        env_bytes=side.env_bytes, added_bytes=max(0, side.peak_bytes - side.before_bytes),
        venvs=len(venvs_under(roots)), rounds=tuple(side.rounds), planted=plant,
    )  # fmt: skip


async def bench_uv_scale(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("uv-scale")
    k, plant, heavy = sizes.uv_scale_experiments, sizes.uv_scale_plant, sizes.uv_scale_heavy
    base = short_base(work, "us")
    try:
        ray_house = await asyncio.to_thread(ray_wheelhouse)
        house = await asyncio.to_thread(stack_wheelhouse, user_base(), heavy)
        filled = "found ready" if house.filled_s is None else f"filled in {house.filled_s:.0f}s"
        result.notes.append(f"the stack {' '.join(house.pins)}: {len(house.wheels)} wheels, "
                            f"{filled}: {house.path}")  # fmt: skip
        links = [ray_house.path, house.path]
        sides: dict[str, Side] = {}
        for agent in ("ray", "ours"):
            print(f"[uv-scale] {agent}: {k} projects, their .venv synced", flush=True)
            sides[agent] = await _setup(base / agent[0], agent, links, house, k, plant)
        for index in range(1, ROUNDS + 1):
            order = ("ray", "ours") if index % 2 else ("ours", "ray")  # interleaved
            for agent in order:
                print(f"[uv-scale] round {index}, {agent}: {k} experiments", flush=True)
                note = await _round(sides[agent], index, house.pins, sizes)
                print(f"[uv-scale] {note}", flush=True)
                result.notes.append(note)
        stock, ours = _run_of(sides["ray"], plant), _run_of(sides["ours"], plant)
        for run in (stock, ours):
            for rnd in run.rounds:
                m = Measure(f"{run.agent}, round {rnd.index}: {k} experiments", requests=k)
                m.latencies_s = rnd.firsts()
                m.errors = sum(len(a.failures) for a in rnd.attempts)
                result.measures.append(m)
        rows = figures(result, stock, ours)
        result.notes += misses(rows, ours)
        for run in (stock, ours):
            result.notes.append(
                f"{run.agent}: venvs {run.venvs}; expected failures (killed): "
                f"{run.expected_failures()[:4]}; unexpected: {run.unexpected_failures()[:4]}; "
                f"warm first-task median {run.first_task(True):.1f}s, cold "
                f"{run.first_task(False):.1f}s, one env {run.env_bytes / 2**20:.0f} MiB"
            )
        if plant:
            result.notes.append(f"--plant: experiment {k}'s line is uv run --offline --locked")
        bad = broken(stock) + broken(ours)
        if bad:
            raise BenchError("the uv-scale oracle: " + "; ".join(bad) + "\nnotes:\n"
                             + "\n".join(result.notes))  # fmt: skip
    finally:  # nothing of a cluster goes on running, then the files go
        await asyncio.to_thread(kill_all, processes_naming(base))
        await asyncio.to_thread(shutil.rmtree, base, True)
    return result
