"""The `uv run` user's path on this agent (issue 30), offline, with real uv and real Ray (2.60,
and 2.51.1 in CI's old-Ray venv, whose hook writes the line without ``python``): a
project's ``.venv`` switched once (``rtenv-agent ray enable``), then unmodified drivers (a bare
``ray.init(num_cpus=2)``) started with ``uv run --offline python launch.py``.

What is pinned: no worker runs uv (each runs the project venv the agent built in its root, with
``VIRTUAL_ENV`` set), and that venv is counted in the root's index at its true size; two
experiments whose folders differ by one file share that venv; one whose lock differs gets its
own; what a worker writes into its working dir is counted once the job is done; the root keeps
no socket of the finished clusters. The stock baseline (each worker under ``uv run``) is
``tests/test_ray_uv_run.py``'s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.ray_wheelhouse import big_wheel, ray_wheelhouse
from tests.harness.tempdirs import ray_tempdir
from tests.harness.uv_projects import (
    UV,
    Project,
    check_driver_facts,
    kill_all,
    launch_command,
    leftover_processes,
    make_project,
    parse_facts,
    processes_naming,
    ray_environ,
    run_uv,
    worker_facts,
    workers_running_uv,
)

DRIVER_S = 240.0
BIG_MIB = 1
WRITE_MIB = 10  # what the first task of an experiment writes into its working dir

pytestmark = [
    pytest.mark.skipif(not UV.is_file(), reason=f"needs uv beside this python ({UV})"),
    # a test runs up to three drivers in turn, each bounded by DRIVER_S: pytest's 120 s cut
    # the third of one (72 s on a quiet run) when CI's other worker and a Ray run shared the cores
    pytest.mark.timeout(600),
]


@dataclass
class Machine:
    """One machine of the user's: a shared agent root, uv's cache, the offline wheels."""

    base: Path
    root: Path
    links: list[Path]
    env: dict[str, str]

    def experiment(self, name: str, note: str, **kw: Any) -> Project:
        """A project folder, its .venv synced offline and switched to this agent."""
        project = make_project(self.base / name, self.links, self.env, note=note, **kw)
        run_uv(["sync", "--offline", "--quiet"], project.path, self.env)
        done = subprocess.run(
            [sys.executable, "-m", "agent", "ray", "enable", "--python",
             str(project.venv / "bin" / "python"), "--root", str(self.root)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return project

    def run(self, project: Project, write_mib: int = 0) -> list[dict[str, Any]]:
        """The user's command in the project; the driver's facts (it must succeed)."""
        ray_tmp = self.base / "r"
        env = {**self.env, "EXPERIMENT_WRITE_MIB": str(write_mib)}
        try:
            done = subprocess.run(
                launch_command(), cwd=project.path, env=env, capture_output=True, text=True,
                timeout=DRIVER_S, check=False,
            )  # fmt: skip
        finally:
            left = leftover_processes(ray_tmp, timeout_s=30)
        said = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        assert done.returncode == 0, said
        assert left == [], left
        facts = parse_facts(done.stdout)
        assert check_driver_facts(facts, BIG_MIB * 2**20) == [], said
        return facts

    def index(self) -> dict[str, Any]:
        """The root's index as ``rtenv-agent info --root --json`` reads it."""
        done = subprocess.run(
            [sys.executable, "-m", "agent", "info", "--root", str(self.root), "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    base = ray_tempdir()  # Ray's socket paths live under it: short
    try:
        links = base / "links"
        big_wheel(links, BIG_MIB)
        big_wheel(links, BIG_MIB, version="2.0", seed=1)
        (base / "tmp").mkdir()
        env = ray_environ(base / "uv-cache", base / "r", TMPDIR=str(base / "tmp"))
        yield Machine(base, base / "root", [ray_wheelhouse().path, links], env)
    finally:
        kill_all(processes_naming(base / "r"))
        shutil.rmtree(base, ignore_errors=True)


def project_venvs(machine: Machine) -> list[Path]:
    return sorted((machine.root / "uris").glob("uv_project-*"))


def test_after_the_switch_no_worker_runs_uv_and_the_venv_is_the_agents_and_counted(
    machine: Machine,
) -> None:
    """Each worker runs the project venv the agent built in its root (VIRTUAL_ENV set, the
    dependency imported from it), none under uv run; the index counts that venv whole."""
    project = machine.experiment("exp-a", "experiment a")
    facts = machine.run(project)
    assert workers_running_uv(facts) == []
    (venv,) = project_venvs(machine)
    for fact in worker_facts(facts):
        assert fact["executable"] == str(venv / "bin" / "python"), fact
        assert fact["virtual_env"] == str(venv), fact
        assert Path(fact["bigdep_file"]).is_relative_to(venv), fact
    index = machine.index()
    (row,) = [u for u in index["packages"] if u["kind"] == "uv_project"]
    assert row["size_bytes"] >= BIG_MIB * 2**20
    assert not list(machine.root.glob("agent-*.sock")), "a finished cluster's socket is left"


def test_folders_differing_by_a_file_share_the_venv_and_another_lock_gets_its_own(
    machine: Machine,
) -> None:
    """A second experiment whose folder differs by one file runs on the first one's venv; one
    whose lock names another version of the dependency gets a venv of its own."""
    first = machine.experiment("exp-b1", "experiment b, run 1")
    machine.run(first)
    shared = project_venvs(machine)
    second = machine.experiment("exp-b2", "experiment b, run 2", lock_from=first)
    facts = machine.run(second)
    assert project_venvs(machine) == shared
    assert {f["executable"] for f in worker_facts(facts)} <= {
        str(v / "bin" / "python") for v in shared
    }
    other = machine.experiment("exp-c", "experiment c", big_version="2.0")
    facts = machine.run(other)
    assert len(project_venvs(machine)) == len(shared) + 1
    assert {f["bigdep_version"] for f in worker_facts(facts)} == {"2.0"}


def test_what_a_worker_writes_into_its_working_dir_is_counted_once_the_job_is_done(
    machine: Machine,
) -> None:
    """A task writes 10 MiB into its working dir (the shared package folder); after the job,
    the root's index counts that package at its real size."""
    project = machine.experiment("exp-w", "experiment w")
    facts = machine.run(project, write_mib=WRITE_MIB)
    cwd = {f["cwd"] for f in worker_facts(facts)}
    (folder,) = cwd
    index = machine.index()
    (row,) = [u for u in index["packages"] if u["kind"] == "working_dir" and u["dir"] in folder]
    assert row["size_bytes"] >= WRITE_MIB * 2**20
