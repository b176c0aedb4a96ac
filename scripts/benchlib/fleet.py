"""fleet (issue 17): the nodes of a cluster, eight agents, each cold-creating the same 20 envs
at once from one package store whose link they share.

The package store is the bench's package server with a bandwidth limit (``pkg_server --rate``:
one token bucket for all its connections, so the nodes contend for it). It models a cluster's
package store, the head node's GCS or an object-store bucket, whose egress is what the nodes
share: by default 32 MiB/s (about 270 Mbit/s) for 1 MiB zips, the ratio of a few-hundred-MB
working_dir over a few Gbit/s, scaled down so that a round takes seconds. Every env is an http
working_dir zip of its own (random bytes: a download moves the whole size).

Three sets of agents, all started at the beginning and alive to the end, each agent warmed by
one create of an env without packages (``shared_root.Node``):

- one: ONE agent on a private root (the baseline: what one node alone pays);
- private: ``fleet_nodes`` agents on private roots (the simulated nodes of today's cluster);
- shared: ``fleet_nodes`` agents on ONE shared root (docs/operations.md, "Sharing a root").

Each round, each set in turn (the order rotates over the rounds) has every one of its agents
create all the envs at once, under URLs new to the round and the set (hard links of the same
zips: a new URL is a new package, so every set starts cold every round). Measured per set: the
GETs per URI at the server, the wall from the first create sent to the last answered, and the
bytes the server sent (GETs x the zips' sizes), against the link's rate.

What should come out: a shared root fetches each URI once, exactly as one agent does (GETs ==
envs, one per URI), so the link carries one agent's bytes and the shared set's wall should be
one agent's plus the cost of the other nodes' creates on the machine's cores and of waiting for
a peer's install through the index (``store._WAIT_MAX_S``-capped polling): goal at most 1.2x.
Private roots fetch every URI once per node (GETs == nodes x envs, a goal: no node fetches a URI
twice) and are bound by the link: about ``fleet_nodes`` x one agent's wall, reported without a
goal, next to the floor the rate sets (bytes sent / rate).

``add_figures`` turns the runs into figures (pure, so a test can feed it a planted defect).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from benchlib.config import MiB, Sizes
from benchlib.figures import Goal, Measure, WorkloadResult, fmt
from benchlib.packages import build_small_zip
from benchlib.procs import PackageServer
from benchlib.shared import Shared
from benchlib.shared_root import Node, Run, run_set, start_set

SETS = ("one", "shared", "private")
SHARED_WALL_GOAL = 1.2


def _label(kind: str, nodes: int) -> str:
    return {
        "one": "one agent, private root",
        "shared": f"{nodes} agents, one shared root",
        "private": f"{nodes} agents, {nodes} private roots",
    }[kind]


# -- the figures (pure) ----------------------------------------------------------------------------


def add_figures(
    result: WorkloadResult,
    runs: Mapping[str, Sequence[Run]],
    sent: Mapping[str, Sequence[int]],
    nodes: int,
    envs: int,
    rate: float,
) -> None:
    """``runs[kind]``: each round's run of a set (``SETS``); ``sent[kind]``: the bytes the
    server sent in each of them. Exact figures (GETs, failures) take the worst round, walls the
    median. Goals: the shared root fetches each URI once (GETs == envs, the most-fetched URI
    once) within 1.2x one agent's wall; each private root each URI once (GETs == nodes x envs);
    no create fails. The private roots' wall has no goal (bound by the link: ~nodes x)."""
    one, shared, private = runs["one"], runs["shared"], runs["private"]
    one_wall = statistics.median(r.wall_s for r in one)
    one_gets = min(_gets(r) for r in one)
    result.figure(
        f"shared root: GETs, {nodes} nodes x {envs} envs, worst round",
        max(_gets(r) for r in shared), one_gets, "one agent: GETs at the package server",
        "GETs", Goal("value", "==", envs, f"one per URI: == {envs} GETs"),
    )  # fmt: skip
    result.figure(
        "shared root: GETs of the most-fetched URI, worst round",
        max(_worst_uri(r) for r in shared), max(_worst_uri(r) for r in one),
        "one agent: the same", "GETs", Goal("value", "==", 1, "exactly 1 GET per URI"),
    )  # fmt: skip
    result.figure(
        f"shared root: wall of {nodes * envs} cold creates, {nodes} nodes",
        statistics.median(r.wall_s for r in shared), one_wall,
        f"one agent: its {envs} cold creates, the same limited server", "s",
        Goal("ratio", "<=", SHARED_WALL_GOAL, f"ratio <= {SHARED_WALL_GOAL}x"),
    )  # fmt: skip
    result.figure(
        f"private roots: GETs, {nodes} nodes x {envs} envs, worst round",
        max(_gets(r) for r in private), one_gets, "one agent: GETs at the package server",
        "GETs", Goal("value", "==", nodes * envs, f"one per URI per node: == {nodes * envs} GETs"),
    )  # fmt: skip
    result.figure(
        f"private roots: wall of {nodes * envs} cold creates, {nodes} nodes",
        statistics.median(r.wall_s for r in private), one_wall,
        f"one agent: its {envs} cold creates (expected ~{nodes}x: the link is shared)", "s",
    )  # fmt: skip
    for kind, wall in (("private", private), ("one", one)):
        result.figure(
            f"{_label(kind, nodes)}: wall against the link's floor",
            statistics.median(r.wall_s for r in wall),
            statistics.median(b / rate for b in sent[kind]),
            f"bytes sent / rate ({fmt(rate / MiB)} MiB/s)", "s",
        )  # fmt: skip
    result.figure(
        "failed creates, every set and round", sum(r.errors for k in SETS for r in runs[k]),
        sum(r.creates for k in SETS for r in runs[k]), "creates sent", "creates",
        Goal("value", "==", 0, "none"),
    )  # fmt: skip


def _gets(run: Run) -> int:
    return sum(run.gets.values())


def _worst_uri(run: Run) -> int:
    return max(run.gets.values(), default=0)


# -- the packages ----------------------------------------------------------------------------------


def _build(folder: Path, sizes: Sizes) -> list[Path]:
    """The envs' zips, one each (random payload of ``fleet_package_bytes``). Blocking."""
    folder.mkdir(parents=True, exist_ok=True)
    zips = []
    for k in range(sizes.fleet_envs):
        path = folder / f"fleet-{k}.zip"
        build_small_zip(path, f"fleet{k}", sizes.fleet_package_bytes, sizes.seed * 1000 + k)
        zips.append(path)
    return zips


def _aliases(zips: list[Path], tag: str) -> list[Path]:
    """The zips under names new to ``tag`` (hard links): new URLs, new packages. Blocking."""
    links = []
    for z in zips:
        link = z.with_name(f"{tag}-{z.name}")
        os.link(z, link)
        links.append(link)
    return links


# -- the workload ----------------------------------------------------------------------------------


async def bench_fleet(work: Path, sizes: Sizes, shared: Shared) -> WorkloadResult:
    del shared  # this workload has its own, limited, package server
    result = WorkloadResult("fleet")
    nodes, envs, rate = sizes.fleet_nodes, sizes.fleet_envs, float(sizes.fleet_rate_bytes)
    folder = work / "packages"
    zips = await asyncio.to_thread(_build, folder, sizes)
    measures = {kind: Measure(_label(kind, nodes)) for kind in SETS}
    runs: dict[str, list[Run]] = {kind: [] for kind in SETS}
    sent: dict[str, list[int]] = {kind: [] for kind in SETS}
    rounds = max(1, sizes.fleet_rounds)
    async with AsyncExitStack() as stack:
        server = PackageServer(folder, work / "pkg-server.log", rate=rate)
        await stack.enter_async_context(server)  # stopped by its pid, after the agents
        one_root, shared_root = work / "one", work / "shared"
        private_roots = [work / f"private-{i}" for i in range(nodes)]
        wanted = {"one": [one_root], "shared": [shared_root] * nodes, "private": private_roots}
        started = await asyncio.gather(
            *(start_set(stack, roots, f"fleet-{kind}", work) for kind, roots in wanted.items()),
            return_exceptions=True,  # every set's agents on the stack before one failure is raised
        )
        sets: dict[str, tuple[list[Node], list[Path]]] = {}
        for (kind, roots), agents in zip(wanted.items(), started, strict=True):
            if isinstance(agents, BaseException):
                raise agents
            sets[kind] = (agents, sorted(set(roots)))
        for r in range(rounds):
            order = SETS[r % 3 :] + SETS[: r % 3]  # a drift in the machine's load hits all alike
            for kind in order:
                links = await asyncio.to_thread(_aliases, zips, f"r{r}-{kind}")
                urls = {z.name: f"{server.base_url}/{z.name}" for z in links}
                size = {z.name: z.stat().st_size for z in links}
                agents, roots = sets[kind]
                run, m = await run_set(
                    measures[kind].name, agents, roots, urls, links, server, sizes
                )
                runs[kind].append(run)
                sent[kind].append(sum(n * size[name] for name, n in run.gets.items()))
                measures[kind].add(m)
    add_figures(result, runs, sent, nodes, envs, rate)
    result.measures = list(measures.values())
    zip_mib = sum(z.stat().st_size for z in zips) / MiB
    result.notes.append(
        f"{rounds} round(s), order rotating; {envs} envs, one http working_dir zip each "
        f"({fmt(zip_mib)} MiB of zips in all), served at {fmt(rate / MiB)} MiB/s for all "
        f"connections together (one token bucket); all {2 * nodes + 1} agents alive for the "
        "whole run, each warmed by one create of an env without packages; URLs new to each "
        "set and round, so every run is cold"
    )
    walls = "; ".join(
        f"round {i}: " + ", ".join(f"{k} {runs[k][i].wall_s:.2f}s" for k in SETS)
        for i in range(rounds)
    )
    result.notes.append(f"walls are medians over the rounds: {walls}")
    return result
