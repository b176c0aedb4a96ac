"""The Ray chaos run's driver (scripts/chaosray/driver.py) on real Ray nodes that run THIS agent
through the Ray switch (``rtenv-agent ray enable --python P --root ROOT``), with no fault: every
unit of every env case (working_dirs, py_modules zips and wheels, pip and uv venvs from a PEP
503 index, mixes) ends ok, and each task saw exactly its env's files at both looks, with a
bare ``ray.init()`` ("init"); and a decoy case whose view is wrong on purpose is reported
exactly. The three-node ``ray.cluster_utils.Cluster`` ("cluster") runs every case in the chaos
run's short form (tests/test_chaos_ray.py), which fails if a case never ran ok. The package
server is the run's own, on 127.0.0.1.

Each driver runs in a session of its own with a short ``RAY_TMPDIR`` of its own; whatever names
that folder afterwards is SIGKILLed by PID, never ``ray stop``."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.harness.ray_nodes import RAY_RELEASE, base_environ
from tests.harness.ray_switch import switched as switched_python
from tests.harness.uv_projects import kill_all, processes_naming

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the runner's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from chaosray.server import serve  # noqa: E402
from chaosray.workload import EnvCase, env_cases, material  # noqa: E402

pytestmark = [
    pytest.mark.timeout(600),  # a driver's nodes, 15 envs built, 4 of them venvs
    pytest.mark.skipif(
        RAY_RELEASE < (2, 56), reason="Ray's driver takes http:// URIs from 2.56 on"
    ),
]
DRIVER = _SCRIPTS / "chaosray" / "driver.py"
DRIVER_S = 480.0  # the whole driver process
SEED = 11


@dataclass(frozen=True)
class Switched:
    agent_python: Path
    python: Path  # a python with Ray, the switch on: its nodes run this agent
    root: Path


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Switched:
    base = tmp_path_factory.mktemp("chaosray")
    root = base / "root"
    agent_python, python = switched_python(base, root)
    return Switched(agent_python, python, root)


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short RAY_TMPDIR (Ray's socket paths must fit in 107 bytes); its processes killed."""
    temp = Path(tempfile.mkdtemp(prefix="crd-", dir="/tmp"))
    try:
        yield temp
    finally:
        kill_all(processes_naming(temp))
        shutil.rmtree(temp, ignore_errors=True)


def _environ(ray_tmp: Path) -> dict[str, str]:
    """A user's shell (no PYTHONPATH, no RTENV_*), its own RAY_TMPDIR and a TMPDIR in it."""
    temp = ray_tmp / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    env = base_environ(RAY_TMPDIR=str(ray_tmp), TMPDIR=str(temp))
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "RTENV_ROOT"):
        env.pop(name, None)
    return env


def _drive(python: Path, spec: dict[str, Any], work: Path, ray_tmp: Path) -> tuple[int, str, str]:
    """Run the driver on ``spec`` in a session of its own, bounded; then SIGKILL whatever names
    its RAY_TMPDIR. Its exit code, stdout and stderr's tail."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(spec))
    try:
        done = subprocess.run(
            [str(python), str(DRIVER), str(work / "spec.json")], cwd=work, env=_environ(ray_tmp),
            capture_output=True, text=True, timeout=DRIVER_S, start_new_session=True, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise AssertionError(f"the driver did not end in {DRIVER_S} s: {out[-3000:]}") from None
    finally:
        kill_all(processes_naming(ray_tmp))
    return done.returncode, done.stdout, done.stderr[-4000:]


def _events(stdout: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("CHAOS ") :])
        for line in stdout.splitlines()
        if line.startswith("CHAOS ")
    ]


def _decoys(cases: list[EnvCase], base_url: str) -> list[dict[str, Any]]:
    """Two cases that must fail, each its own way: wd-3's env expected wrong (a file changed, one
    not expected, one missing, a module that is not there), and a working dir the server does
    not have."""
    (wd3,) = [c for c in cases if c.name == "wd-3"]
    tree = dict(wd3.expect["working_dir"])
    del tree["job.txt"]
    tree["cfg/a.ini"] = "0" * 64
    tree["zz/ghost.txt"] = "0" * 64
    wrong = {"working_dir": tree, "module:chaos_nope": {"__init__.py": "0" * 64}}
    return [
        {"name": "decoy", "runtime_env": wd3.runtime_env, "expect": wrong},
        {"name": "broken", "runtime_env": {"working_dir": base_url + "/pkg/nothing.zip"},
         "expect": {}},
    ]  # fmt: skip


DECOY_SAYS = [
    f"{when}: {what}"
    for when in ("start", "end")
    for what in (
        "module:chaos_nope: import failed: ModuleNotFoundError: No module named 'chaos_nope'",
        "working_dir: changed cfg/a.ini",
        "working_dir: extra job.txt",
        "working_dir: missing zz/ghost.txt",
    )
]


async def _run(switched: Switched, mode: str, work: Path, ray_tmp: Path) -> list[dict[str, Any]]:
    """The driver over every case (and, in init mode, the decoys): its outcomes, once the run
    has been checked whole."""
    made = material(SEED)
    asked: Counter[str] = Counter()

    async def count(request: web.Request) -> None:
        asked[request.path] += 1

    async with serve(made, count) as base_url:
        cases = env_cases(made, base_url)
        listed = [c.spec() for c in cases]
        listed += _decoys(cases, base_url) if mode == "init" else []
        spec = {
            "mode": mode, "nodes": 3, "seed": SEED, "round": 1, "tasks": len(listed),
            "concurrency": 4, "hold_s": [0.2, 0.8], "actor_share": 0.3, "unit_timeout_s": 240,
            "cases": listed,
        }  # fmt: skip
        began = time.monotonic()
        code, out, err = await asyncio.to_thread(_drive, switched.python, spec, work, ray_tmp)
        took = time.monotonic() - began
    events = _events(out)
    kinds = [e["kind"] for e in events]
    assert code == 0, f"exit {code}: {kinds[-5:]} {err}"
    assert kinds[:2] == ["start", "ready"], kinds
    assert kinds[-1] == "done", kinds
    outcomes = [e for e in events if e["kind"] == "outcome"]
    assert Counter(o["case"] for o in outcomes) == Counter(c["name"] for c in listed)
    bad = [
        (o["case"], o["how"], o["error"], o["mismatch"][:3], o["message"][:300])
        for o in outcomes
        if o["case"] not in ("decoy", "broken") and not _clean(o)
    ]
    assert bad == [], bad
    assert {o["how"] for o in outcomes} == {"task", "actor"}
    (ready,) = [e for e in events if e["kind"] == "ready"]
    assert len(ready["nodes"]) == (3 if mode == "cluster" else 1), ready
    assert {o["node"] for o in outcomes} - {""} <= set(ready["nodes"])
    assert all(o["t0"] <= o["t1"] for o in outcomes)
    every_package = set(made.files) | {f"/files/{n}" for n in made.wheels}
    assert every_package <= set(asked), every_package - set(asked)
    assert (switched.root / "state.db").is_file(), "this agent served the nodes, on enable's root"
    print(f"{mode}: {len(outcomes)} units in {took:.1f} s", file=sys.stderr)
    return outcomes


def _clean(outcome: dict[str, Any]) -> bool:
    return bool(
        outcome["ok"] and not outcome["mismatch"] and not outcome["error"] and outcome["pid"] > 0
    )


async def test_a_bare_ray_init_driver_runs_every_case_ok_and_reports_a_wrong_view(
    switched: Switched, tmp_path: Path, ray_tmp: Path
) -> None:
    outcomes = await _run(switched, "init", tmp_path / "work", ray_tmp)
    (decoy,) = [o for o in outcomes if o["case"] == "decoy"]
    assert (decoy["ok"], decoy["error"], decoy["mismatch"]) == (False, "", DECOY_SAYS)
    assert decoy["pid"] > 0, "it ran, and saw what was not expected"
    (broken,) = [o for o in outcomes if o["case"] == "broken"]
    assert (broken["ok"], broken["error"], broken["mismatch"]) == (
        False, "RuntimeEnvSetupError", [],
    )  # fmt: skip
    assert "404" in broken["message"], broken
