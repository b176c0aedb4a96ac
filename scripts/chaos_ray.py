"""Chaos on real Ray: K local clusters on one shared agent root, killed at every point.

Stock Ray nodes run this agent through its switch (``rtenv-agent ray enable --root ROOT`` in a
python that has Ray): two drivers each start their own one-node cluster with a bare
``ray.init()``, a third a three-node ``ray.cluster_utils.Cluster``, all on one root on a sized
file system made for the run (a tmpfs: the runner can fill it for a moment). Each driver runs a
seeded mix of tasks and actors over working_dir, py_modules (zips and a wheel), pip and uv envs
that share packages, under a small cache budget, and each unit of work checksums what its env
gave it, twice. Meanwhile the runner SIGKILLs raylets, GCSes, keepers, agents, drivers and
workers, SIGSTOPs agents, fills the disk, and has the package server stall, reset and answer
500; relaunched clusters sometimes arm a crash point in their agents. The oracle
(``chaosray.oracle``) tells the failures the run caused from the others; the root is looked at
in every round's quiet point and once its clusters stopped (``chaosray.checks``). Any violation
fails the run (exit 1). The seed is printed; ``--seed`` replays the same draws.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
for _path in (str(SCRIPTS), str(REPO)):
    if _path not in sys.path:
        sys.path.append(_path)

from benchlib import small_disk  # noqa: E402
from chaosray import server, workload  # noqa: E402
from chaosray.attempts import Cluster  # noqa: E402
from chaosray.faults import World  # noqa: E402
from chaosray.run import Plan, Rig, Tally, run  # noqa: E402
from chaosray.server_faults import ServerFaults  # noqa: E402

from agent.ops.usage import OneLineParser  # noqa: E402
from agent.plant import DEFECTS  # noqa: E402
from tests.harness import ray_switch  # noqa: E402
from tests.harness.ray_nodes import base_environ  # noqa: E402

DRIVER = SCRIPTS / "chaosray" / "driver.py"
MiB = 2**20


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="chaos_ray", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None, help="replay these draws (default: random)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs across the run")
    p.add_argument("--tasks", type=int, default=16, help="units of work per driver attempt")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--round-s", type=float, default=480.0, help="a round's deadline")
    p.add_argument("--budget-mib", type=int, default=3, help="the root's cache budget")
    p.add_argument("--disk-mib", type=int, default=2048, help="the run's file system")
    p.add_argument("--crash-share", type=float, default=0.3)
    p.add_argument("--nodes", type=int, default=3, help="nodes of the Cluster")
    p.add_argument(
        "--plant", choices=sorted(DEFECTS), default=None,
        help="plant this defect in every agent (RTENV_PLANT): the run must fail",
    )  # fmt: skip
    p.add_argument(
        "--events", type=Path, default=None,
        help="write every fault, outcome and attempt's end here (JSON lines)",
    )  # fmt: skip
    return p


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    for name, low in (("rounds", 1), ("kills", 0), ("tasks", 1), ("concurrency", 1),
                      ("budget_mib", 1), ("disk_mib", 256), ("nodes", 1)):  # fmt: skip
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(a, name)}")
    if not 0 <= a.crash_share <= 1:
        p.error(f"--crash-share must be between 0 and 1, got {a.crash_share}")
    if not a.round_s > 0:
        p.error(f"--round-s must be a number of seconds above 0, got {a.round_s}")


def _summary(seed: int, tally: Tally, verdict_lines: list[str], took: float, rounds: int) -> str:
    injected = ", ".join(f"{n} {k}" for k, n in sorted(tally.injected.items()))
    kills = ", ".join(f"{n} {k}" for k, n in sorted(tally.kills.items()))
    return "\n".join(
        [
            f"seed {seed}: {tally.rounds_done} of {rounds} rounds in {took:.0f} s",
            f"kills        {sum(tally.kills.values())}: {kills or 'none'}",
            f"injected     {injected or 'nothing'}",
            *verdict_lines,
        ]
    )


def _write_events(path: Path, tally: Tally, hook: ServerFaults) -> None:
    """Every fault (the server's too), outcome and attempt's end, one JSON object a line."""
    rows: list[tuple[str, object]] = [("fault", f) for f in tally.faults]
    rows += [("server", f) for f in hook.faults]
    rows += [("outcome", o) for o in tally.outcomes]
    rows += [("end", e) for e in tally.ends]
    with path.open("w") as out:
        for what, row in rows:
            out.write(json.dumps({"what": what, **dataclasses.asdict(row)}) + "\n")  # type: ignore[call-overload]


async def _main(a: argparse.Namespace, seed: int) -> int:
    rng = random.Random(seed)
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):  # stopped: its clusters and file system go too
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    mount = small_disk.make_small_disk(a.disk_mib * MiB)
    venvs = Path(tempfile.mkdtemp(prefix="chaos-ray-venvs-"))
    started = time.monotonic()
    try:
        root = mount / "root"
        try:
            _, python = ray_switch.switched(venvs, root)
        except RuntimeError as exc:
            print(f"chaos_ray: the switch: {exc}", file=sys.stderr)
            return 1
        material = workload.material(seed)
        hook = ServerFaults(material.routes(), rng)
        async with server.serve(material, hook) as base_url:
            cases = [
                {"name": c.name, "runtime_env": c.runtime_env, "expect": c.expect,
                 "paths": list(c.paths)}
                for c in workload.env_cases(material, base_url)
            ]  # fmt: skip
            clusters = []
            for i, (mode, nodes) in enumerate((("init", 1), ("init", 1), ("cluster", a.nodes))):
                (mount / f"c{i}").mkdir()
                clusters.append(Cluster(i, mode, nodes, mount / f"c{i}" / "r"))
            env = base_environ(
                RTENV_CACHE_BUDGET=str(a.budget_mib * MiB),
                RAY_gcs_rpc_server_reconnect_timeout_s="10",
                # no idle workers started ahead: every unit has an env of its own (2 cores)
                RAY_enable_worker_prestart="0",
                RAY_prestart_worker_first_driver="0",
                NO_PROXY="127.0.0.1,localhost",
                **({"RTENV_PLANT": a.plant} if a.plant else {}),
            )
            world = World(
                rng, hook, lambda size: small_disk.resize(mount, size),
                lambda: small_disk.used_bytes(mount), [],
            )  # fmt: skip
            plan = Plan(seed, a.rounds, a.kills, a.tasks, a.concurrency, a.round_s,
                        a.crash_share, a.budget_mib * MiB)  # fmt: skip

            def said(r: int, t: Tally) -> None:
                took = time.monotonic() - started
                kills = sum(t.kills.values())
                print(f"round {r} at {took:.0f} s: {kills} kills, "
                      f"{len(t.violations)} violations so far", flush=True)  # fmt: skip

            rig = Rig(clusters, str(python), DRIVER, env, cases, root, world, on_round=said)
            tally, verdict = await run(plan, rig)
            if a.events is not None:
                _write_events(a.events, tally, hook)
        explained = ", ".join(f"{n} by {k}" for k, n in sorted(verdict.explained.items()))
        lines = [
            f"units        {verdict.ok} ok, {verdict.failed} failed "
            f"({explained or 'none explained'})",
            f"violations   {len(verdict.violations)}",
            *(f"  {v}" for v in verdict.violations[:40]),
            *(f"note: {n}" for n in tally.notes[:20]),
            *([f"planted      {a.plant} (RTENV_PLANT): the run must fail"] if a.plant else []),
        ]
        print(_summary(seed, tally, lines, time.monotonic() - started, a.rounds))
        return 1 if verdict.violations else 0
    finally:
        small_disk.remove_small_disk(mount)
        shutil.rmtree(venvs, ignore_errors=True)  # the switch's files go with its venv


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    _check(p, a)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
    print(f"chaos_ray: seed {seed}", flush=True)
    if os.geteuid() != 0:
        p.error("the run mounts a tmpfs of its own: it needs root")
    try:
        return asyncio.run(_main(a, seed))
    except asyncio.CancelledError:  # SIGTERM or SIGINT: what it started is gone
        print("chaos_ray: stopped; its clusters and file system removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
