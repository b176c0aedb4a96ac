"""The benchmark still works: ``scripts/bench.py --smoke`` (every workload, tiny sizes) exits 0
within a minute and writes a results file with every workload's figures, baselines, ratios and
goals. The full benchmark is not run in CI; its latest table is in the README."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import short_tempdir

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "hot", "persistence", "cold-large", "stampede", "loop-blocking", "churn", "worker-starts",
    "recovery", "pip",
}  # fmt: skip
WITH_GOALS = WORKLOADS - {"recovery", "pip"}  # the issues set no goal on these figures


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def test_the_benchmark_runs_every_workload_with_tiny_sizes_and_reports_them() -> None:
    base = short_tempdir()  # short: the agents' unix sockets live inside it
    out = base / "bench-results.json"
    png = base / "latency.png"
    args = [
        sys.executable, "scripts/bench.py", "--smoke", "--out", str(out),
        "--workdir", str(base / "work"),
    ]  # fmt: skip
    plotting = importlib.util.find_spec("matplotlib") is not None
    if plotting:
        args += ["--plot", str(png)]
    try:
        started = time.monotonic()
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=120, cwd=REPO, check=False
        )
        elapsed = time.monotonic() - started
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        assert elapsed < 60, f"the smoke run took {elapsed:.0f}s"
        assert "GOAL" in proc.stdout
        assert "goals: " in proc.stdout
        doc = json.loads(out.read_text())
        assert set(doc["workloads"]) == WORKLOADS
        assert doc["meta"]["failed"] == []
        for name, workload in doc["workloads"].items():
            assert workload["figures"], f"{name} reported no figure"
            for fig in workload["figures"]:
                where = f"{name}: {fig['metric']}"
                for key in ("value", "baseline", "ratio"):
                    assert _number(fig[key]), f"{where}: {key} is {fig[key]!r}"
                assert fig["baseline_name"], where
                assert "goal" in fig, where
                assert "goal_met" in fig, where
                if fig["goal"] is not None:
                    assert isinstance(fig["goal_met"], bool), where
            if name in WITH_GOALS:
                assert any(f["goal"] for f in workload["figures"]), f"{name} has no goal"
            assert workload["measures"], f"{name} reported no measure"
            for measure in workload["measures"]:
                assert _number(measure["wall_s"]), f"{name}: {measure}"
                assert measure["errors"] == 0, f"{name}: {measure}"
            assert _number(workload["disk_probe_files_per_s"])
        # the work folder is deleted at the end of a run
        assert not any((base / "work").iterdir())
        if plotting:
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_plot_without_matplotlib_is_refused_before_the_run(base: Path) -> None:
    """--plot where matplotlib cannot be imported: one usage error and exit 2 at once, not
    after the whole benchmark (a stand-in matplotlib that fails to import hides a real one)."""
    shadow = base / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    args = [
        sys.executable, "scripts/bench.py", "--smoke", "--plot", str(base / "p.png"),
        "--out", str(base / "out.json"), "--workdir", str(base / "work"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(base / "shadow")}
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--plot needs matplotlib" in proc.stderr
    assert proc.stdout == "", "the benchmark started"
    assert not (base / "work").exists()
    assert not (base / "out.json").exists()


async def test_the_ray_transport_runs_pairs_against_this_agents_ray_door(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's Ray HTTP transport (``benchlib.ray_http``) against a real agent's Ray
    door: pairs at concurrency 4 over one keep-alive session without an error, the held
    reference shows in GetRuntimeEnvsInfo with its count, and a FAILED reply (a delete of a
    string that holds no count) is a failed call, not a success."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from benchlib import rpc
    from benchlib.procs import AgentProcess
    from benchlib.ray_http import RayHttpTarget

    env = json.dumps({"env_vars": {"BENCH": "1"}})
    async with (
        AgentProcess(base / "root", ray_door=True) as agent,
        RayHttpTarget(agent.ray_address, connections=4) as target,
    ):
        assert await target.create(env, 30) == env  # held: Ray gives references back by string
        calls = await rpc.pairs(target, lambda i: env, 40, 4, deadline_s=time.monotonic() + 60)
        assert (calls.pairs, calls.errors) == (40, 0), calls.error_sample
        assert len(calls.create_s) == 40
        info = await target.info(10, limit=None)
        assert [(s.runtime_env, s.ref_cnt) for s in info.runtime_env_states] == [(env, 1)]
        with pytest.raises(rpc.CallFailed, match="delete FAILED"):
            await target.delete(json.dumps({"env_vars": {"BENCH": "2"}}), 10)


def test_a_peer_workload_without_peer_ray_is_refused_before_the_run(base: Path) -> None:
    """--only peer-hot without --peer ray: one usage error and exit 2, nothing started."""
    args = [
        sys.executable, "scripts/bench.py", "--only", "peer-hot",
        "--out", str(base / "out.json"), "--workdir", str(base / "work"),
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "add --peer ray" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (base / "work").exists()
