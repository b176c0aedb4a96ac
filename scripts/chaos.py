"""Chaos: drive a node through a seeded, violent workload and prove nothing is lost.

A raylet_sim node (pool + agent sidecar) runs rounds of tasks over envs that share packages,
with a cache budget small enough that eviction runs all the time. Workers run in watch mode:
they keep re-hashing their packages and report any file that vanished or changed. Meanwhile a
monkey SIGKILLs workers (busy ones mid-request, and ones that have just started), cancels pops
while their create is in flight, and SIGKILLs the agent at random instants; then the node is
down (the pool exits with it) and the runner starts a new one on the same root, as a supervisor
would. The package server is slow, answers 500, resets connections and corrupts bodies for some
requests.

After every round the invariants are checked against GetRuntimeEnvsInfo, the pool's table, the
disk and state.db; after the last, every count must be 0. Any violation fails the run (exit 1).
The seed is printed; ``--seed`` replays the same plan.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from raylet_sim.cli import shown
from raylet_sim.interrupt import EXIT_INTERRUPTED, Interrupt
from raylet_sim.node import AgentDied, Node
from raylet_sim.pool import (
    ENV_SETUP_FAILED,
    WORKER_DIED,
    WORKER_START_FAILED,
    TaskFailed,
    TaskSpec,
    WorkerState,
)
from raylet_sim.samples import EnvSpec, PackageServer, build_samples
from rtenv.v1 import agent_pb2

# -- the package server ---------------------------------------------------------------------


class ChaosServer(PackageServer):
    """The demo's package server, with faults drawn from a seeded generator per request."""

    def __init__(self, rng: random.Random, fault_rate: float) -> None:
        super().__init__()
        self.faults: Counter[str] = Counter()
        self._rng = rng
        self._fault_rate = fault_rate

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.gets[name] += 1
        body = self.packages[name]
        fault = self._rng.choice(["slow", "500", "reset", "corrupt"])
        if self._rng.random() >= self._fault_rate:
            fault = "none"
        self.faults[fault] += 1
        if fault == "500":
            return web.Response(status=500, text="injected")
        if fault == "corrupt":
            data = bytearray(body)
            for i in range(40, min(len(data), 140)):
                data[i] ^= 0xA5
            return web.Response(body=bytes(data))
        response = web.StreamResponse(headers={"Content-Length": str(len(body))})
        half = len(body) // 2
        try:
            await response.prepare(request)
            await response.write(body[:half])
            if fault == "reset":
                assert request.transport is not None
                request.transport.abort()  # the connection dies mid-body
                return response
            if fault == "slow":
                await asyncio.sleep(self._rng.uniform(0.05, 0.4))
            await response.write(body[half:])
            await response.write_eof()
        except ConnectionError:
            pass  # the agent gave up on this download (or died): nothing to answer
        return response


# -- tallies --------------------------------------------------------------------------------


@dataclass
class Tally:
    seed: int
    rounds: int = 0
    tasks_ok: int = 0
    tasks_failed: Counter[str] = field(default_factory=Counter)
    workers_started: int = 0
    workers_killed: int = 0
    pops_cancelled: int = 0
    agent_kills: int = 0
    restarts: int = 0
    downloads: int = 0
    evictions: int = 0
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    killed_pids: set[int] = field(default_factory=set)  # every worker the monkey SIGKILLed

    def summary(self, faults: Counter[str]) -> str:
        return "\n".join(
            [
                f"seed {self.seed}: {self.rounds} rounds in {self.seconds:.1f}s",
                f"tasks        {self.tasks_ok} ok, failed by status {dict(self.tasks_failed)}",
                f"workers      {self.workers_started} started, {self.workers_killed} killed",
                f"pops         {self.pops_cancelled} cancelled mid-create",
                f"agent        {self.agent_kills} SIGKILLs, {self.restarts} restarts",
                f"packages     {self.downloads} installs, {self.evictions} evictions",
                f"faults       {dict(faults)}",
                f"checks       {self.checks} invariant checks",
                f"violations   {len(self.violations)}",
                *(f"  - {v}" for v in self.violations[:20]),
            ]
        )


# -- the oracle -----------------------------------------------------------------------------


def unexplained(
    failure: TaskFailed, *, killed_pids: set[int], agent_killed: bool, faults_injected: bool
) -> str | None:
    """Why a failed task is a violation, or None when the run's own violence explains it.

    A worker's death is explained only by the monkey's SIGKILL of that very worker; a start
    that failed, by that or by the agent's death; an env that could not be set up, by an
    injected download fault or the agent's death. Anything else (a task that raised: its env
    was not whole; a spawn that failed) is a bug the run found."""
    pid = failure.pid
    killed = pid is not None and pid in killed_pids
    if failure.status == WORKER_DIED and killed:
        return None
    if failure.status == WORKER_START_FAILED and (killed or agent_killed):
        return None
    if failure.status == ENV_SETUP_FAILED and (faults_injected or agent_killed):
        return None
    if failure.status == WORKER_DIED:
        return f"worker {pid}, which nobody killed, died under it: {failure.message}"
    return f"{failure.status} that no kill or injected fault explains: {failure.message}"


# -- the run --------------------------------------------------------------------------------


@dataclass
class Plan:
    envs: list[EnvSpec]
    values: dict[str, int]


def _plan(server: ChaosServer, n_envs: int, seed: int) -> Plan:
    samples = build_samples(n_envs, server.base_url, seed=seed, filler_bytes=48 * 1024)
    server.packages.update(samples.packages)
    envs = []
    for spec in samples.envs:  # half of the packages carry their digest: a corrupt body is
        env = json.loads(spec.serialized)  # then caught before extraction, the rest by zip CRCs
        for i, uri in enumerate(env["py_modules"]):
            name = uri.rsplit("/", 1)[1]
            if int(hashlib.sha256(name.encode()).hexdigest(), 16) % 2:
                digest = hashlib.sha256(samples.packages[name]).hexdigest()
                env["py_modules"][i] = f"{uri}#sha256={digest}"
        envs.append(EnvSpec(spec.index, spec.working_dir, spec.py_modules, json.dumps(env)))
    return Plan(envs, samples.values)


async def _phase(
    node: Node, plan: Plan, rng: random.Random, tally: Tally, tasks: int, concurrency: int,
    kill_agent: bool, server: ChaosServer, calm: bool = False,
) -> None:  # fmt: skip
    """One round: tasks on `concurrency` runners while the monkey works (``calm``: it kills no
    worker and cancels no pop; it still kills the agent in a round that does)."""
    assert node.pool is not None
    pool = node.pool
    order = [rng.choice(plan.envs) for _ in range(tasks)]
    left = iter(range(tasks))
    done = asyncio.Event()
    agent_killed = False

    async def runner() -> None:
        for index in left:
            env = order[index]
            try:
                result = await node.run(TaskSpec(env.serialized, "task:run", (index,)))
            except TaskFailed as exc:
                tally.tasks_failed[exc.status] += 1
                why = unexplained(
                    exc,
                    killed_pids=tally.killed_pids,
                    agent_killed=agent_killed,
                    faults_injected=sum(server.faults.values()) > server.faults["none"],
                )
                if why is not None:
                    tally.violations.append(f"task {index} on env {env.index}: {why}")
                continue
            result.pop("pid")
            if result != env.expected(index, plan.values):
                tally.violations.append(f"task {index}: wrong result {result}")
            tally.tasks_ok += 1

    async def cancel_a_pop() -> None:
        cold = [e for e in plan.envs if e.serialized not in pool.slots]  # a pop that creates
        env = rng.choice(cold or plan.envs)
        pop = asyncio.create_task(pool.pop_worker(env.serialized))
        await asyncio.sleep(rng.uniform(0, 0.02))
        slot = pool.slots.get(env.serialized)
        if slot is not None and slot.creating is not None and not slot.creating.done():
            pop.cancel()
            tally.pops_cancelled += 1
        try:
            worker = await pop
        except (asyncio.CancelledError, TaskFailed, AgentDied):
            return
        pool.push_worker(worker)

    async def monkey() -> None:
        nonlocal agent_killed
        # the agent dies after a random share of the round's tasks: whatever is in flight then
        kill_after = tally.tasks_ok + rng.randrange(tasks) if kill_agent else None
        ending = False
        while not ending:
            ending = done.is_set()  # one more turn after the last task: a kill is never skipped
            await asyncio.sleep(rng.uniform(0.01, 0.06))
            action = rng.random()
            if calm:
                pass
            elif action < 0.3:  # a worker mid-request, or one that has just started
                victims = [
                    w for w in pool.workers.values()
                    if w.state in (WorkerState.BUSY, WorkerState.STARTING)
                ]  # fmt: skip
                if victims:
                    victim = rng.choice(victims)
                    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                        tally.killed_pids.add(victim.pid)  # known before its task can fail
                        os.kill(victim.pid, signal.SIGKILL)
                        tally.workers_killed += 1
            elif action < 0.45:
                cancellers.append(asyncio.create_task(cancel_a_pop()))
            if kill_after is not None and (tally.tasks_ok + failed() >= kill_after or ending):
                agent_killed = True
                os.kill(node.sidecar.pid, signal.SIGKILL)
                tally.agent_kills += 1
                kill_after = None

    def failed() -> int:
        return sum(tally.tasks_failed.values())

    cancellers: list[asyncio.Task[None]] = []
    monkey_task = asyncio.create_task(monkey())
    try:
        await asyncio.gather(*(runner() for _ in range(concurrency)))
    except AgentDied:
        pass
    except BaseException:  # interrupted (or broken): the monkey must not kill on its way out
        for task in (monkey_task, *cancellers):
            task.cancel()
        await asyncio.gather(monkey_task, *cancellers, return_exceptions=True)
        raise
    done.set()
    await monkey_task
    await asyncio.gather(*cancellers, return_exceptions=True)


async def _check_alive(node: Node, root: Path, budget: int, tally: Tally, where: str) -> None:
    """Between rounds, with the node up and quiet: the agent, the pool and the disk agree."""
    assert node.pool is not None
    assert node.client is not None
    tally.checks += 1

    def violation(what: str) -> None:
        tally.violations.append(f"{where}: {what}")

    for _ in range(20):  # a worker that idles out during the snapshot makes it stale: again
        await node.pool.quiesce()
        exits = node.pool.stats.workers_exited
        info = await _settled_info(node, root)
        if node.pool.stats.workers_exited == exits:
            break
    counts = {e.runtime_env_id: e.references for e in info.envs if e.state != "failed"}
    active = node.pool.active_keys_by_env()
    if counts != active:
        violation(f"agent counts {counts} != the pool's active keys {active}")
    by_uri = {f"{u.kind}:{u.uri}": u for u in info.uris}
    for env in info.envs:
        for key in env.uris if env.references else ():
            if key not in by_uri or by_uri[key].state != "ready":
                violation(f"live env {env.runtime_env_id} lacks {key}")
    if info.cache.unused_bytes > budget:
        violation(f"unused bytes {info.cache.unused_bytes} over the budget {budget}")
    _check_disk(root, info, violation)
    try:
        node.pool.check_invariants()
    except AssertionError as exc:
        violation(f"pool: {exc}")


async def _settled_info(node: Node, root: Path) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """Info once no install is in flight and tmp/, trash/ and the write-behind have drained."""
    assert node.client is not None
    deadline = time.monotonic() + 30
    while True:
        info = await node.client.info()
        installing = any(u.state == "installing" for u in info.uris)
        drained = not any((root / "tmp").iterdir()) and not any((root / "trash").iterdir())
        rows = _rows(root)
        dirs = {p.name for p in (root / "uris").iterdir()}
        if (not installing and drained and rows == dirs) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.05)


def _rows(root: Path) -> set[str]:
    with sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True) as db:
        return {row[0] for row in db.execute("SELECT dir FROM uris")}


def _check_disk(
    root: Path, info: agent_pb2.GetRuntimeEnvsInfoReply, violation: Callable[[str], None]
) -> None:
    dirs = {p.name for p in (root / "uris").iterdir()}
    known = {Path(u.local_path).name for u in info.uris if u.local_path}
    rows = _rows(root)
    if dirs != known:
        violation(f"directories {sorted(dirs ^ known)} and the agent's records disagree")
    if dirs != rows:
        violation(f"directories {sorted(dirs ^ rows)} and state.db disagree")
    for sub in ("tmp", "trash"):
        if any((root / sub).iterdir()):
            violation(f"{sub}/ did not drain")


async def run(args: argparse.Namespace, interrupt: Interrupt | None = None) -> Tally:
    """The whole run; a temp workdir it made is removed whatever happens (``--keep`` keeps it,
    and a ``--workdir`` given is never removed)."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rtenv-chaos-"))
    try:
        return await _run_in(work, args, interrupt)
    finally:
        if not args.keep and not args.workdir:
            await asyncio.to_thread(shutil.rmtree, work, True)


async def _run_in(work: Path, args: argparse.Namespace, interrupt: Interrupt | None) -> Tally:
    rng = random.Random(args.seed)
    tally = Tally(seed=args.seed)
    root = work / "agent-root"
    server = ChaosServer(random.Random(args.seed + 1), args.fault_rate)
    await server.start()
    plan = _plan(server, args.envs, args.seed)
    budget = args.budget_kib * 1024
    kills = set(rng.sample(range(args.rounds - 1), args.agent_kills))
    started = time.monotonic()
    node: Node | None = None
    stats_before = (0, 0)

    def interrupted() -> None:
        if node is not None:
            node.interrupt()

    if interrupt is not None:
        interrupt.on_interrupt(interrupted)
    try:
        for round_ in range(args.rounds):
            if node is None:
                node = Node(
                    root,
                    idle_timeout_s=args.idle_timeout,
                    agent_args=["--cache-budget", str(budget), "--log-level", "WARNING"],
                    watch_interval_s=0.02,
                )
                await node.start()
                tally.restarts += 1 if round_ else 0
                if round_:
                    await _check_restarted(node, root, tally, f"restart before round {round_}")
                stats_before = (0, 0)
            kill = round_ in kills
            await _phase(
                node, plan, rng, tally, args.tasks, args.concurrency, kill, server, args.calm
            )
            if kill:  # the monkey killed it, maybe just as the last task ended
                await asyncio.wait_for(node.wait_died(), 30)
            tally.rounds += 1
            assert node.pool is not None
            tally.violations += node.pool.violations
            node.pool.violations.clear()
            failed = sum(tally.tasks_failed.values())
            print(
                f"round {round_}: {tally.tasks_ok} ok, {failed} failed, "
                f"{len(tally.violations)} violations so far",
                flush=True,
            )
            if node.died is not None:
                tally.workers_started += node.pool.stats.workers_started
                await node.stop()
                node = None
                continue
            await _check_alive(node, root, budget, tally, f"after round {round_}")
            assert node.client is not None
            info = await node.client.info()
            tally.downloads += info.cache.downloads - stats_before[0]
            tally.evictions += info.cache.evictions - stats_before[1]
            stats_before = (info.cache.downloads, info.cache.evictions)
        assert node is not None
        assert node.pool is not None
        assert node.client is not None
        await node.pool.close()
        tally.violations += node.pool.violations
        tally.workers_started += node.pool.stats.workers_started
        info = await _settled_info(node, root)
        left = [e.runtime_env_id for e in info.envs if e.references]
        left += [u.uri for u in info.uris if u.references]
        if left:
            tally.violations.append(f"at the end, references left on {left}")
        _check_disk(root, info, lambda what: tally.violations.append(f"at the end: {what}"))
        tally.checks += 1
    finally:
        if node is not None:
            await node.stop()
        await server.stop()
        tally.seconds = time.monotonic() - started
    print(tally.summary(server.faults))
    if args.keep:
        print(f"kept {work}")
    return tally


async def _check_restarted(node: Node, root: Path, tally: Tally, where: str) -> None:
    """Right after a restart on the root of a killed agent: recovery left it consistent."""
    tally.checks += 1
    info = await _settled_info(node, root)
    if info.total_envs or any(u.references for u in info.uris):
        tally.violations.append(f"{where}: counts not 0 after recovery")
    _check_disk(root, info, lambda what: tally.violations.append(f"{where}: {what}"))


def _mistake(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    for name in ("rounds", "tasks", "envs", "concurrency"):
        if getattr(args, name) < 1:
            return f"--{name} must be at least 1, got {getattr(args, name)}"
    if not 0 <= args.agent_kills <= args.rounds - 1:
        return (
            f"--agent-kills must be between 0 and --rounds - 1 ({args.rounds - 1}: the last "
            f"round never kills the agent), got {args.agent_kills}"
        )
    if not 0.0 <= args.fault_rate <= 1.0:  # NaN fails too
        return f"--fault-rate must be between 0 and 1, got {args.fault_rate}"
    if args.budget_kib < 0:
        return f"--budget-kib must be at least 0, got {args.budget_kib}"
    if not (math.isfinite(args.idle_timeout) and args.idle_timeout > 0):
        return f"--idle-timeout must be a number of seconds above 0, got {args.idle_timeout}"
    if args.workdir is not None:
        try:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"--workdir {shown(args.workdir)} cannot be a folder: {exc.strerror or exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--tasks", type=int, default=150, help="tasks per round")
    parser.add_argument("--envs", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument(
        "--agent-kills", type=int, default=None, help="rounds that kill the agent (a fifth)"
    )
    parser.add_argument("--budget-kib", type=int, default=160, help="cache budget (KiB)")
    parser.add_argument("--fault-rate", type=float, default=0.2, help="faulty package GETs")
    parser.add_argument(
        "--idle-timeout", type=float, default=0.5, help="seconds an idle worker waits (0.5)"
    )
    parser.add_argument(
        "--calm",
        action="store_true",
        help="kill no worker and cancel no pop (with --agent-kills 0 and --fault-rate 0, any "
        "failed task is a violation)",
    )
    parser.add_argument("--workdir", help="where the agent's root goes, kept (a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp workdir")
    args = parser.parse_args(argv)
    if args.agent_kills is None:
        args.agent_kills = args.rounds // 5
    mistake = _mistake(args)
    if mistake is not None:
        print(f"chaos: {mistake}", file=sys.stderr)
        return 2
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    print(f"chaos seed {args.seed} (replay with --seed {args.seed})", flush=True)
    interrupt = Interrupt()
    try:
        tally = asyncio.run(interrupt.run(run(args, interrupt)))
    except KeyboardInterrupt:  # before the run began, or as asyncio shut down after it
        tally = None
    if tally is None:
        print("chaos: interrupted; the node stopped, its temp files removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
