"""shared-root (issue 16): the nodes of one machine, six agent processes, on ONE cache root,
against the same six agents each on its own private root.

Each round starts both sets of six agents (``serve --root R --address <its own socket>``; the
shared set all on one root, the private set on six roots), all alive for the whole round. Then,
for each set in turn (the order alternates per round), every node creates the same envs at
once: ``PACKAGES`` http working_dir zips from the bench's package server, one env each, so
``NODES x PACKAGES`` creates are in flight together. Measured per set: the GETs per package URI
at the server, the bytes under ``uris/`` of the root(s) afterwards (as du counts them: allocated
blocks, each inode once), and the wall from the first create sent to the last one answered.

A shared root should download and store each package once, where six private roots do it six
times: both ratios shared/private should be 1/6, exactly for the GETs (one per URI against six).
The wall should be no worse.

Then the hot path, in the last round: cache-hit create+delete pairs (``benchlib.hot``'s
interleaved rounds at concurrency 1 and 64) against one node of the shared set, whose five peers
on that root stay alive and idle, and against one node of the private set (whose five peers are
as alive and idle, on their own roots). A cache hit must take no cross-process lock, so the
per-pair time should be within 1.1x.

``add_figures`` turns the runs into figures (pure, so a test can feed it a planted defect and
see ``--check`` fail).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import zipfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.config import MiB, Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, fmt
from benchlib.hot import Served, round_notes, rounds
from benchlib.packages import BigSpec, build_big_zip
from benchlib.procs import (
    BenchError,
    Child,
    PackageServer,
    ProcWatch,
    read_all,
    short_address,
    wait_healthy,
)
from benchlib.shared import Shared

NODES = 6  # the six concurrent experiments on one machine
PACKAGES = 4
SHARE = 1 / NODES  # what a shared root should cost against private roots, downloads and disk
# GETs are counted exactly: the tolerance only absorbs float rounding of 1/6
DOWNLOAD_TOLERANCE = 1e-9
# du counts blocks: a root's directories may differ by a block or so; a second copy of any
# package is far more than 1% (each package is a quarter of the bytes)
DISK_TOLERANCE = 0.01
HOT_GOAL = 1.1
_WARM_ENV = json.dumps({"env_vars": {"BENCH": "shared-root warm-up"}})


def package_spec(big: BigSpec) -> BigSpec:
    """One package: a tenth of the large zip's small files and of its large bytes (the full
    run: 400 source-like files and 6 MB of data, about 8 MB unpacked, a 5 MB zip; ``--smoke``
    shrinks the large zip to 2 MB, so these to 10 small files and no large one)."""
    random_mb, text_mb = sum(big.large_random_mb) // 10, sum(big.large_text_mb) // 10
    return BigSpec(
        small_files=max(10, big.small_files // 10),
        small_max_bytes=big.small_max_bytes,
        large_random_mb=(random_mb,) if random_mb else (),
        large_text_mb=(text_mb,) if text_mb else (),
    )


def uris_bytes(root: Path) -> int:
    """Bytes allocated under ``root/uris`` (the folder included), as ``du -s -B1`` counts them:
    st_blocks of every file and folder, each inode once, symlinks not followed. Blocking."""
    top = root / "uris"
    seen: set[tuple[int, int]] = set()
    total = 0

    def count(path: str) -> None:
        nonlocal total
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512

    if not top.is_dir():
        return 0
    count(str(top))
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            count(os.path.join(folder, name))
    return total


def env_of(url: str) -> str:
    """The env every node creates for one package (the same string on every node)."""
    return json.dumps({"working_dir": url, "env_vars": {"BENCH": "shared-root"}})


# -- the figures (pure) ----------------------------------------------------------------------------


@dataclass
class Run:
    """What one set of nodes measured in one round."""

    wall_s: float
    gets: dict[str, int]  # GETs at the package server per package file, during the run
    disk_bytes: int  # under uris/ of the set's root(s), after the run
    creates: int  # creates sent
    errors: int  # creates that failed


def add_figures(
    result: WorkloadResult, shared: Sequence[Run], private: Sequence[Run], unpacked_bytes: int
) -> None:
    """The shared root's figures against the private roots', the worst round for the exact
    ones (GETs, disk, failures) and medians for the wall. The goals: GETs and disk 1/6 of the
    private roots', exactly one GET per URI on the shared root, every package on the shared
    root's disk (du at least the packages' unpacked bytes: a root that lost or misplaced one
    cannot pass the 1/6 by being small), no create failed, the wall no worse."""
    sh_gets = max(sum(r.gets.values()) for r in shared)
    pr_gets = min(sum(r.gets.values()) for r in private)
    result.figure(
        f"downloads, {NODES} nodes x {PACKAGES} packages, worst round", sh_gets, pr_gets,
        f"{NODES} private roots: GETs at the package server", "GETs",
        Goal("ratio", "<=", SHARE + DOWNLOAD_TOLERANCE, f"1/{NODES} of private roots: <= 0.167x"),
    )  # fmt: skip
    result.figure(
        "GETs of the most-fetched package URI, shared root", max(_worst_uri(r) for r in shared),
        max(_worst_uri(r) for r in private), f"the same on {NODES} private roots", "GETs",
        Goal("value", "==", 1, "exactly 1 GET per URI"),
    )  # fmt: skip
    result.figure(
        "disk under uris/ after the run (du), worst round",
        max(r.disk_bytes for r in shared) / MiB, min(r.disk_bytes for r in private) / MiB,
        f"{NODES} private roots: their uris/ folders together", "MiB",
        Goal("ratio", "<=", SHARE * (1 + DISK_TOLERANCE), f"1/{NODES} of private roots: <= 0.168x"),
    )  # fmt: skip
    result.figure(
        "disk under uris/ of the shared root, least round",
        min(r.disk_bytes for r in shared) / MiB, unpacked_bytes / MiB,
        "the packages' unpacked bytes (each once)", "MiB",
        Goal("ratio", ">=", 1.0, "every package there: ratio >= 1.0x"),
    )  # fmt: skip
    result.figure(
        f"wall of {NODES * PACKAGES} concurrent creates, first sent to last answered",
        statistics.median(r.wall_s for r in shared), statistics.median(r.wall_s for r in private),
        f"the same creates on {NODES} private roots", "s",
        Goal("ratio", "<=", 1.0, "no worse than private roots: ratio <= 1.0x"),
    )  # fmt: skip
    result.figure(
        "failed creates, both sets, every round", sum(r.errors for r in [*shared, *private]),
        sum(r.creates for r in [*shared, *private]), "creates sent", "creates",
        Goal("value", "==", 0, "none"),
    )  # fmt: skip


def add_hot_figures(result: WorkloadResult, on_shared: Served, on_private: Served) -> None:
    """Cache-hit pairs on a node of the shared root against a node of a private root."""
    base = "one of six agents on a private root (five idle peers on theirs)"
    result.figure(
        "hot pair time, concurrency 64, on the shared root", 1000 / on_shared.rate,
        1000 / on_private.rate, f"{base}: best round", "ms",
        Goal("ratio", "<=", HOT_GOAL, f"within {HOT_GOAL:g}x: ratio <= {HOT_GOAL:g}x"),
    )  # fmt: skip
    result.figure(
        "hot create p50, concurrency 1, on the shared root", on_shared.p50_ms, on_private.p50_ms,
        base, "ms",
    )  # fmt: skip


def _unpacked_bytes(path: Path) -> int:
    """What a zip's files add up to unpacked, from its directory. Blocking."""
    with zipfile.ZipFile(path) as zf:
        return sum(i.file_size for i in zf.infolist() if not i.is_dir())


def _worst_uri(run: Run) -> int:
    return max(run.gets.values(), default=0)


# -- the agents ------------------------------------------------------------------------------------


class Node(Child):
    """One node's agent: ``python -m agent serve --root ROOT --address <its own socket>``."""

    def __init__(self, root: Path, name: str, work: Path) -> None:
        self.root = root
        self.address = short_address(work / "sockets" / f"{name}.sock")
        argv = [
            sys.executable, "-m", "agent", "serve", "--root", str(root),
            "--address", self.address, "--log-level", "WARNING",
        ]  # fmt: skip
        super().__init__(argv, work / "logs" / f"{name}.log")

    async def start(self) -> None:
        """Start it, wait until it serves, then warm its create path with an env that has no
        package (the first create of a process pays for lazy work the timed ones should not)."""
        await self.spawn()
        try:
            await wait_healthy(self.address, self, 120.0)
        except BaseException:
            await self.stop()
            raise
        async with grpc.aio.insecure_channel(self.address) as channel:
            await rpc.GrpcTarget(rpc.stub(channel)).create(_WARM_ENV, rpc.CALL_TIMEOUT_S)


async def start_set(stack: AsyncExitStack, roots: list[Path], label: str, work: Path) -> list[Node]:
    """Start one agent per root at once (a shared set: the same root six times); each is stopped
    by ``stack``, also when another one fails to start."""
    (work / "sockets").mkdir(exist_ok=True)
    nodes = [Node(root, f"{label}-node{i}", work) for i, root in enumerate(roots)]
    stack.push_async_callback(_stop_all, nodes)
    outcomes = await asyncio.gather(*(n.start() for n in nodes), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise BenchError(f"{label}: an agent did not start: {outcome}") from outcome
    return nodes


async def _stop_all(nodes: list[Node]) -> None:
    await asyncio.gather(*(n.stop() for n in nodes))


# -- one run ---------------------------------------------------------------------------------------


async def run_set(
    name: str, nodes: list[Node], roots: list[Path], urls: dict[str, str], zips: list[Path],
    server: PackageServer, sizes: Sizes,
) -> tuple[Run, Measure]:  # fmt: skip
    """Every node of a set creates every package's env, all at once; ``roots``: the set's
    distinct roots."""
    envs = [env_of(url) for url in urls.values()]
    await asyncio.to_thread(read_all, zips)
    before = await server.gets()
    extracted = [(await rpc.info(n.address)).cache.extractions for n in nodes]  # long-lived
    deadline = time.monotonic() + sizes.phase_timeout_s
    async with AsyncExitStack() as stack:
        chans = [
            await stack.enter_async_context(grpc.aio.insecure_channel(n.address)) for n in nodes
        ]
        for channel in chans:  # connected before the clock starts
            await asyncio.wait_for(channel.channel_ready(), 30)
        watches = [ProcWatch(n.pid) for n in nodes]
        for w in watches:
            w.start()
        t0 = time.perf_counter()
        n = len(envs)
        calls = await asyncio.gather(
            *(rpc.creates(rpc.stub(c), envs.__getitem__, n, n, deadline_s=deadline) for c in chans)
        )
        wall = time.perf_counter() - t0
        usages = [w.stop() for w in watches]
    after = await server.gets()
    gets = {file: after.get(file, 0) - before.get(file, 0) for file in urls}
    disk = sum([await asyncio.to_thread(uris_bytes, root) for root in roots])
    errors = sum(c.errors for c, _ in calls)
    for c, _ in calls:
        if c.error_sample:
            print(f"{name}: {c.errors} failed creates, e.g. {c.error_sample}", flush=True)
    m = Measure(
        name, wall, len(envs) * len(nodes), [x for c, _ in calls for x in c.create_s],
        sum(u.cpu_s for u in usages), max(u.peak_rss_bytes for u in usages),
        downloads=sum(gets.values()), errors=errors,
    )  # fmt: skip
    m.extractions = sum([(await rpc.info(n.address)).cache.extractions for n in nodes])
    m.extractions -= sum(extracted)
    return Run(wall, gets, disk, m.requests, errors), m


async def _packages(shared: Shared, sizes: Sizes) -> tuple[dict[str, str], list[Path]]:
    """The packages (built once), by file name: their URLs; and their paths."""
    server = await shared.server()
    spec = package_spec(sizes.big)
    urls: dict[str, str] = {}
    paths: list[Path] = []
    for k in range(PACKAGES):
        path = shared.packages / f"shared-root-{k}.zip"
        if not path.exists():
            await asyncio.to_thread(build_big_zip, path, spec, sizes.seed * 1000 + k)
        urls[path.name] = f"{server.base_url}/{path.name}"
        paths.append(path)
    return urls, paths


async def bench_shared_root(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    result = WorkloadResult("shared-root")
    urls, zips = await _packages(shared, sizes)
    server = await shared.server()
    measures = {
        "shared": Measure(f"{NODES} agents, one shared root"),
        "private": Measure(f"{NODES} agents, {NODES} private roots"),
    }
    runs: dict[str, list[Run]] = {"shared": [], "private": []}
    hot: list[Served] = []
    count = max(1, sizes.stampede_rounds)  # 2 in the full run: S P P S, each set first once
    for r in range(count):
        async with AsyncExitStack() as stack:
            one = work / f"shared-{r}"
            own = [work / f"private-{r}-{i}" for i in range(NODES)]
            sets = {
                "shared": (await start_set(stack, [one] * NODES, f"shared-{r}", work), [one]),
                "private": (await start_set(stack, own, f"private-{r}", work), own),
            }
            # S P P S ...: a drift in the machine's load over the run hits both alike
            for kind in ("shared", "private") if r % 2 == 0 else ("private", "shared"):
                nodes, roots = sets[kind]
                name = measures[kind].name
                run, m = await run_set(name, nodes, roots, urls, zips, server, sizes)
                runs[kind].append(run)
                measures[kind].add(m)
            if r == count - 1:
                sh, pr = sets["shared"][0][0], sets["private"][0][0]
                hot = [
                    Served("hot: a node of the shared root", sh.address, sh.pid),
                    Served("hot: a node of a private root", pr.address, pr.pid),
                ]
                # env 0 is held by both nodes since their creates: every pair is a cache hit
                await rounds(hot, env_of(next(iter(urls.values()))), sizes, sizes.hot_rounds)
    unpacked = sum([await asyncio.to_thread(_unpacked_bytes, z) for z in zips])
    add_figures(result, runs["shared"], runs["private"], unpacked)
    add_hot_figures(result, hot[0], hot[1])
    result.measures = [*measures.values(), *(s.measure for s in hot)]
    spec = package_spec(sizes.big)
    mib = sum(p.stat().st_size for p in zips) / MiB
    data_mb = sum(spec.large_random_mb) + sum(spec.large_text_mb)
    result.notes.append(
        f"{count} rounds; each node creates {PACKAGES} envs at once, one http working_dir zip "
        f"each ({fmt(mib)} MiB of zips in all; a package: {spec.small_files} small files"
        f"{f' and {data_mb} MB of data' if data_mb else ''}); all {2 * NODES} agents of a round "
        "alive for the whole round, each warmed by one create of an env without packages"
    )
    walls = "; ".join(
        f"round {i}: shared {a.wall_s:.2f}s, private {b.wall_s:.2f}s"
        for i, (a, b) in enumerate(zip(runs["shared"], runs["private"], strict=True))
    )
    result.notes.append(
        "walls are medians over the rounds, order alternating (S P P S); they move with the "
        f"machine's load (printed below), so read them with the rounds: {walls}"
    )
    round_notes(result, hot, sizes)
    return result
