"""The faults of the chaos run on real Ray: what each kind does, to whom, and what it records.

A kind is data (``KINDS``: its weight in the seeded draw, and whether it is a SIGKILL);
``inject`` carries one out against a running attempt (or the whole run: the shared disk, the
package server) and returns the ``Fault`` the oracle reads, or None when it found nothing to hit
(a cluster with no busy worker, say). A kill is fatal when it takes the whole cluster: the
driver, the GCS, or the raylet, keeper or agent of its head node (its only one, but in the
Cluster); the attempt is then marked killed and its driver stopped soon after
(``attempts.until_over``), to be relaunched. Fate sharing is
checked where a kill should take a peer with it (Ray's rule for its own agent): a raylet killed
takes its keeper and agent, an agent or keeper killed takes its raylet (``fate_problems``).
Crash points are not here: an attempt is started with one armed (``attempts.start``).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chaosray import procs
from chaosray.attempts import Attempt
from chaosray.oracle import Fault
from chaosray.server_faults import ServerFaults

FATE_S = 30.0  # a killed process's peer (raylet, or keeper and agent) to be gone


@dataclass(frozen=True)
class Kind:
    weight: int
    kill: bool  # a SIGKILL (counted toward the run's kills)


# weights: a kill that ends a cluster costs a start of it (tens of seconds of both cores), a
# worker's costs a worker's start: most kills are of workers, every kind still drawn each round
KINDS: dict[str, Kind] = {
    "raylet": Kind(2, True),
    "gcs": Kind(1, True),
    "keeper": Kind(1, True),
    "agent": Kind(2, True),
    "driver": Kind(1, True),
    "worker": Kind(9, True),
    "sigstop": Kind(2, False),
    "server": Kind(2, False),
    "disk-full": Kind(1, False),
}
# crash points armed in a relaunched one-node attempt's agent (agent/crash.py's that fire under
# Ray on a shared root); each one that fires is a kill of its agent
CRASH_POINTS = (
    "after_download",
    "mid_extract",
    "after_extract",
    "before_rename",
    "after_rename_before_commit",
    "mid_ray_link",
    "mid_venv_build",
)


def draw(rng: random.Random) -> str:
    names = sorted(KINDS)
    return rng.choices(names, weights=[KINDS[n].weight for n in names])[0]


@dataclass
class World:
    """What a fault can reach."""

    rng: random.Random
    server: ServerFaults
    resize: Callable[[int], None]  # the shared disk's size, in bytes
    used: Callable[[], tuple[int, int]]  # its (used, size) bytes
    fate_problems: list[str]
    fate_checks: list[asyncio.Future[None]] = field(default_factory=list)  # awaited at the end


async def _roles(attempt: Attempt) -> procs.Roles:
    return await asyncio.to_thread(procs.roles, attempt.cluster.ray_tmp)


def _pick(rng: random.Random, items: list[procs.Proc]) -> procs.Proc | None:
    return rng.choice(sorted(items, key=lambda p: p.pid)) if items else None


async def _gone(pids: list[int], timeout_s: float) -> list[int]:
    """Of ``pids``, those still alive after ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    left = pids
    for _ in range(10_000):  # bounded by the deadline
        left = [p for p in left if await asyncio.to_thread(procs.alive, p)]
        if not left or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    return left


async def _check_fate(world: World, label: str, what: str, peers: list[int]) -> None:
    if left := await _gone(peers, FATE_S):
        world.fate_problems.append(
            f"{label}: {what} SIGKILLed, but {left} still alive {FATE_S:.0f} s later (fate sharing)"
        )


def _kill_fault(kind: str, attempt: Attempt, t: float, fatal: bool) -> Fault:
    return Fault(kind, t, t, cluster=attempt.cluster.index, attempt=attempt.number, fatal=fatal)


async def _kill(world: World, kind: str, attempt: Attempt) -> Fault | None:
    roles = await _roles(attempt)
    label = attempt.label
    rng = world.rng
    target: procs.Proc | None
    peers: list[int] = []
    node = 0  # the raylet of the node it hits (0: the cluster's own: the GCS, the driver)
    if kind == "raylet":
        target = _pick(rng, roles.raylets)
        node = target.pid if target is not None else 0
        if target is not None:
            keeper = roles.keeper_of(target.pid)
            agent = roles.agent_of(keeper.pid) if keeper else None
            peers = [p.pid for p in (keeper, agent) if p is not None]
    elif kind in ("keeper", "agent"):
        keeper = _pick(rng, roles.keepers)
        agent = roles.agent_of(keeper.pid) if keeper else None
        target = keeper if kind == "keeper" else agent
        peers = [keeper.ppid] if keeper is not None else []
        node = keeper.ppid if keeper is not None else 0
        if kind == "keeper" and agent is not None:
            peers.append(agent.pid)
    elif kind == "gcs":
        target = _pick(rng, roles.gcs)
    elif kind == "worker":
        target = _pick(rng, roles.busy_workers())
        for _ in range(6):  # between two units a node may have none busy for a moment
            if target is not None:
                break
            await asyncio.sleep(0.5)
            target = _pick(rng, (await _roles(attempt)).busy_workers())
        node = -1  # no node dies
    else:  # driver
        target = procs.Proc(attempt.pid, 0, ()) if attempt.pid else None
    if target is None:
        return None
    t = time.time()
    if not procs.signal_pid(target.pid, signal.SIGKILL):
        return None
    head = roles.head()
    fatal = node == 0 or (head is not None and node == head.pid)
    if fatal:
        attempt.killed = kind
    if peers:
        check = _check_fate(world, label, f"{kind} {target.pid}", peers)
        world.fate_checks.append(asyncio.ensure_future(check))
    return _kill_fault(kind, attempt, t, fatal)


async def _sigstop(world: World, attempt: Attempt) -> Fault | None:
    roles = await _roles(attempt)
    agent = _pick(world.rng, roles.agents)
    if agent is None:
        return None
    t0 = time.time()
    if not procs.signal_pid(agent.pid, signal.SIGSTOP):
        return None
    await asyncio.sleep(world.rng.uniform(1.0, 5.0))
    procs.signal_pid(agent.pid, signal.SIGCONT)
    return Fault("sigstop", t0, time.time(), cluster=attempt.cluster.index)


async def _server(world: World) -> Fault | None:
    """A spell of faulty answers (each one recorded by the server, with its path)."""
    world.server.rate = 0.5
    await asyncio.sleep(world.rng.uniform(3.0, 8.0))
    world.server.rate = 0.0
    return None


async def _disk_full(world: World) -> Fault | None:
    used, size = await asyncio.to_thread(world.used)
    t0 = time.time()
    await asyncio.to_thread(world.resize, used + 64 * 1024)
    try:
        await asyncio.sleep(world.rng.uniform(1.0, 4.0))
    finally:
        await asyncio.to_thread(world.resize, size)
    return Fault("disk-full", t0, time.time())


async def inject(world: World, kind: str, attempt: Attempt) -> Fault | None:
    """Carry out one fault of ``kind`` against ``attempt``'s cluster (or the whole run)."""
    if KINDS[kind].kill:
        return await _kill(world, kind, attempt)
    if kind == "sigstop":
        return await _sigstop(world, attempt)
    if kind == "server":
        return await _server(world)
    return await _disk_full(world)


def server_faults(server: ServerFaults) -> list[Fault]:
    """The package server's faults, as the oracle reads them."""
    return [Fault(f"server:{f.kind}", f.t, f.t, path=f.path) for f in server.faults]


def crash_fault(attempt: Attempt) -> Fault:
    """An attempt whose agents were armed to kill themselves at a crash point."""
    return Fault(
        f"crash:{attempt.crash_point}",
        attempt.started,
        attempt.started,
        cluster=attempt.cluster.index,
        attempt=attempt.number,
    )
