"""Benchmarks: the agent as its users feel it, next to the physical limit measured in the same
run on the same machine. Absolute times on a shared machine are context; the ratios are the
result. Writes a table to stdout and every figure, with its baseline, ratio and goal, to
bench-results.json (``--out``); ``--plot`` also writes the latency distributions as a PNG.

Workloads (``--only NAME``, repeatable; the parts are in ``scripts/benchlib/``):

- hot: cache-hit create+delete pairs through the real agent over its unix socket, at
  concurrency 1 (create latency) and 64 (pairs/s), against a bare grpc.aio server answering the
  same requests with the agent's own replies (same transport, sizes and client code); both
  also on uvloop when it is installed. The same agent's Ray door (Ray's HTTP protocol, the
  same client loops) beside its gRPC door, when the checkout has one.
- persistence: the hot workload with state.db and without it (--no-state-db).
- grpc-routes (only with ``--only grpc-routes``): the hot phases on the echo server served five
  ways (``benchlib/echo_server.py``): grpc.aio with the generated servicer (the hot baseline),
  with a generic handler and with handlers registered by method (bytes in, prepared bytes out),
  the sync grpc.server in a thread pool, alone and handing each call to an event loop: the
  measurement behind the gRPC door's route.
- cold-large: one create of an env whose working_dir is a ~60 MB zip (thousands of small files,
  a few large ones) over http from an empty cache, against a sequential aiohttp download +
  zipfile.extractall of the same file, and against curl -o + unzip -q.
- stampede: 50 distinct envs sharing that zip created at once from cold: wall, latencies,
  downloads and extractions, against one cold create.
- loop-blocking: GetRuntimeEnvsInfo every 10 ms while a cold-large install runs, against the
  same calls on the idle agent.
- churn: create+delete pairs over 200 small zips chosen by Zipf(1.1) at concurrency 16 under a
  5 MB budget: pairs/s, hit rate against an exact LRU simulation, unused bytes against the budget.
- worker-starts: raylet_sim's pool starts 500 short-lived workers over 20 installed envs at
  concurrency 8, against the same processes spawned bare; agent RPCs per worker start.
- recovery: start time with 10,000 cached packages against an empty root; RSS with 100,000
  envs in the tables (as many as fit in a bounded time, said so).
- pip: 10 concurrent jobs with one requirement set (a shared venv built once by the agent)
  against one venv per job built at once by the same pip from the same offline wheels: wall
  time and disk bytes.
- shared-wheels: 10 concurrent jobs with distinct requirement sets that all share one 64 MiB
  wheel, as uv envs (one venv each, hardlinked from the root's one wheel cache) against one venv
  per job made with python -m venv and filled by pip, offline: disk bytes (du -sb, the agent's
  whole root) and wall (goals: disk <= 0.2x, wall <= 0.5x).
- shared-root: six agents (the nodes of one machine) on ONE cache root, each creating the same
  envs (4 http working_dir zips) at once, against six agents on six private roots: downloads
  counted at the package server, disk bytes under uris/ (du) and wall, shared/private (goals:
  downloads and disk 1/6, exactly one GET per URI; wall no worse); then cache-hit pairs on a
  node of the shared root (five idle peers alive on it) against a node of a private root
  (goal: per-pair time within 1.1x).
- fleet: eight agents (eight nodes) cold-create the same 20 envs at once from one package
  server whose rate is limited (``--fleet-rate``, all connections together): on eight private
  roots and on one shared root, each against ONE agent creating the same envs from the same
  server: GETs at the server and wall (goals, shared root: one GET per URI, wall <= 1.2x one
  agent; private roots: each node one GET per URI, the wall reported against the link's floor).
- uv-run (only with ``--only uv-run``; needs Ray 2.60 and uv here, minutes and GBs of disk):
  issue 30's user, K experiments at once each a bare ``ray.init()`` under ``uv run`` with a
  ~150 MB dependency, offline, uv's cache hardlinked and copied, on Ray's agent and on this one
  (``benchlib/uv_run.py``): peak disk added against one env (goal <= 1.15x), wall against
  stock (goal <= 0.8x), time to first task, venvs built, what is left in Ray's temp dirs.
- uv-full (only with ``--only uv-full``; root, Ray 2.60 and uv, minutes): issue 39's full disk,
  on a tmpfs made for the run that holds one env but not two (the Ray temp dirs, TMPDIR, the
  agent's root, uv's cache): K experiments on lock A under ``uv run``, one on lock B launched
  while they run, B again once they ended; on Ray's agent (the baseline, recorded) and on this
  one (``benchlib/uv_full.py``): tasks, driver outputs and worker logs that saw ENOSPC (goal 0),
  B refused with a RuntimeEnvSetupError naming the bytes needed, free and the setting, within
  60 s; no venv left half-built, nothing in staging; A untouched; B's relaunch runs.
- uv-scale (only with ``--only uv-scale``; Ray 2.60 and uv here, tens of minutes and ~10 GB of
  disk): issue 39's user, K=5 experiments (``--uv-scale-experiments``, launched
  ``--uv-scale-stagger`` s apart) each a bare ``ray.init()`` under ``uv run`` on numpy, scipy,
  pandas and scikit-learn (``--heavy``: and torch with its CUDA wheels), offline from a
  wheelhouse filled once from the index, three rounds on one root (round 1 cold), in round 2 a
  driver and another experiment's raylet SIGKILLed and relaunched; Ray's agent and this one
  (``benchlib/uv_scale.py``): peak disk added against one env (goal <= 1.1x), warm time to
  first task against stock (goal <= 0.7x), tasks failed, workers unregistered, CPU by role,
  left-overs, relaunches reusing the env. ``--plant-scale`` plants a second venv for one lock.

The peer run, ``--peer ray`` (needs ray and smart_open): Ray 2.60's own runtime env agent, in a
real Ray head node started for the run, next to this agent's Ray door (``serve --ray-address``),
both spoken to in Ray's HTTP protocol by the same client code; every figure is a ratio to Ray's
agent (``benchlib/peer.py``):

- peer-hot: the hot workload over HTTP at concurrency 1 and 64, with each agent's CPU per
  request; this agent's gRPC door beside them for context.
- peer-cold-large, peer-stampede, peer-loop-blocking (GetRuntimeEnvsInfo during an install),
  peer-churn (the same cache budget on both): as above, on each agent.
- peer-e2e: a Ray node runs 500 tasks over 50 runtime envs sharing 5 http working_dir zips,
  once with Ray's agent and once on this agent (its launcher): wall time, time to first task.

``--check`` exits 1 when a goal of the run is missed (or a workload failed).

The disk of a shared machine can be slow for minutes after mass deletions and the page cache
drops idle files, so: each package is read through just before it is timed, file creation next
to the cache is probed (and printed) before each workload, every baseline runs next to its
measurement, nothing is deleted until the end, and ``--workdir`` (e.g. /dev/shm) puts the run
where runs are comparable. ``--smoke`` shrinks everything (the test suite runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchlib.churn import bench_churn
from benchlib.cold import bench_cold_large, bench_loop_blocking, bench_stampede
from benchlib.config import SMOKE, Sizes, with_overrides
from benchlib.figures import WorkloadResult, fmt, plot, plot_unavailable, table, write_json
from benchlib.fleet import bench_fleet
from benchlib.hot import bench_grpc_routes, bench_hot, bench_persistence
from benchlib.peer import (
    bench_peer_churn,
    bench_peer_cold_large,
    bench_peer_e2e,
    bench_peer_hot,
    bench_peer_loop_blocking,
    bench_peer_stampede,
    peer_unavailable,
)
from benchlib.pipenv import bench_pip
from benchlib.procs import probe_file_creation, uvloop_available
from benchlib.recovery import bench_recovery
from benchlib.shared import Shared
from benchlib.shared_root import bench_shared_root
from benchlib.shared_wheels import bench_shared_wheels
from benchlib.uv_full import bench_uv_full
from benchlib.uv_run import bench_uv_run
from benchlib.uv_scale import bench_uv_scale
from benchlib.workers import bench_worker_starts

from agent.ops.usage import OneLineParser

Workload = Callable[[Path, Sizes, Shared], Awaitable[WorkloadResult]]

WORKLOADS: dict[str, Workload] = {
    "hot": lambda work, sizes, shared: bench_hot(work, sizes),
    "persistence": lambda work, sizes, shared: bench_persistence(work, sizes),
    "cold-large": bench_cold_large,
    "stampede": bench_stampede,
    "loop-blocking": bench_loop_blocking,
    "churn": bench_churn,
    "worker-starts": lambda work, sizes, shared: bench_worker_starts(work, sizes),
    "recovery": lambda work, sizes, shared: bench_recovery(work, sizes),
    "pip": lambda work, sizes, shared: bench_pip(work, sizes),
    "shared-wheels": lambda work, sizes, shared: bench_shared_wheels(work, sizes),
    "shared-root": bench_shared_root,
    "fleet": bench_fleet,
}

# --peer ray: this agent next to Ray's own agent
PEER_WORKLOADS: dict[str, Workload] = {
    "peer-hot": bench_peer_hot,
    "peer-cold-large": bench_peer_cold_large,
    "peer-stampede": bench_peer_stampede,
    "peer-loop-blocking": bench_peer_loop_blocking,
    "peer-churn": bench_peer_churn,
    "peer-e2e": bench_peer_e2e,
}
# run only when named (--only): experiments behind a design choice, not figures of the agent
EXPERIMENTS: dict[str, Workload] = {
    "grpc-routes": lambda work, sizes, shared: bench_grpc_routes(work, sizes),
}
# run only when named (--only): heavy user scenarios (minutes, GBs of disk)
SCENARIOS: dict[str, Workload] = {
    "uv-run": lambda work, sizes, shared: bench_uv_run(work, sizes),
    "uv-full": lambda work, sizes, shared: bench_uv_full(work, sizes),
    "uv-scale": lambda work, sizes, shared: bench_uv_scale(work, sizes),
}
ALL_WORKLOADS = {**WORKLOADS, **PEER_WORKLOADS, **EXPERIMENTS, **SCENARIOS}


async def run(args: argparse.Namespace, sizes: Sizes) -> int:
    base = Path(args.workdir) if args.workdir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rtenv-bench-", dir=base))
    print(f"work folder {work} (nothing in it is deleted until the end)", flush=True)
    results: list[WorkloadResult] = []
    failed: list[str] = []
    shared = Shared(work, sizes)
    started = time.monotonic()
    try:
        default = list(PEER_WORKLOADS) if args.peer else list(WORKLOADS)
        for name in args.only or default:
            folder = work / name
            folder.mkdir()
            rate = await asyncio.to_thread(probe_file_creation, folder / "probe")
            load = os.getloadavg()[0]
            print(
                f"[{name}] file creation next to the cache: {rate:,.0f} files/s; "
                f"load average {load:.2f}",
                flush=True,
            )
            t0 = time.monotonic()
            try:
                result = await ALL_WORKLOADS[name](folder, sizes, shared)
            except Exception:
                failed.append(name)
                print(f"[{name}] FAILED:\n{traceback.format_exc()}", flush=True)
                continue
            result.disk_probe_files_per_s = rate
            result.load_average = load
            result.seconds = time.monotonic() - t0
            results.append(result)
            for f in result.figures:
                ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
                print(f"[{name}] {f.metric}: {fmt(f.value)} {f.unit} ({ratio})", flush=True)
            print(f"[{name}] done in {result.seconds:.0f}s", flush=True)
    finally:
        await shared.close()
        if args.keep:
            print(f"kept {work}")
        else:  # the mass deletion, at the very end
            await asyncio.to_thread(shutil.rmtree, work, True)
    elapsed = time.monotonic() - started
    print()
    print(table(results))
    print(f"\n{len(results)} workloads in {elapsed:.0f}s; {', '.join(failed) or 'none'} failed")
    meta = {
        "machine": _machine(),
        "seconds": elapsed,
        "smoke": args.smoke,
        "peer": args.peer,
        "workdir": str(base),
        "uvloop_installed": uvloop_available(),
        "failed": failed,
        "sizes": sizes.to_json(),
        "disk_probe_files_per_s": {r.name: r.disk_probe_files_per_s for r in results},
    }
    out = Path(args.out)
    write_json(out, results, meta)
    print(f"wrote {out}")
    if args.plot is not None:
        png = Path(args.plot) if args.plot else out.with_suffix(".png")
        problem = plot(png, results)
        if problem:
            print(problem, file=sys.stderr)
            return 2
        print(f"wrote {png}")
    missed = [f for r in results for f in r.figures if f.goal is not None and not f.goal_met]
    if args.check and missed:
        print(f"--check: {len(missed)} goals missed", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _machine() -> dict[str, object]:
    """What the numbers were measured on (context for the absolute times)."""
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "load_average_at_end": os.getloadavg(),
        "unzip": shutil.which("unzip") is not None,
    }


def _parser() -> argparse.ArgumentParser:
    d = Sizes()
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=list(ALL_WORKLOADS), help="run this workload")
    p.add_argument(
        "--peer",
        choices=["ray"],
        help="run the peer workloads: this agent next to Ray's own agent in a Ray node",
    )
    p.add_argument(
        "--check", action="store_true", help="exit 1 when a goal is missed or a workload fails"
    )
    p.add_argument("--out", default="bench-results.json", help="the JSON results file")
    p.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        metavar="PNG",
        help="write the latency distributions as a PNG (default: --out with .png); "
        "needs matplotlib (pip install -e '.[bench]')",
    )
    p.add_argument("--workdir", help="where the run's files go (default: the temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run's files")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script works")
    p.add_argument("--no-uvloop", action="store_true", help="do not measure uvloop")
    p.add_argument(
        "--plant",
        dest="uv_run_plant",
        action="store_true",
        default=None,
        help="uv-run: the last experiment's project depends on another version of its large "
        "dependency (its own lock): the one-venv goal must miss",
    )
    p.add_argument(
        "--uv-full-ours-only",
        dest="uv_full_ours_only",
        action="store_true",
        default=None,
        help="uv-full: this agent's round alone (no stock Ray round: its baselines are NaN)",
    )
    p.add_argument(
        "--heavy",
        dest="uv_scale_heavy",
        action="store_true",
        default=None,
        help="uv-scale: the stack adds torch with its CUDA wheels (downloads GBs once)",
    )
    p.add_argument(
        "--plant-scale",
        dest="uv_scale_plant",
        action="store_true",
        default=None,
        help="uv-scale: the last experiment's line (uv run --locked) makes this agent build a "
        "second venv for the same lock: the oracle must fail naming it",
    )
    knobs = p.add_argument_group("sizes (defaults: the full run; --smoke shrinks them all)")
    for flag, name, kind in (
        ("--hot-rounds", "hot_rounds", int),
        ("--cold-rounds", "cold_rounds", int),
        ("--cold-link-rate", "cold_link_rate", int),
        ("--seed", "seed", int),
        ("--hot-pairs-c1", "hot_pairs_c1", int),
        ("--hot-pairs-c64", "hot_pairs_c64", int),
        ("--stampede-envs", "stampede_envs", int),
        ("--churn-pairs", "churn_pairs", int),
        ("--churn-zips", "churn_zips", int),
        ("--churn-budget", "churn_budget_bytes", int),
        ("--rows", "recovery_rows", int),
        ("--recovery-rounds", "recovery_rounds", int),
        ("--rss-envs", "rss_envs", int),
        ("--rss-seconds", "rss_time_limit_s", float),
        ("--worker-starts", "worker_starts", int),
        ("--worker-envs", "worker_envs", int),
        ("--fleet-nodes", "fleet_nodes", int),
        ("--fleet-envs", "fleet_envs", int),
        ("--fleet-package-bytes", "fleet_package_bytes", int),
        ("--fleet-rate", "fleet_rate_bytes", int),
        ("--fleet-rounds", "fleet_rounds", int),
        ("--e2e-tasks", "e2e_tasks", int),
        ("--e2e-envs", "e2e_envs", int),
        ("--e2e-zips", "e2e_zips", int),
        ("--e2e-rounds", "e2e_rounds", int),
        ("--uv-run-experiments", "uv_run_experiments", int),
        ("--uv-run-big-mib", "uv_run_big_mib", float),
        ("--uv-full-experiments", "uv_full_experiments", int),
        ("--uv-full-big-mib", "uv_full_big_mib", float),
        ("--uv-scale-experiments", "uv_scale_experiments", int),
        ("--uv-scale-stagger", "uv_scale_stagger_s", float),
    ):
        parse = kind if name in ("seed", "uv_scale_stagger_s") else _above_zero(kind)
        knobs.add_argument(flag, dest=name, type=parse, help=f"default {getattr(d, name)}")
    return p


def _above_zero(kind: Callable[[str], float]) -> Callable[[str], float]:
    """A size knob's parser: a number of ``kind`` above 0 (a size of 0 or less sizes nothing:
    said at once, in one line, exit 2, not as a workload's traceback minutes later)."""
    what = "whole number" if kind is int else "number"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be a {what} above 0, not {text[:40]!r}")
        return value

    return parse


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    if args.plot is not None and (problem := plot_unavailable()):
        parser.error(problem)  # before the run, not after minutes of it; exit 2
    peer_only = [name for name in args.only or [] if name in PEER_WORKLOADS]
    if peer_only and not args.peer:
        parser.error(f"--only {peer_only[0]} is a peer workload: add --peer ray")
    if args.peer and (problem := peer_unavailable()):
        parser.error(problem)
    sizes = with_overrides(SMOKE if args.smoke else Sizes(), vars(args))
    if args.no_uvloop:
        sizes = with_overrides(sizes, {"uvloop": False})
    return asyncio.run(run(args, sizes))


if __name__ == "__main__":
    sys.exit(main())
