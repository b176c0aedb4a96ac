"""The chaos runner (scripts/chaos.py): a reduced run passes, and its checks can fail.

The reduced run is the CI form of the chaos test: a real node (the agent as a sidecar process,
real worker processes in watch mode), a faulty package server on 127.0.0.1, SIGKILLed workers and
agents, eviction under a small budget. Any violation fails it. The other tests feed the runner's
invariant checks a state that is wrong on purpose (they must report it) or one that is right but
moving (they must not report it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import os
import random
import re
import shutil
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from raylet_sim.node import Node
from raylet_sim.pool import (
    ARGUMENT_LIST_TOO_LONG,
    ENV_SETUP_FAILED,
    SPAWN_FAILED,
    TASK_ERROR,
    WORKER_DIED,
    WORKER_START_FAILED,
    TaskFailed,
    TaskSpec,
    Worker,
    WorkerPool,
    WorkerState,
)
from rtenv.v1 import agent_pb2
from tests.harness.command_line import assert_refused_in_one_line
from tests.harness.in_process import running_agent
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until
from tests.harness.processes import run_in_session
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]
CHAOS_PY = REPO / "scripts" / "chaos.py"
PROBE_PY = "import os\n\ndef pid():\n    return os.getpid()\n"
QUIET = ("--log-level", "WARNING")


def _load_chaos() -> ModuleType:
    if str(CHAOS_PY.parent) not in sys.path:  # its parts (chaoslib_*), as when run as a script
        sys.path.append(str(CHAOS_PY.parent))
    spec = importlib.util.spec_from_file_location("rtenv_chaos_runner", CHAOS_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


chaos = _load_chaos()
import chaoslib_root  # noqa: E402  (importable once the runner's folder is on the path)

# -- the reduced run -------------------------------------------------------------------------


def _run_chaos(args: list[str], timeout_s: float) -> tuple[int, str]:
    return run_in_session([sys.executable, str(CHAOS_PY), *args], REPO, timeout_s, "chaos run")


def _summary_field(out: str, name: str, pattern: str) -> tuple[str, ...]:
    match = re.search(rf"^{name}\s+{pattern}$", out, re.MULTILINE)
    assert match, f"no {name!r} line matching {pattern!r} in the summary:\n{out[-4000:]}"
    return match.groups()


@pytest.mark.timeout(150)
def test_reduced_chaos_run_has_no_violation_and_exercises_every_kind_of_fault() -> None:
    """CI's chaos run: agent and worker kills, evictions, faulty downloads; zero violations."""
    args = ["--seed", "5", "--rounds", "8", "--agent-kills", "3", "--tasks", "40"]
    code, out = _run_chaos(args, timeout_s=120)
    (violations,) = _summary_field(out, "violations", r"(\d+)")
    assert (code, int(violations)) == (0, 0), f"the chaos run failed:\n{out[-6000:]}"
    kills, restarts = map(int, _summary_field(out, "agent", r"(\d+) SIGKILLs, (\d+) restarts"))
    assert kills >= 3
    assert restarts >= 3
    started, killed = map(int, _summary_field(out, "workers", r"(\d+) started, (\d+) killed"))
    assert started > 0
    assert killed > 0
    installs, evictions = map(
        int, _summary_field(out, "packages", r"(\d+) installs, (\d+) evictions")
    )
    assert installs > 0
    assert evictions > 0
    injected, requests = map(
        int, _summary_field(out, "faults", r"(\d+) injected in (\d+) requests(?:: .+)?")
    )
    assert 0 < injected <= requests
    (ok,) = _summary_field(out, "tasks", r"(\d+) ok, .*")
    assert int(ok) > 0
    assert re.search(r"^seed 5: 8 rounds in ", out, re.MULTILINE), out[-4000:]


@pytest.mark.timeout(90)
def test_three_nodes_on_one_root_kill_their_agents_independently_with_no_violation() -> None:
    """Issue 16's chaos run: three nodes share one agent root; each node's agent is SIGKILLed
    and restarted on its own while the others work on; workers watch their packages; zero
    violations."""
    args = [
        "--seed", "11", "--nodes", "3", "--rounds", "4", "--agent-kills", "1", "--tasks", "24",
        "--concurrency", "3", "--envs", "12",
    ]  # fmt: skip
    code, out = _run_chaos(args, timeout_s=75)
    (violations,) = _summary_field(out, "violations", r"(\d+)")
    assert (code, int(violations)) == (0, 0), f"the chaos run failed:\n{out[-6000:]}"
    assert _summary_field(out, "nodes", r"(\d+) on one agent root") == ("3",)
    kills, restarts = map(int, _summary_field(out, "agent", r"(\d+) SIGKILLs, (\d+) restarts"))
    assert (kills, restarts) == (3, 3), "one kill and one restart per node"
    installs, evictions = map(
        int, _summary_field(out, "packages", r"(\d+) installs, (\d+) evictions")
    )
    assert installs > 0
    assert evictions > 0
    (ok,) = _summary_field(out, "tasks", r"(\d+) ok, .*")
    assert int(ok) > 0


@pytest.mark.timeout(150)
def test_stress_run_with_many_envs_and_short_idle_timeouts_fails_no_task() -> None:
    """CI's stress run (issue 12): many envs, idle workers retired after 50 ms, nothing killed
    and no fault injected, so any failed task is a violation. Before the pool's fix it failed
    (seed 7: 8 of 300 tasks WORKER_DIED on workers being stopped)."""
    args = [
        "--seed", "7", "--rounds", "1", "--tasks", "300", "--envs", "40", "--idle-timeout",
        "0.05", "--agent-kills", "0", "--fault-rate", "0", "--calm", "--budget-kib", "65536",
    ]  # fmt: skip
    code, out = _run_chaos(args, timeout_s=120)
    (violations,) = _summary_field(out, "violations", r"(\d+)")
    assert (code, int(violations)) == (0, 0), f"the stress run failed:\n{out[-6000:]}"
    assert _summary_field(out, "tasks", r"(\d+) ok, (\d+) failed") == ("300", "0")
    assert _summary_field(out, "workers", r"\d+ started, (\d+) killed") == ("0",)


def test_the_summary_says_failures_and_faults_in_words_not_dicts() -> None:
    """Most first, then by name; a count of 0 unsaid; none at all is no list."""
    tally = chaos.Tally(seed=3, tasks_ok=37)
    tally.tasks_failed.update({"WORKER_DIED": 1, "ENV_SETUP_FAILED": 2, "TASK_ERROR": 1})
    faults = collections.Counter({"none": 40, "slow": 3, "500": 2, "reset": 0, "corrupt": 2})
    lines = tally.summary(faults).splitlines()
    failed = "4 failed: 2 ENV_SETUP_FAILED, 1 TASK_ERROR, 1 WORKER_DIED"
    assert lines[2] == f"tasks        37 ok, {failed}"
    assert lines[7] == "faults       7 injected in 47 requests: 3 slow, 2 HTTP 500, 2 corrupt"
    calm = chaos.Tally(seed=3, tasks_ok=300).summary(collections.Counter({"none": 12}))
    assert "tasks        300 ok, 0 failed\n" in calm
    assert "faults       0 injected in 12 requests\n" in calm
    assert "{" not in calm + "\n".join(lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--nodes", "0"], "--nodes must be between 1 and 16, got 0"),
        (["--nodes", "17"], "--nodes must be between 1 and 16, got 17"),
        (["--fault-rate", "2"], "--fault-rate must be between 0 and 1, got 2.0"),
        (["--fault-rate", "nan"], "--fault-rate must be between 0 and 1, got nan"),
        (["--agent-kills", "5", "--rounds", "2"], "--agent-kills must be between 0 and --rounds"),
        (["--idle-timeout", "-1"], "--idle-timeout must be a number of seconds above 0"),
        (["--workdir", "FILE"], "--workdir '.*FILE' cannot be a folder: File exists"),
        (["--bogus"], r"unrecognized arguments: --bogus \(see chaos --help\)"),
        (["--rounds", "x"], "argument --rounds: invalid int value: 'x'"),
    ],
)
def test_a_command_line_mistake_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    """Issue 12: --rounds 0 gave a traceback, --fault-rate 2 was accepted and --agent-kills 5
    --rounds 2 silently cut to 1. Issue 16: --nodes outside 1..16."""
    assert_refused_in_one_line([sys.executable, str(CHAOS_PY)], args, f"chaos: {message}")


# -- the oracle: which failed tasks the run's own violence explains ----------------------------


def _failure(status: str, pid: int | None = 4242) -> TaskFailed:
    return TaskFailed(status, f"worker {pid} did something", pid=pid)


def test_a_worker_death_is_explained_only_by_a_kill_of_that_very_worker() -> None:
    """Issue 12: every WORKER_DIED counted as the monkey's doing, so the pool's bug hid."""
    died = _failure(WORKER_DIED)
    explain = chaos.unexplained
    assert explain(died, killed_pids={4242}, agent_killed=False, faults_injected=False) is None
    for agent_killed, faults in ((False, False), (True, True)):  # nothing else explains it
        why = explain(died, killed_pids={1, 2}, agent_killed=agent_killed, faults_injected=faults)
        assert why is not None
        assert "worker 4242, which nobody killed" in why


def test_a_failed_start_needs_a_kill_of_its_worker_or_of_the_agent() -> None:
    failed = _failure(WORKER_START_FAILED)
    explain = chaos.unexplained
    assert explain(failed, killed_pids={4242}, agent_killed=False, faults_injected=False) is None
    assert explain(failed, killed_pids=set(), agent_killed=True, faults_injected=False) is None
    why = explain(failed, killed_pids={7}, agent_killed=False, faults_injected=True)
    assert why is not None
    assert why.startswith("WORKER_START_FAILED that no kill or injected fault explains")


def test_an_env_setup_failure_needs_an_injected_fault_or_the_agents_death() -> None:
    failed = _failure(ENV_SETUP_FAILED, pid=None)
    explain = chaos.unexplained
    assert explain(failed, killed_pids=set(), agent_killed=False, faults_injected=True) is None
    assert explain(failed, killed_pids=set(), agent_killed=True, faults_injected=False) is None
    assert explain(failed, killed_pids={1}, agent_killed=False, faults_injected=False) is not None


def test_a_task_error_or_a_spawn_failure_is_always_a_violation() -> None:
    for status in (TASK_ERROR, SPAWN_FAILED, ARGUMENT_LIST_TOO_LONG):
        why = chaos.unexplained(
            _failure(status), killed_pids={4242}, agent_killed=True, faults_injected=True
        )
        assert why is not None, status


# -- the root's checks fail on a broken state ---------------------------------------------------

H1, H2, DEAD = "1" * 32, "2" * 32, "d" * 32  # two live holders (nodes' agents) and a dead one
WD, MOD = "working_dir:http://x/wd.zip", "py_modules:http://x/m.zip"


def _root(**changes: object) -> chaoslib_root.RootState:
    """A quiet root two nodes share, consistent: H1's live env holds WD and MOD, H2's holds MOD,
    one unused package of 100 bytes; then ``changes`` break it."""
    state = chaoslib_root.RootState(
        dirs={"wd-1", "mod-2", "old-3"},
        rows=[
            (WD, "wd-1", 10, "ready", None),
            (MOD, "mod-2", 20, "ready", None),
            ("working_dir:http://x/old.zip", "old-3", 100, "ready", None),
        ],
        refs=[(H1, WD), (H1, MOD), (H2, MOD)],
        holders=[H1, H2],
        locks=[H1, H2],
        folders={f"tmp/{H1}": [], f"tmp/{H2}": [], f"trash/{H1}": []},
        alive={H1, H2},
    )
    for name, value in changes.items():
        setattr(state, name, value)
    return state


NODES = {H1: ("node 0: ", {WD, MOD}), H2: ("node 1: ", {MOD})}


def test_a_consistent_shared_root_has_no_problem() -> None:
    assert chaoslib_root.root_problems(_root(), NODES, budget=100) == []


@pytest.mark.parametrize(
    ("changes", "budget", "expected"),
    [
        (  # a peer's eviction that skipped the reference re-check: row and directory gone
            {"dirs": {"wd-1", "old-3"}, "rows": [(WD, "wd-1", 10, "ready", None),
             ("working_dir:http://x/old.zip", "old-3", 100, "ready", None)]},
            100,
            ["node 0: py_modules:http://x/m.zip, which a live env holds, has no ready row",
             "node 1: py_modules:http://x/m.zip, which a live env holds, has no ready row"],
        ),
        (  # the directory deleted behind the index's back
            {"dirs": {"wd-1", "old-3"}},
            100,
            ["directories ['mod-2'] and state.db disagree",
             "node 0: py_modules:http://x/m.zip, which a live env holds, is not on disk",
             "node 1: py_modules:http://x/m.zip, which a live env holds, is not on disk"],
        ),
        (
            {"refs": [(H1, WD), (H2, MOD)]},  # H1's reference to MOD dropped while it holds it
            100,
            [f"node 0: its live envs hold ['{MOD}', '{WD}'] but state.db's references of its "
             f"holder {H1} are ['{WD}']"],
        ),
        (
            {"refs": [(H1, WD), (H1, MOD), (H2, MOD), (DEAD, WD)], "holders": [H1, H2, DEAD]},
            100,
            [f"dead holders not reaped: ['{DEAD}']"],
        ),
        ({"locks": [H1, H2, DEAD]}, 100, [f"dead holders not reaped: ['{DEAD}']"]),
        ({"alive": {H1, H2, DEAD}, "locks": [H1, H2, DEAD]}, 100,
         [f"live holders that are no node's agent: ['{DEAD}']"]),
        (
            {"rows": [(WD, "wd-1", 10, "ready", None), (MOD, "mod-2", 20, "ready", None),
                      ("working_dir:http://x/old.zip", "old-3", 100, "ready", None),
                      ("py_modules:http://x/new.zip", "new-4", 0, "installing", H2)]},
            100,
            [f"claims with no create in flight: ['py_modules:http://x/new.zip by {H2}']"],
        ),
        ({}, 99, ["unused bytes 100 over the budget 99"]),
        (
            {"folders": {f"tmp/{H1}": ["a1b2"], f"tmp/{DEAD}": [], "trash/stray": ["x"]}},
            100,
            [f"tmp/{H1} did not drain: ['a1b2']", f"tmp/{DEAD} of no live holder left",
             "trash/stray of no live holder left"],
        ),
        (
            {"rows": [(WD, "wd-1", 10, "ready", None), (MOD, "mod-2", 20, "ready", None),
                      ("working_dir:http://x/old.zip", "mod-2", 100, "ready", None)],
             "dirs": {"wd-1", "mod-2"}},
            10**9,
            ["directories ['mod-2'] recorded for several packages"],
        ),
    ],
)  # fmt: skip
def test_root_problems_name_what_is_wrong(
    changes: dict[str, object], budget: int, expected: list[str]
) -> None:
    """Each way a shared root can be wrong when its nodes are quiet is named, and only it."""
    assert chaoslib_root.root_problems(_root(**changes), NODES, budget) == expected


def test_a_root_whose_agents_stopped_must_hold_no_holder_reference_or_claim() -> None:
    """A clean stop takes its holder row, references, claims, lock file and folders with it."""
    stopped = _root(refs=[], holders=[], locks=[], alive=set(), folders={})
    assert chaoslib_root.stopped_problems(stopped) == []
    left = _root(
        refs=[(H1, WD)], holders=[], locks=[H2], alive={H2},
        rows=[(WD, "wd-1", 10, "installing", H1)], folders={f"trash/{H1}": []},
    )  # fmt: skip
    assert chaoslib_root.stopped_problems(left) == [
        f"holders alive after every agent stopped: ['{H2}']",
        f"holders left in state.db or holders/: ['{H1}', '{H2}']",
        f"claims left: ['{WD} by {H1}']",
        f"staging or trash folders left: ['trash/{H1}']",
    ]


async def test_read_root_sees_a_package_directory_deleted_behind_the_agents_back() -> None:
    """On a real agent's root: consistent, then a package's directory removed by hand is named
    by the root's check and by the agent's own records."""
    async with running_agent() as ra:
        base = short_tempdir()
        try:
            package = base / "wd.zip"
            package.write_bytes(workdir_zip({"probe.py": PROBE_PY}))
            reply = await ra.create(env_json(working_dir=f"file://{package}"))
            assert await ra.delete(reply.runtime_env_id) == 0  # unused now, still cached
            await ra.settle()
            holder = chaoslib_root.holder_of(ra.root, os.getpid())
            assert holder, "the agent took no lock under holders/"
            nodes = {holder: ("", set[str]())}
            found: list[str] = []
            await wait_until(
                lambda: not chaoslib_root.root_problems(chaoslib_root.read_root(ra.root), nodes,
                                                        10**9),
                what="the root to settle",
            )  # fmt: skip
            chaoslib_root.check_known(chaoslib_root.read_root(ra.root), await ra.info(), 10**9,
                                      found.append)  # fmt: skip
            assert found == [], "a consistent state must pass the check"
            (name,) = ra.uri_dirs()
            shutil.rmtree(ra.root / "uris" / name)  # the agent and state.db still record it
            state = chaoslib_root.read_root(ra.root)
            assert chaoslib_root.root_problems(state, nodes, 10**9) == [
                f"directories ['{name}'] and state.db disagree"
            ]
            chaoslib_root.check_known(state, await ra.info(), 10**9, found.append)
            assert found == [f"directories ['{name}'] and the agent's records disagree"]
        finally:
            shutil.rmtree(base, ignore_errors=True)


@dataclass
class ChaosNode:
    node: Node
    root: Path
    env: str  # an env whose working dir holds probe.py


@asynccontextmanager
async def chaos_node() -> AsyncIterator[ChaosNode]:
    """A real node (agent sidecar process, real workers) whose idle workers stay a minute."""
    base = short_tempdir()
    package = base / "wd.zip"
    package.write_bytes(workdir_zip({"probe.py": PROBE_PY}))
    node = Node(base / "root", idle_timeout_s=60.0, agent_args=QUIET)
    try:
        await node.start()
        yield ChaosNode(node, base / "root", env_json(working_dir=f"file://{package}"))
    finally:
        await node.stop()
        shutil.rmtree(base, ignore_errors=True)


def seat_of(c: ChaosNode) -> Any:
    """The runner's seat for this one node (its agent's holder found as the runner finds it)."""
    seat = chaos.Seat(0, random.Random(0), set(), node=c.node)
    seat.holder = chaoslib_root.holder_of(c.root, c.node.sidecar.pid)
    assert seat.holder, "the agent took no lock under holders/"
    return seat


async def settled(c: ChaosNode) -> None:
    """Wait until the root has settled: staging and trash drained, a row per package directory,
    the references written behind."""
    seat = seat_of(c)
    assert c.node.client is not None
    client = c.node.client

    async def quiet() -> bool:
        held = chaoslib_root.held(await client.info())
        state = await asyncio.to_thread(chaoslib_root.read_root, c.root)
        return not chaoslib_root.root_problems(state, {seat.holder: ("", held)}, 10**9)

    await wait_until(quiet, what="the agent's root to settle")


async def test_check_alive_reports_an_agent_reference_the_pool_does_not_hold() -> None:
    async with chaos_node() as c:
        assert c.node.pool is not None
        assert c.node.client is not None
        await c.node.run(TaskSpec(c.env, "probe:pid"))
        other = env_json(env_vars={"LEAKED": "1"})
        leaked = await c.node.client.create(other)  # a reference no pool slot accounts for
        await settled(c)
        tally = chaos.Tally(seed=0)
        await chaos._check_nodes([seat_of(c)], c.root, 10**9, tally, "here")
        assert len(tally.violations) == 1, tally.violations
        assert tally.violations[0].startswith("here: agent counts")
        assert leaked.runtime_env_id in tally.violations[0]
        await c.node.client.delete(leaked.runtime_env_id)


@pytest.mark.timeout(60)
async def test_check_alive_does_not_flag_a_worker_that_idles_out_during_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (chaos seed 5, 1 run in 4): an idle worker's timeout fired while the check's
    GetRuntimeEnvsInfo was in flight; the pool had dropped the env and sent its delete, the
    agent's snapshot still counted it, and the check reported a count mismatch that was none."""
    async with chaos_node() as c:
        pool, client = c.node.pool, c.node.client
        assert pool is not None
        assert client is not None
        await c.node.run(TaskSpec(c.env, "probe:pid"))  # one idle worker holds the env
        await settled(c)
        real_info = client.info

        async def info_while_the_worker_retires(
            limit: int = 0,
        ) -> agent_pb2.GetRuntimeEnvsInfoReply:
            reply = await real_info(limit)
            for worker in list(pool.workers.values()):
                assert worker.process.stdin is not None
                worker.process.stdin.close()  # what the idle timer does: the worker exits
                await wait_until(lambda: c.env not in pool.slots, what="the pool to drop the env")
            return reply

        monkeypatch.setattr(client, "info", info_while_the_worker_retires)
        tally = chaos.Tally(seed=0)
        await chaos._check_nodes([seat_of(c)], c.root, 10**9, tally, "after round 0")
        assert tally.violations == []


async def test_the_stress_run_sees_the_pool_race_when_it_is_planted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle can fail: with issue 12's race planted back (a worker being stopped left IDLE
    in the idle list, as before the fix), the same stress run reports violations."""
    import raylet_sim.pool as pool_module

    def terminate_as_before_the_fix(
        self: WorkerPool, worker: Worker, *, polite: bool = True
    ) -> None:
        self._cancel_timer(worker)
        if worker.state is WorkerState.EXITED:
            return
        stdin = worker.process.stdin  # closed, but the worker stays IDLE and in the idle list
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        loop = asyncio.get_running_loop()
        delay = pool_module._STOP_GRACE_S if polite else 0.0
        worker.timer = loop.call_later(delay, pool_module._signal_group, worker, signal.SIGTERM)

    monkeypatch.setattr(WorkerPool, "_terminate", terminate_as_before_the_fix)
    args = argparse.Namespace(
        seed=7, rounds=2, tasks=300, envs=40, concurrency=6, agent_kills=0, budget_kib=65536,
        fault_rate=0.0, idle_timeout=0.05, calm=True, workdir=None, keep=False, nodes=1,
    )  # fmt: skip
    tally = await asyncio.wait_for(chaos.run(args), timeout=240)
    assert tally.violations, "the oracle did not see the planted race"


def _evict_under_the_references(root: Path, directory: str, aside: Path) -> bool:
    """What an eviction that skipped the reference re-check would do to the package in
    ``uris/<directory>``: delete its row and move the directory out in one transaction, then
    delete it. False if it was no longer there to evict."""
    db = sqlite3.connect(root / "state.db", timeout=10, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        gone = db.execute("DELETE FROM uris WHERE dir = ? AND state = 'ready'", (directory,))
        if gone.rowcount != 1:  # evicted for real meanwhile
            db.execute("ROLLBACK")
            return False
        os.rename(root / "uris" / directory, aside)
        db.execute("COMMIT")
    finally:
        db.close()
    shutil.rmtree(aside)
    return True


@pytest.mark.timeout(150)
async def test_a_shared_root_run_fails_naming_a_package_evicted_under_a_live_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle can fail on a shared root (issue 16): an outside "evictor" does what an
    agent's eviction that skipped the reference re-check would do to a package a node's live
    env holds (row and directory gone); the run fails, its workers naming the directory."""
    seats: list[Any] = []
    real_seats = chaos._seats

    def seats_seen(*args: Any) -> Any:
        made = real_seats(*args)
        seats.extend(made)
        return made

    monkeypatch.setattr(chaos, "_seats", seats_seen)
    base = short_tempdir()
    root = base / "agent-root"
    args = argparse.Namespace(
        seed=3, rounds=3, tasks=30, envs=8, concurrency=3, agent_kills=0, budget_kib=160,
        fault_rate=0.0, idle_timeout=2.0, calm=True, workdir=str(base), keep=False, nodes=3,
    )  # fmt: skip

    def package_in_use() -> str | None:
        """The package directory a running worker of some node works in, if any."""
        for seat in list(seats):
            pool = None if seat.node is None else seat.node.pool
            for worker in [] if pool is None else list(pool.workers.values()):
                slot = pool.slots.get(worker.env_key) if pool is not None else None
                if worker.state in (WorkerState.IDLE, WorkerState.BUSY) and slot and slot.context:
                    return Path(slot.context.cwd).relative_to(root.resolve() / "uris").parts[0]
        return None

    async def evict_once() -> str:
        for _ in range(1200):  # a minute at most
            directory = package_in_use()
            if directory is not None:
                aside = base / "evicted"
                if await asyncio.to_thread(_evict_under_the_references, root, directory, aside):
                    return directory
            await asyncio.sleep(0.05)
        raise AssertionError("no node's worker ever ran")

    running = asyncio.create_task(chaos.run(args))
    try:
        directory = await asyncio.wait_for(evict_once(), 90)
        tally = await asyncio.wait_for(running, 120)
    finally:
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        shutil.rmtree(base, ignore_errors=True)
    assert tally.violations, "the oracle did not see the planted eviction"
    seen_by_workers = [v for v in tally.violations if f"/uris/{directory}/" in v]
    assert seen_by_workers, f"no worker named {directory}: {tally.violations[:10]}"
    # the watcher's words for the damage: gone, or (after a node reinstalled the evicted URI at
    # the same path, which the run's timing sometimes allows) not the bytes the worker began on
    damage = re.compile(r"pid \d+: .* is (missing|changed)")
    assert all(damage.fullmatch(v) for v in seen_by_workers), seen_by_workers
