"""The `uv run` user's path, offline, with real uv and real Ray 2.60 (issue 30): a project folder
whose ``pyproject.toml`` depends on Ray and a large package, its driver a bare
``ray.init(num_cpus=2)`` started with ``uv run --offline python launch.py``.

The baseline pinned here is stock Ray's, with Ray's own agent: its uv-run hook gives the job
``py_executable = "<uv> run ... python"`` and the driver's folder as working_dir, so every
worker runs ``uv run`` in its copy of the working_dir and gets a ``.venv`` built there, under
Ray's temp dir. (The agent's `uv run` build, issue 30 item 1, changes exactly that:
``workers_running_uv(facts) == []``.)

The wheels come from ``tests/harness/ray_wheelhouse.py`` (Ray and its core dependencies
repacked from this interpreter's environment, cached per machine user), the project from
``tests/harness/uv_projects.py``; uv's cache and Ray's temp dir are short temp folders of the
test's own, and whatever the driver's cluster left running is found by its temp dir's path and
SIGKILLed by PID.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.harness.ray_wheelhouse import big_wheel, ray_wheelhouse
from tests.harness.tempdirs import ray_tempdir
from tests.harness.uv_projects import (
    UV,
    check_driver_facts,
    job_py_executable,
    kill_all,
    leftover_processes,
    make_project,
    parse_facts,
    processes_naming,
    ray_environ,
    run_driver,
    worker_facts,
    workers_running_uv,
)

DRIVER_S = 240.0  # the driver's uv run, its cluster's start, the workers' venvs, the tasks
BIG_MIB = 1

pytestmark = pytest.mark.skipif(not UV.is_file(), reason=f"needs uv beside this python ({UV})")


def test_stock_ray_runs_a_uv_run_project_offline_each_worker_under_uv_run_in_its_working_dir() -> (
    None
):
    base = ray_tempdir()  # Ray's socket paths live under it: short
    ray_tmp = base / "r"
    try:
        links = base / "links"
        big_wheel(links, BIG_MIB)
        (base / "tmp").mkdir()  # uv's lock files go to TMPDIR
        env = ray_environ(base / "uv-cache", ray_tmp, TMPDIR=str(base / "tmp"))
        project = make_project(
            base / "exp", [ray_wheelhouse().path, links], env, note="experiment 1"
        )
        try:
            done = run_driver(project, env, DRIVER_S)
        finally:
            left = leftover_processes(ray_tmp, timeout_s=30)
        said = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        assert done.returncode == 0, said
        facts = parse_facts(done.stdout)
        assert check_driver_facts(facts, BIG_MIB * 2**20) == [], said
        # Ray's uv-run hook gave the job a `uv run` python
        assert job_py_executable(facts).split()[1:2] == ["run"], job_py_executable(facts)
        # the stock baseline: every worker ran under uv run, from a .venv in its working_dir
        # copy under Ray's temp dir (the agent's build flips this to no worker at all)
        workers = worker_facts(facts)
        assert len(workers_running_uv(facts)) == len(workers) == 5
        for fact in workers:
            venv = Path(fact["virtual_env"])
            assert venv == Path(fact["cwd"]) / ".venv", fact
            assert venv.is_relative_to(ray_tmp.resolve()), fact
            assert Path(fact["executable"]).is_relative_to(venv), fact
        # and nothing of the cluster outlived its driver
        assert left == []
    finally:
        kill_all(processes_naming(ray_tmp))
        shutil.rmtree(base, ignore_errors=True)
