"""``raylet-sim demo``: a whole node on this machine, and the proof that nothing leaked.

Sample packages are built and served on 127.0.0.1; the agent starts as the node's sidecar; a
seeded workload of tasks over a few dozen envs that share packages runs on real worker
processes, each importing its env's py_modules and reading its working dir. The summary checks
every result, and after the node drains, that every count is back to 0 and no file is left over.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raylet_sim.interrupt import Interrupt
from raylet_sim.node import AgentDied, Node
from raylet_sim.pool import TaskFailed, TaskSpec
from raylet_sim.removal import remove_detached, remove_tree
from raylet_sim.samples import PackageServer, Samples, build_samples
from raylet_sim.sidecar import SidecarError
from rtenv.v1 import agent_pb2


class Output(Protocol):
    """Where the demo writes: a text stream (stdout, or a closed pipe's quiet stand-in)."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def isatty(self) -> bool: ...


# Idle workers kept at most (the pool stops the one idle longest beyond): the default workload's
# 36 envs keep about 60, so it reuses them as before; a workload over many more envs cannot pile
# up a worker per env (the demo's processes: --concurrency busy workers, these, the agent).
MAX_IDLE_WORKERS = 64


@dataclass
class Outcome:
    done: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    wrong: int = 0
    pids: set[int] = field(default_factory=set)
    envs_used: set[int] = field(default_factory=set)


class Progress:
    """A progress bar on a terminal; a line per tenth of the work elsewhere."""

    def __init__(self, total: int, out: Output) -> None:
        self._total = total
        self._out = out
        self._tty = out.isatty()
        self._started = time.monotonic()
        self._last_tenth = -1

    def update(self, finished: int, workers: int) -> None:
        width = 30
        filled = width * finished // max(self._total, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{self._total} tasks, "
            f"{workers} workers, {time.monotonic() - self._started:.1f}s"
        )
        if self._tty:
            self._out.write("\r" + line)
            if finished == self._total:
                self._out.write("\n")
        elif (tenth := 10 * finished // max(self._total, 1)) != self._last_tenth:
            self._last_tenth = tenth
            self._out.write(line + "\n")
        self._out.flush()


async def _workload(
    node: Node, samples: Samples, tasks: int, concurrency: int, seed: int, out: Output
) -> Outcome:
    rng = random.Random(seed)
    outcome = Outcome()
    progress = Progress(tasks, out)
    assert node.pool is not None
    pool = node.pool
    # shared: `concurrency` runners take the next task each, and its env drawn then (the plan
    # is never held: a run of many tasks over many envs costs no memory for it)
    plan = ((index, rng.randrange(len(samples.envs))) for index in range(tasks))

    async def runner() -> None:
        for index, env_index in plan:
            env = samples.envs[env_index]
            outcome.envs_used.add(env_index)
            try:
                result = await node.run(
                    TaskSpec(env.serialized, "task:run", (index,)), task_id=str(index)
                )
            except TaskFailed as exc:
                outcome.failed[exc.status] = outcome.failed.get(exc.status, 0) + 1
            else:
                outcome.pids.add(result.pop("pid"))
                if result == env.expected(index, samples.values):
                    outcome.done += 1
                else:
                    outcome.wrong += 1
            progress.update(
                outcome.done + outcome.wrong + sum(outcome.failed.values()), len(pool.workers)
            )

    # gather, not a TaskGroup: AgentDied must reach run_demo as itself, not in a group
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return outcome


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _mib(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


async def run_demo(
    args: argparse.Namespace, out: Output = sys.stdout, interrupt: Interrupt | None = None
) -> int:
    """Run the demo; return the process exit code (0 only if everything checked out). Whatever
    happens (a failure, a Ctrl-C through ``interrupt``), a temp workdir it made is removed: here,
    or, after a stop signal, by a detached process (``remove_detached``) that
    ``interrupt.aftermath`` names, so that the stop is prompt however much the run cached."""
    made = not args.workdir
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="raylet-"))
    try:
        code = await _run_in(workdir, args, out, interrupt)
    finally:
        if not made or args.keep:
            if interrupt is not None:
                interrupt.aftermath = f"its workdir kept: {workdir}"
        elif interrupt is not None and interrupt.fired:
            remover = await asyncio.to_thread(remove_detached, workdir)
            interrupt.aftermath = (
                "its temp files removed"
                if remover is None
                else f"its temp files are being removed by process {remover.pid}"
            )
        else:
            await asyncio.to_thread(remove_tree, workdir)
    if args.keep:
        print(f"kept {workdir}", file=out)
    return code


async def _run_in(
    workdir: Path, args: argparse.Namespace, out: Output, interrupt: Interrupt | None
) -> int:
    await asyncio.to_thread(workdir.mkdir, exist_ok=True)  # in a folder that exists
    root = workdir / "agent-root"
    server = PackageServer()
    await server.start()
    samples = build_samples(
        args.envs, server.base_url, seed=args.seed, filler_bytes=args.package_kib * 1024
    )
    server.made = samples.packages
    started = time.monotonic()
    node = Node(
        root,
        idle_timeout_s=args.idle_timeout,
        agent_args=["--log-level", "WARNING"],
        max_idle_workers=MAX_IDLE_WORKERS,
    )
    if interrupt is not None:
        interrupt.on_interrupt(node.interrupt)
    try:
        await node.start()
        print(
            f"node up: agent pid {node.sidecar.pid} on {node.sidecar.address}; "
            f"{len(samples.packages)} packages on {server.base_url}; "
            f"{args.tasks} tasks over {args.envs} envs, concurrency {args.concurrency}",
            file=out,
        )
        outcome = await _workload(node, samples, args.tasks, args.concurrency, args.seed, out)
        assert node.pool is not None
        assert node.client is not None
        pool, client = node.pool, node.client
        busy = await client.info()
        await pool.close()  # every worker exits; the pool deletes each env as its last goes
        after = await client.info()
        leftovers = _disk_leftovers(root, after)
    except AgentDied as exc:
        print(f"raylet-sim: {exc}", file=sys.stderr)
        return 3
    except SidecarError as exc:
        print(f"raylet-sim: the node could not start: {exc}", file=sys.stderr)
        return 1
    finally:
        await node.stop()
        await server.stop()
    elapsed = time.monotonic() - started
    ok = _summary(out, args, samples, server, outcome, pool, busy, after, leftovers, elapsed)
    return 0 if ok else 1


def _disk_leftovers(root: Path, info: agent_pb2.GetRuntimeEnvsInfoReply) -> list[str]:
    """Files the agent's state does not account for: package dirs without an entry, staging
    (inside the agent's own folder under tmp/: each agent of a root stages in one of its own)."""
    known = {Path(u.local_path).name for u in info.uris if u.local_path}
    stray = [f"uris/{p.name}" for p in (root / "uris").iterdir() if p.name not in known]
    for own in (root / "tmp").iterdir():
        inside = list(own.iterdir()) if own.is_dir() else [own]
        stray += [f"tmp/{own.name}/{p.name}" if p != own else f"tmp/{p.name}" for p in inside]
    return stray


def _summary(
    out: Output, args: argparse.Namespace, samples: Samples, server: PackageServer,
    outcome: Outcome, pool: Any, busy: agent_pb2.GetRuntimeEnvsInfoReply,
    after: agent_pb2.GetRuntimeEnvsInfoReply, leftovers: list[str], elapsed: float,
) -> bool:  # fmt: skip
    stats = pool.stats
    fetched = {name: n for name, n in server.gets.items() if name in samples.packages}
    once = all(n == 1 for n in fetched.values())
    size = samples.unpacked_bytes
    own_copies = sum(
        size(env.working_dir) + sum(size(m) for m in env.py_modules)
        for env in (samples.envs[i] for i in outcome.envs_used)
    )
    on_disk = after.cache.used_bytes + after.cache.unused_bytes
    lat = stats.create_latencies_s
    leaked_refs = [u.uri for u in after.uris if u.references] + [
        e.runtime_env_id for e in after.envs if e.references
    ]
    failed = sum(outcome.failed.values())
    lines = [
        "",
        f"tasks        {outcome.done} done, {failed} failed"
        + (f" {dict(outcome.failed)}" if failed else "")
        + (f", {outcome.wrong} WRONG RESULTS" if outcome.wrong else "")
        + f", in {elapsed:.1f}s ({args.tasks / elapsed:.0f} tasks/s)",
        f"workers      {stats.workers_started} started ({len(outcome.pids)} ran tasks), "
        f"{stats.workers_exited} exited; idle workers reused for "
        f"{args.tasks - stats.workers_started} tasks",
        # an env is created again when a task needs it after its last worker exited
        f"envs         {len(outcome.envs_used)} distinct, {stats.creates} create calls, "
        f"{busy.total_envs} live before the drain, {stats.deletes} delete calls",
        f"downloads    {sum(fetched.values())} GETs for {len(fetched)} packages: "
        + ("each downloaded once" if once else f"REPEATED {fetched}"),
        f"cache        {after.cache.hits} hits, {after.cache.downloads} installs, "
        f"{after.cache.evictions} evictions",
        f"disk         {_mib(on_disk)} on disk, against {_mib(own_copies)} if every env had its "
        f"own copy ({own_copies / max(on_disk, 1):.1f}x saved)",
        f"create       p50 {_percentile(lat, 0.5) * 1000:.0f} ms, "
        f"p99 {_percentile(lat, 0.99) * 1000:.0f} ms over {len(lat)} creates",
        f"references   {'all 0' if not leaked_refs else f'LEAKED {leaked_refs}'} "
        f"({after.total_envs} envs left at the agent, {len(pool.slots)} slots in the pool)",
        f"files        {'nothing stray' if not leftovers else f'LEFT OVER {leftovers}'} "
        f"({len(after.uris)} packages cached, unused, within the budget)",
    ]
    print("\n".join(lines), file=out)
    return (
        failed == 0 and outcome.wrong == 0 and once and not leaked_refs and not leftovers
        and after.total_envs == 0 and not pool.slots
    )  # fmt: skip
