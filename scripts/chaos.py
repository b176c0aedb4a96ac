"""Chaos: drive nodes through a seeded, violent workload and prove nothing is lost.

Raylet_sim nodes (pool + agent sidecar; ``--nodes N``, each agent on its own socket, all on ONE
agent root) run rounds of tasks over envs that share packages, concurrently, with a cache
budget small enough that eviction runs all the time. Workers run in watch mode: they keep
re-hashing their packages and report any file that vanished or changed; on a shared root this
is the claim that one agent's eviction never deletes a package another agent's workers use.
Meanwhile a monkey per node SIGKILLs workers (busy ones mid-request, and ones that have just
started), cancels pops while their create is in flight, and SIGKILLs the node's agent at random
instants; then that node is down (the pool exits with it) and the runner starts a new one on
the same root as a supervisor would, while the other nodes work on. The package server is
slow, answers 500, resets connections and corrupts bodies for some requests.

After every round the invariants are checked against each agent's GetRuntimeEnvsInfo, each
pool's table, the disk and state.db (the shared index: its packages, claims, references and
holders; each holder's staging and trash; a dead holder reaped by the next pass); after the
last, every count must be 0, and once every node has stopped the root holds no holder,
reference or claim. Any violation fails the run (exit 1). The seed is printed; ``--seed``
replays the same plan (each node's stream is derived from it).
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
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from chaoslib_root import (
    RootState,
    check_known,
    held,
    holder_of,
    read_root,
    root_problems,
    stopped_problems,
)

from agent.ops.usage import OneLineParser
from raylet_sim.cli import shown
from raylet_sim.client import AgentClient
from raylet_sim.interrupt import STOP_SIGNALS, Interrupt
from raylet_sim.node import AgentDied, Node
from raylet_sim.pool import (
    ENV_SETUP_FAILED,
    WORKER_DIED,
    WORKER_START_FAILED,
    TaskFailed,
    TaskSpec,
    WorkerPool,
    WorkerState,
)
from raylet_sim.samples import EnvSpec, PackageServer, build_samples
from raylet_sim.sidecar import MAX_UNIX_PATH_BYTES
from rtenv.v1 import agent_pb2

MAX_NODES = 16  # agents on one root: more would only measure the machine
FAULT_WORDS = {"500": "HTTP 500"}  # a fault's name in the summary, where its key is no word

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
    nodes: int = 1
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
    settling_s: float = 0.0  # the checks' waits for the root to settle
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    killed_pids: set[int] = field(default_factory=set)  # every worker the monkey SIGKILLed

    def summary(self, faults: Counter[str]) -> str:
        failed = sum(self.tasks_failed.values())
        injected = {FAULT_WORDS.get(k, k): n for k, n in faults.items() if k != "none"}
        return "\n".join(
            [
                f"seed {self.seed}: {self.rounds} rounds in {self.seconds:.1f}s",
                f"nodes        {self.nodes} on one agent root",
                f"tasks        {self.tasks_ok} ok, {failed} failed{_listed(self.tasks_failed)}",
                f"workers      {self.workers_started} started, {self.workers_killed} killed",
                f"pops         {self.pops_cancelled} cancelled mid-create",
                f"agent        {self.agent_kills} SIGKILLs, {self.restarts} restarts",
                f"packages     {self.downloads} installs, {self.evictions} evictions",
                f"faults       {sum(injected.values())} injected in {sum(faults.values())} requests"
                f"{_listed(injected)}",
                f"checks       {self.checks} invariant checks, {self.settling_s:.1f}s waiting "
                "for the root to settle",
                f"violations   {len(self.violations)}",
                *(f"  - {v}" for v in self.violations[:20]),
            ]
        )


def _listed(counts: Mapping[str, int]) -> str:
    """``: 3 WORKER_DIED, 1 ENV_SETUP_FAILED`` (most first, then by name; none counted 0), or
    nothing when nothing is counted: words for the summary, not a dict's repr."""
    counted = sorted((-n, name) for name, n in counts.items() if n)
    return (": " + ", ".join(f"{-n} {name}" for n, name in counted)) if counted else ""


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


# -- the nodes ------------------------------------------------------------------------------


@dataclass
class Seat:
    """One node's place in the run: the node of the moment (a new one after each kill of its
    agent), that agent's holder id, the rounds that kill it and the node's own random stream."""

    index: int
    rng: random.Random
    kills: set[int]
    label: str = ""  # "node <i>: " in the messages of a run of several nodes
    address: str | None = None  # its agent's own socket (one node: the root's default)
    log_path: Path | None = None
    node: Node | None = None
    holder: str = ""

    @property
    def live(self) -> Node:
        assert self.node is not None
        return self.node

    @property
    def pool(self) -> WorkerPool:
        assert self.node is not None
        assert self.node.pool is not None
        return self.node.pool

    @property
    def client(self) -> AgentClient:
        assert self.node is not None
        assert self.node.client is not None
        return self.node.client


@dataclass
class Look:
    """Every live node's info and the root's state, taken once they had settled (or not)."""

    infos: list[agent_pb2.GetRuntimeEnvsInfoReply]
    state: RootState
    problems: list[str]


async def _settled(
    live: list[Seat], root: Path, budget: int, tally: Tally, limit_s: float = 30.0
) -> Look:
    """Look until the nodes' agents and the root agree: no install in flight anywhere, staging
    and trash drained, dead holders reaped, every reference written behind; at the deadline,
    look as they are and say what is still wrong. The wait is tallied: a long one is a sign."""
    began = time.monotonic()
    deadline = began + limit_s
    while True:
        infos = [await seat.client.info() for seat in live]
        state = await asyncio.to_thread(read_root, root)
        nodes = {s.holder: (s.label, held(i)) for s, i in zip(live, infos, strict=True)}
        problems = root_problems(state, nodes, budget)
        busy = [
            f"{seat.label}an install still in flight after {limit_s:g}s"
            for seat, info in zip(live, infos, strict=True)
            if any(u.state == "installing" for u in info.uris)
        ]
        if (not problems and not busy) or time.monotonic() > deadline:
            tally.settling_s += time.monotonic() - began
            return Look(infos, state, problems + busy)
        await asyncio.sleep(0.05)


def _check_agent(
    seat: Seat, info: agent_pb2.GetRuntimeEnvsInfoReply, violation: Callable[[str], None]
) -> None:
    """A quiet node: its agent's counts are its pool's, and every live env's package is ready."""
    pool = seat.pool
    counts = {e.runtime_env_id: e.references for e in info.envs if e.state != "failed"}
    active = pool.active_keys_by_env()
    if counts != active:
        violation(f"{seat.label}agent counts {counts} != the pool's active keys {active}")
    by_uri = {f"{u.kind}:{u.uri}": u for u in info.uris}
    for env in info.envs:
        for key in env.uris if env.references else ():
            if key not in by_uri or by_uri[key].state != "ready":
                violation(f"{seat.label}live env {env.runtime_env_id} lacks {key}")
    try:
        pool.check_invariants()
    except AssertionError as exc:
        violation(f"{seat.label}pool: {exc}")


async def _check_nodes(
    seats: list[Seat], root: Path, budget: int, tally: Tally, where: str
) -> None:
    """Between rounds, with every live node quiet: each agent agrees with its pool, and the
    root (state.db, the folders) with every agent."""
    live = [seat for seat in seats if seat.node is not None]
    pools = [seat.pool for seat in live]
    tally.checks += 1

    def violation(what: str) -> None:
        tally.violations.append(f"{where}: {what}")

    for _ in range(20):  # a worker that idles out during the look makes it stale: again
        for pool in pools:
            await pool.quiesce()
        exits = [pool.stats.workers_exited for pool in pools]
        look = await _settled(live, root, budget, tally)
        if [pool.stats.workers_exited for pool in pools] == exits:
            break
    for seat, info in zip(live, look.infos, strict=True):
        _check_agent(seat, info, violation)
    for problem in look.problems:
        violation(problem)
    if len(seats) == 1:
        check_known(look.state, look.infos[0], budget, violation)


async def _check_restarted(
    seat: Seat, seats: list[Seat], root: Path, budget: int, tally: Tally, where: str
) -> None:
    """Right after a restart on the root of a killed agent: the new agent holds nothing; and,
    alone on the root, recovery left the whole root consistent (the dead holder reaped)."""
    tally.checks += 1

    def violation(what: str) -> None:
        tally.violations.append(f"{where}: {what}")

    if len(seats) > 1:  # the other nodes work on meanwhile: only the new agent's own counts
        info = await seat.client.info()
        if info.total_envs:
            violation("counts not 0 after recovery")
        return
    look = await _settled([seat], root, budget, tally)
    info = look.infos[0]
    if info.total_envs or any(u.references for u in info.uris):
        violation("counts not 0 after recovery")
    for problem in look.problems:
        violation(problem)
    check_known(look.state, info, budget, violation)


async def _check_end(seats: list[Seat], root: Path, budget: int, tally: Tally) -> None:
    """Every pool closed: every count is 0, state.db holds no reference of a live holder."""
    tally.checks += 1

    def violation(what: str) -> None:
        tally.violations.append(f"at the end: {what}")

    look = await _settled(seats, root, budget, tally)
    for seat, info in zip(seats, look.infos, strict=True):
        left = [e.runtime_env_id for e in info.envs if e.references]
        left += [u.uri for u in info.uris if u.references]
        if left:
            violation(f"{seat.label}references left on {left}")
    for problem in look.problems:
        violation(problem)
    if len(seats) == 1:
        check_known(look.state, look.infos[0], budget, violation)


# -- the run --------------------------------------------------------------------------------


@dataclass
class Plan:
    envs: list[EnvSpec]
    values: Mapping[str, int]  # the samples' (made from the seed at each lookup)


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
    """One node's round: tasks on `concurrency` runners while the monkey works (``calm``: it
    kills no worker and cancels no pop; it still kills the agent in a round that does)."""
    assert node.pool is not None
    pool = node.pool
    order = [rng.choice(plan.envs) for _ in range(tasks)]
    left = iter(range(tasks))
    done = asyncio.Event()
    agent_killed = False
    finished = 0  # this round's tasks on this node that ended, well or not

    async def runner() -> None:
        nonlocal finished
        for index in left:
            env = order[index]
            try:
                result = await node.run(TaskSpec(env.serialized, "task:run", (index,)))
            except TaskFailed as exc:
                finished += 1
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
            finished += 1
            result.pop("pid")
            if result != env.expected(index, plan.values):
                tally.violations.append(f"task {index}: wrong result {result}")
            tally.tasks_ok += 1

    async def cancel_a_pop() -> None:
        cold = [e for e in plan.envs if e.serialized not in pool.slots]  # a pop that creates
        env = rng.choice(cold or plan.envs)
        pop = asyncio.create_task(pool.pop_worker(env.serialized))
        try:
            await asyncio.sleep(rng.uniform(0, 0.02))
            slot = pool.slots.get(env.serialized)
            if slot is not None and slot.creating is not None and not slot.creating.done():
                pop.cancel()
                tally.pops_cancelled += 1
            await asyncio.wait([pop])
        except BaseException:  # this canceller cancelled (the run interrupted): its pop goes
            pop.cancel()  # too, awaited: its failure is never left unread for the GC to log
            await asyncio.gather(pop, return_exceptions=True)
            raise
        if pop.cancelled() or isinstance(pop.exception(), TaskFailed | AgentDied):
            return
        pool.push_worker(pop.result())

    async def monkey() -> None:
        nonlocal agent_killed
        # the agent dies after a random share of the round's tasks: whatever is in flight then
        kill_after = rng.randrange(tasks) if kill_agent else None
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
            if kill_after is not None and (finished >= kill_after or ending):
                agent_killed = True
                os.kill(node.sidecar.pid, signal.SIGKILL)
                tally.agent_kills += 1
                kill_after = None

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


async def run(args: argparse.Namespace, interrupt: Interrupt | None = None) -> Tally:
    """The whole run; a temp workdir it made is removed whatever happens (``--keep`` keeps it,
    and a ``--workdir`` given is never removed)."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rtenv-chaos-"))
    try:
        return await _run_in(work, args, interrupt)
    finally:
        if not args.keep and not args.workdir:
            await asyncio.to_thread(shutil.rmtree, work, True)


def _seats(args: argparse.Namespace, rng: random.Random, work: Path, sockets: Path) -> list[Seat]:
    """The nodes' seats. One node: today's run (the root's own socket, its log beside the root,
    the main random stream); several: each its own socket, log in the workdir, random stream
    (derived from the seed) and rounds that kill its agent."""
    nodes: int = args.nodes
    kills = set(rng.sample(range(args.rounds - 1), args.agent_kills))
    if nodes == 1:
        return [Seat(0, rng, kills)]
    seats = [Seat(0, rng, kills)]
    for i in range(1, nodes):
        own = random.Random(f"{args.seed}/node {i}")
        seats.append(Seat(i, own, set(own.sample(range(args.rounds - 1), args.agent_kills))))
    for seat in seats:
        seat.label = f"node {seat.index}: "
        seat.address = f"unix:{sockets / f'node{seat.index}.sock'}"
        seat.log_path = work / f"agent-{seat.index}.log"
    return seats


def _socket_folder(work: Path) -> tuple[Path, bool]:
    """Where the nodes' sockets go: the workdir, or a short temp folder of ours (True) when a
    socket's path in the workdir would pass the AF_UNIX limit."""
    if len(os.fsencode(str(work.resolve() / "sockets" / "node15.sock"))) <= MAX_UNIX_PATH_BYTES:
        (work / "sockets").mkdir(exist_ok=True)
        return work.resolve() / "sockets", False
    return Path(tempfile.mkdtemp(prefix="rtenv-chaos-")), True


async def _start(seat: Seat, root: Path, args: argparse.Namespace, tally: Tally) -> None:
    """A new node in the seat, its agent on the shared root; find the agent's holder id."""
    seat.node = Node(
        root,
        idle_timeout_s=args.idle_timeout,
        agent_args=["--cache-budget", str(args.budget_kib * 1024), "--log-level", "WARNING"],
        watch_interval_s=0.02,
        address=seat.address,
        log_path=seat.log_path,
    )
    await seat.node.start()
    pid = seat.node.sidecar.pid
    seat.holder = await asyncio.to_thread(holder_of, root, pid)
    if not seat.holder:
        tally.violations.append(f"{seat.label}its agent (pid {pid}) has no lock in holders/")


async def _round(
    seat: Seat, seats: list[Seat], round_: int, root: Path, args: argparse.Namespace,
    plan: Plan, server: ChaosServer, tally: Tally,
) -> None:  # fmt: skip
    """One node's round; if the monkey killed its agent, the node is down and, as a supervisor
    would, the runner starts a new one on the root at once, while the other nodes work on."""
    node = seat.live
    kill = round_ in seat.kills
    await _phase(node, plan, seat.rng, tally, args.tasks, args.concurrency, kill, server, args.calm)
    if not kill:
        return
    await asyncio.wait_for(node.wait_died(), 30)  # maybe killed just as the last task ended
    tally.violations += seat.pool.violations
    tally.workers_started += seat.pool.stats.workers_started
    await node.stop()
    seat.node = None
    if len(seats) > 1:  # a supervisor's back-off: meanwhile the others' passes may reap it
        await asyncio.sleep(seat.rng.uniform(0.0, 0.5))
    await _start(seat, root, args, tally)
    tally.restarts += 1
    where = f"{seat.label}restart after round {round_}"
    await _check_restarted(seat, seats, root, args.budget_kib * 1024, tally, where)


async def _run_in(work: Path, args: argparse.Namespace, interrupt: Interrupt | None) -> Tally:
    rng = random.Random(args.seed)
    tally = Tally(seed=args.seed, nodes=args.nodes)
    root = work / "agent-root"
    server = ChaosServer(random.Random(args.seed + 1), args.fault_rate)
    await server.start()
    sockets, own_sockets = _socket_folder(work) if tally.nodes > 1 else (work, False)
    plan = _plan(server, args.envs, args.seed)
    budget = args.budget_kib * 1024
    seats = _seats(args, rng, work, sockets)
    started = time.monotonic()

    def interrupted() -> None:
        for seat in seats:
            if seat.node is not None:
                seat.node.interrupt()

    if interrupt is not None:
        interrupt.on_interrupt(interrupted)
    try:
        async with asyncio.TaskGroup() as group:  # the nodes start together
            for seat in seats:
                group.create_task(_start(seat, root, args, tally))
        for round_ in range(args.rounds):
            async with asyncio.TaskGroup() as group:
                for seat in seats:
                    group.create_task(_round(seat, seats, round_, root, args, plan, server, tally))
            tally.rounds += 1
            for seat in seats:
                tally.violations += seat.pool.violations
                seat.pool.violations.clear()
            failed = sum(tally.tasks_failed.values())
            print(
                f"round {round_}: {tally.tasks_ok} ok, {failed} failed, "
                f"{len(tally.violations)} violations so far",
                flush=True,
            )
            await _check_nodes(seats, root, budget, tally, f"after round {round_}")
        await asyncio.gather(*(seat.pool.close() for seat in seats))
        for seat in seats:
            tally.violations += seat.pool.violations
            tally.workers_started += seat.pool.stats.workers_started
        await _check_end(seats, root, budget, tally)
        await asyncio.gather(*(seat.live.stop() for seat in seats))
        for seat in seats:
            seat.node = None
        tally.checks += 1
        stopped = await asyncio.to_thread(read_root, root)
        # from the root's change log: an agent's own counters die with it when it is killed
        tally.downloads, tally.evictions = stopped.installed, stopped.removed
        for problem in stopped_problems(stopped):
            tally.violations.append(f"after every node stopped: {problem}")
    finally:
        await asyncio.gather(*(seat.node.stop() for seat in seats if seat.node is not None))
        await server.stop()
        if own_sockets:
            await asyncio.to_thread(shutil.rmtree, sockets, True)
        tally.seconds = time.monotonic() - started
    print(tally.summary(server.faults))
    if args.keep:
        print(f"kept {work}")
    return tally


def _mistake(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None."""
    for name in ("rounds", "tasks", "envs", "concurrency"):
        if getattr(args, name) < 1:
            return f"--{name} must be at least 1, got {getattr(args, name)}"
    if not 1 <= args.nodes <= MAX_NODES:
        return f"--nodes must be between 1 and {MAX_NODES}, got {args.nodes}"
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
    parser = OneLineParser(prog="chaos", description=__doc__)  # a mistake: one line, exit 2
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--tasks", type=int, default=150, help="tasks per round and node")
    parser.add_argument("--envs", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=6, help="task runners per node")
    parser.add_argument(
        "--nodes", type=int, default=1, help=f"nodes on the one agent root (1 to {MAX_NODES})"
    )
    parser.add_argument(
        "--agent-kills", type=int, default=None, help="rounds that kill a node's agent (a fifth)"
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
    # Ctrl-C, SIGTERM (kill, timeout) and SIGHUP (a closing terminal) stop the run alike
    interrupt = Interrupt(STOP_SIGNALS)
    try:
        with interrupt.raising():
            tally = asyncio.run(interrupt.run(run(args, interrupt)))
    except KeyboardInterrupt:  # before the run began, or as asyncio shut down after it
        tally = None
    if tally is None:
        with contextlib.suppress(OSError):  # a closed terminal takes no line
            print(
                f"chaos: {interrupt.said}; the nodes stopped, their temp files removed",
                file=sys.stderr,
            )
        return interrupt.exit_code
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
