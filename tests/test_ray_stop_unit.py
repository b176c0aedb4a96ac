"""``rtenv-agent ray stop``'s pure parts: the processes of a temp dir's or an address's nodes
chosen from a snapshot of ``/proc`` shaped as Ray 2.60's nodes are, Ray's order to stop them,
the report; and the next steps ``rtenv-agent ray start`` prints."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from agent.launcher import node_procs, stop
from agent.launcher.next_steps import NextSteps, next_steps, runnable
from agent.launcher.node_procs import Proc, Scope, choose, label, session_of

PY = "/venv/bin/python3"
RAY = "/venv/lib/python3.11/site-packages/ray"


class Machine:
    """A snapshot of /proc being built: each process gets the next PID."""

    def __init__(self) -> None:
        self.procs: dict[int, Proc] = {}

    def add(self, line: str, *more: str, ppid: int = 1) -> int:
        """A process whose command line is ``line``'s words, then ``more`` as they are."""
        pid = 100 + len(self.procs)
        self.procs[pid] = Proc(pid, ppid, 1000 + pid, (*line.split(), *more))
        return pid


def head(m: Machine, temp: str, gcs: str, *, block: bool = False) -> dict[str, int]:
    """A head node's processes, as Ray 2.60 starts them (their command lines cut short)."""
    s = f"{temp}/session_2026-12-07_12-21-39_614323_{len(m.procs)}"
    top = m.add(f"{PY} /venv/bin/rtenv-agent ray start --head --block") if block else 1
    pids = {"start": top} if block else {}
    pids["gcs"] = m.add(
        f"{RAY}/core/src/ray/gcs/gcs_server --log_dir={s}/logs --gcs_server_port=0 "
        f"--session-dir={s}",
        ppid=top,
    )
    pids["monitor"] = m.add(
        f"{PY} -u {RAY}/autoscaler/_private/monitor.py --logs-dir={s}/logs --gcs-address={gcs}",
        ppid=top,
    )
    pids["client"] = m.add(
        f"{PY} -m ray.util.client.server --address={gcs} --host=127.0.0.2 --port=10001",
        ppid=top,
    )
    pids["dashboard"] = m.add(
        f"{PY} {RAY}/dashboard/dashboard.py --temp-dir={temp} --session-dir={s} "
        f"--gcs-address={gcs}",
        ppid=top,
    )
    pids.update(raylet_and_below(m, s, gcs, "--head", ppid=top))
    return pids


def raylet_and_below(m: Machine, s: str, gcs: str, *extra: str, ppid: int = 1) -> dict[str, int]:
    """A raylet (a value of its command line with spaces: Ray's worker command), the log
    monitor, and what the raylet starts: the dashboard agent, this agent's keeper and agent, a
    worker and its child."""
    java = f"{PY} {RAY}/_private/workers/setup_worker.py -Dray.object-store.socket-name={s}/x"
    log_monitor = m.add(
        f"{PY} -u {RAY}/_private/log_monitor.py --session-dir={s} --gcs-address={gcs}", ppid=ppid
    )
    raylet = m.add(
        f"{RAY}/core/src/ray/raylet/raylet --raylet_socket_name={s}/sockets/raylet "
        f"--temp_dir={os.path.dirname(s)} --session_dir={s} --gcs-address={gcs}",
        f"--java_worker_command={java}",
        *extra,
        ppid=ppid,
    )
    ours = f"{PY} -u -I -m agent ray-agent --session-dir={s}"
    keeper = m.add(f"{ours} --gcs-address={gcs}", ppid=raylet)
    worker = m.add("ray::IDLE", "", "", "", ppid=raylet)
    return {
        "log_monitor": log_monitor,
        "raylet": raylet,
        "dashboard_agent": m.add("ray::DashboardAgent", ppid=raylet),
        "keeper": keeper,
        "agent": m.add(ours, ppid=keeper),
        "worker": worker,
        "task_child": m.add("/bin/sleep 1000", ppid=worker),
    }


def pids_of(m: Machine, scope: Scope) -> set[int]:
    return {p.pid for p in choose(m.procs, scope).procs}


def temp(path: str) -> Scope:
    return Scope(temp_dirs=frozenset({path}))


@pytest.fixture
def machine() -> tuple[Machine, dict[str, dict[str, int]]]:
    """Two heads in /tmp/ra and /tmp/ra2 (a prefix of the other), a worker node of the first in
    /tmp/rw, and bystanders: a tail -f of the first's session_latest, a less of its log (a bare
    path), a driver given the first's address, a shell."""
    m = Machine()
    nodes = {
        "a": head(m, "/tmp/ra", "127.0.0.2:6379"),
        "b": head(m, "/tmp/ra2", "127.0.0.2:6380"),
    }
    s = "/tmp/rw/session_2026-12-07_12-21-39_614323_0"
    nodes["w"] = raylet_and_below(m, s, "127.0.0.2:6379")
    nodes["others"] = {
        "tail": m.add("tail", "-f", "/tmp/ra/session_latest/logs/raylet.out"),
        "tail_option": m.add("tool", "--file=/tmp/ra/session_latest/logs/raylet.out"),
        "less": m.add("less", "/tmp/ra/session_2026-12-07_12-21-39_614323_0/logs/raylet.out"),
        "driver": m.add(f"{PY} train.py --address=127.0.0.2:6379"),
        "shell": m.add("/bin/bash"),
    }
    return m, nodes


def test_a_temp_dir_chooses_every_process_of_its_node_and_none_of_another(
    machine: tuple[Machine, dict[str, dict[str, int]]],
) -> None:
    """Its head's client server (which names no session) and the raylet's descendants whose
    command line Ray replaced by a title are among them; another temp dir whose name starts
    with this one's, a worker node of the same cluster in its own temp dir, a tail -f of
    session_latest, a bare path to its log, and a driver given its address are not."""
    m, nodes = machine
    assert pids_of(m, temp("/tmp/ra")) == set(nodes["a"].values())
    assert pids_of(m, temp("/tmp/ra2")) == set(nodes["b"].values())
    assert pids_of(m, temp("/tmp/rw")) == set(nodes["w"].values()), "not the head's client"
    assert pids_of(m, temp("/tmp")) == set()


def test_an_address_chooses_the_nodes_of_that_cluster_on_this_machine(
    machine: tuple[Machine, dict[str, dict[str, int]]],
) -> None:
    m, nodes = machine
    cluster = set(nodes["a"].values()) | set(nodes["w"].values())
    assert pids_of(m, Scope(address="127.0.0.2:6379")) == cluster
    assert pids_of(m, Scope(address="127.0.0.2:6380")) == set(nodes["b"].values())
    assert pids_of(m, Scope(address="127.0.0.2:1")) == set()
    chosen = choose(m.procs, Scope(address="127.0.0.2:6379"))
    assert chosen.addresses == ("127.0.0.2:6379",)
    assert [os.path.dirname(s) for s in chosen.sessions] == ["/tmp/ra", "/tmp/rw"]


def test_a_blocking_ray_start_is_chosen_and_stopped_last_a_driver_that_started_a_node_not() -> None:
    m = Machine()
    blocked = head(m, "/tmp/rb", "127.0.0.2:6379", block=True)
    driver = m.add(f"{PY} train.py")
    local = raylet_and_below(m, "/tmp/rc/session_2026-12-07_12-21-39_614323_9", "x:1", ppid=driver)
    assert pids_of(m, temp("/tmp/rb")) == set(blocked.values())
    assert pids_of(m, temp("/tmp/rc")) == set(local.values()), "the driver is not the node's"
    first, middle, last = node_procs.steps(choose(m.procs, temp("/tmp/rb")).procs)
    assert [p.pid for p in first] == [blocked["raylet"]]
    assert {p.pid for p in last} == {blocked["gcs"], blocked["start"]}
    assert blocked["agent"] in {p.pid for p in middle}


def test_the_stopping_process_is_never_chosen(
    machine: tuple[Machine, dict[str, dict[str, int]]],
) -> None:
    m, nodes = machine
    chosen = choose(m.procs, temp("/tmp/ra"), exclude=[nodes["a"]["worker"]])
    assert nodes["a"]["worker"] not in {p.pid for p in chosen.procs}
    assert nodes["a"]["task_child"] in {p.pid for p in chosen.procs}


@pytest.mark.parametrize(
    ("value", "session"),
    [
        ("/tmp/ra/session_2026_1/logs/x.out", "/tmp/ra/session_2026_1"),
        ("/tmp//ra/./session_2026_1", "/tmp/ra/session_2026_1"),
        ("/tmp/my ray/session_2026_1/sockets/raylet", "/tmp/my ray/session_2026_1"),
        ("/tmp/ra/session_latest/logs", None),
        ("tmp/ra/session_2026_1", None),
        ("/venv/bin/python3 /x/setup_worker.py -Dray.x=/tmp/ra/session_2026_1/x", None),
        ("/tmp/ra/logs", None),
    ],
)
def test_the_session_a_value_names(value: str, session: str | None) -> None:
    assert session_of(value) == session


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ((f"{RAY}/core/src/ray/raylet/raylet", "--x=1"), "raylet"),
        ((PY, "-u", f"{RAY}/autoscaler/_private/monitor.py", "--a=b"), "monitor.py"),
        ((PY, "-u", "-I", "-m", "agent", "ray-agent", "--a=b"), "-m agent ray-agent"),
        ((PY, "-m", "ray.util.client.server", "--address=x:1"), "-m ray.util.client.server"),
        (("ray::IDLE", "", "", ""), "ray::IDLE"),
        ((PY, "/venv/bin/rtenv-agent", "ray", "start", "--block"), "rtenv-agent ray start"),
        (("x" * 200,), "x" * 77 + "..."),
        ((), "?"),
    ],
)
def test_a_process_is_reported_by_its_program_script_module_or_title(
    argv: tuple[str, ...], said: str
) -> None:
    assert label(argv) == said


def _held(outcome: stop.Outcome) -> stop.Held:
    proc = Proc(7, 1, 1, (f"{RAY}/core/src/ray/raylet/raylet",))
    return stop.Held(proc, None, outcome)


def test_the_report_says_each_process_and_fails_on_one_not_stopped() -> None:
    report = stop.Report("the nodes of temp dir '/tmp/ra'")
    report.held = [_held(stop.Outcome.TERMINATED), _held(stop.Outcome.KILLED)]
    assert report.code() == stop.STOPPED
    lines = report.lines()
    assert (
        lines[0]
        == "rtenv-agent ray stop: the nodes of temp dir '/tmp/ra' (no session): 2 processes"
    )
    assert lines[1:3] == [
        "  7 raylet: stopped (SIGTERM)",
        "  7 raylet: " + stop.Outcome.KILLED.value,
    ]
    assert lines[-1] == "rtenv-agent ray stop: stopped 2 processes (1 with SIGKILL)"
    report.held.append(_held(stop.Outcome.ALIVE))
    assert report.code() == stop.FAILED
    assert report.lines()[-1].endswith("stopped 2 processes (1 with SIGKILL); 1 NOT stopped")


def test_ray_current_cluster_goes_only_when_it_names_a_stopped_cluster(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "ray_current_cluster").write_text("127.0.0.2:6379")
    (tmp_path / "b" / "ray_current_cluster").write_text("127.0.0.2:9999")
    removed = stop.forget_cluster([str(tmp_path / "a"), str(tmp_path / "b")], ["127.0.0.2:6379"])
    assert removed == [str(tmp_path / "a" / "ray_current_cluster")]
    assert (tmp_path / "b" / "ray_current_cluster").exists()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--address", "auto"], "'auto' names no node"),
        (["--address", "127.0.0.1"], "is not HOST:PORT"),
        (["--address", "h:0"], "is not a number from 1 to 65535"),
        (["--address", "a b:1"], "is not HOST:PORT"),
        (["--temp-dir", " "], "the folder is empty"),
        (["--temp-dir", "/x", "--address", "h:1"], "not allowed with argument"),
        (["-g", "2h"], "over the limit of 1h"),
        (["-g", "soon"], "is not a duration"),
        (["--all"], "unrecognized arguments: --all"),
    ],
)
def test_a_command_line_mistake_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        stop.main(argv, {})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("rtenv-agent ray stop: "), err
    assert error in err, err


@pytest.mark.parametrize(
    ("environ", "temp_dir"),
    [
        ({"RAY_TMPDIR": "/data/rt", "TMPDIR": "/t"}, "/data/rt/ray"),
        ({"TMPDIR": "/t"}, "/t/ray"),
        ({}, "/tmp/ray"),
    ],
)
def test_the_default_temp_dir_is_ray_starts(environ: dict[str, str], temp_dir: str) -> None:
    scope, said = stop.scope_of(stop._parser().parse_args([]), environ)
    assert os.path.normpath(temp_dir) in scope.temp_dirs
    assert said == f"the nodes of temp dir {temp_dir!r}"


# -- the next steps --------------------------------------------------------------------------


def _raylet(session: str, gcs: str, *extra: str) -> list[str]:
    """A raylet's command line as Ray 2.60 starts it (cut short)."""
    return [
        f"{RAY}/core/src/ray/raylet/raylet",
        f"--raylet_socket_name={session}/sockets/raylet",
        f"--java_worker_command={PY} setup_worker.py -Dray.object-store.socket-name={session}/x",
        f"--session_dir={session}",
        f"--gcs-address={gcs}",
        *extra,
    ]


def test_the_next_steps_of_a_head_add_a_node_on_this_agent_and_stop_just_this_node() -> None:
    session = "/tmp/my ray/session_2026-12-07_12-21-39_614323_1"
    words = ["/home/u/a b/.venv/bin/rtenv-agent"]
    lines = next_steps(_raylet(session, "127.0.0.2:6379", "--head"), words)
    commands = [shlex.split(line) for line in lines if line.startswith("    ")]
    assert commands == [
        [*words, "ray", "start", "--address=127.0.0.2:6379"],
        [*words, "ray", "stop", "--temp-dir=/tmp/my ray"],
        [*words, "ray", "stop", "--address=127.0.0.2:6379"],
    ]
    assert lines[0].startswith("rtenv-agent ray: next steps for this node"), lines[0]
    assert "`ray stop` stops every Ray node on this machine" in lines[0]


def test_a_worker_node_is_told_no_cluster_wide_stop_and_an_unknown_raylet_nothing() -> None:
    lines = next_steps(_raylet("/tmp/rw/session_1", "127.0.0.2:6379"), ["rtenv-agent"])
    commands = [line.strip() for line in lines if line.startswith("    ")]
    assert commands == [
        "rtenv-agent ray start --address=127.0.0.2:6379",
        "rtenv-agent ray stop --temp-dir=/tmp/rw",
    ]
    assert next_steps(["raylet", "--node_id=1"], ["rtenv-agent"]) == []


def test_next_steps_are_said_once_after_a_raylet_was_seen(
    capsys: pytest.CaptureFixture[str],
) -> None:
    steps = NextSteps(["rtenv-agent"])
    steps.say(sys.stdout)
    assert capsys.readouterr().out == ""
    steps.saw(_raylet("/tmp/rw/session_1", "127.0.0.2:6379"))
    steps.say(sys.stdout)
    steps.say(sys.stdout)
    assert capsys.readouterr().out.count("next steps") == 1


def _script(folder: Path) -> Path:
    folder.mkdir(parents=True)
    script = folder / "rtenv-agent"
    script.write_text("#!/bin/sh\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_the_command_is_the_full_path_unless_path_finds_this_rtenv_agent(tmp_path: Path) -> None:
    bin_ = tmp_path / "a b" / "bin"
    script = _script(bin_)
    other = _script(tmp_path / "other")
    python = str(bin_ / "python")
    # run as the script: its full path, unless PATH finds that very script
    assert runnable(str(script), python, str(other.parent)) == [str(script)]
    assert runnable(str(script), python, f"{other.parent}:{bin_}") == [str(script)]
    assert runnable(str(script), python, f"{bin_}:{other.parent}") == ["rtenv-agent"]
    # run as python -m agent: the script beside the python, else python -m agent
    main_py = "/src/agent/__main__.py"
    assert runnable(main_py, python, "") == [str(script)]
    lone = str(tmp_path / "lone" / "python")
    assert runnable(main_py, lone, str(bin_)) == [lone, "-m", "agent"]
