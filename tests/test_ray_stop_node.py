"""Real Ray nodes started by ``rtenv-agent ray start``, then the next steps it printed, run as a
user runs them: the stop of one node's temp dir leaves no process of that node and every
process of another node; the add line starts a node on this agent in that cluster; the stop of
the cluster's address stops its nodes on this machine."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from tests.harness.ray_nodes import (
    RAY_RELEASE,
    RayNode,
    alive,
    cmdline,
    needs_ours,
    ray_counts,
    start_node,
)

pytestmark = needs_ours  # the next steps are this launcher's
HEADER = "rtenv-agent ray: next steps for this node"
STEPS = {  # the commands ray start printed, by the line above each
    "To add another node": "add",
    "To stop this node": "stop",
    "To stop every node of this cluster": "stop cluster",
}


def next_steps(node: RayNode) -> dict[str, str]:
    """The commands ``rtenv-agent ray start`` printed for ``node`` (in its start.log), by what
    each does."""
    lines = (node.temp_dir / "start.log").read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(HEADER)]
    assert len(starts) == 1, f"one block of next steps:\n{lines}"
    found, what = {}, None
    for line in lines[starts[0] + 1 :]:
        if line.startswith("    ") and what is not None:
            found[what] = line.strip()
        elif line.startswith("  To "):
            what = next(v for k, v in STEPS.items() if line.strip().startswith(k))
        else:
            break
    return found


def run_shell(command: str, node: RayNode) -> subprocess.CompletedProcess[str]:
    """The printed line, run by a shell, as a user pastes it."""
    return subprocess.run(
        ["bash", "-c", command],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def processes(node: RayNode) -> dict[int, str]:
    """The node's live processes (those its ``ray start`` started, and theirs), with their
    command lines (a PID reused later has another)."""
    return {pid: cmdline(pid) for pid in node.members()}


def still_there(before: dict[int, str]) -> list[str]:
    return [cmd[:80] for pid, cmd in before.items() if alive(pid) and cmdline(pid) == cmd]


def test_the_printed_stop_line_stops_that_node_alone_and_the_address_line_the_other() -> None:
    a = start_node()
    try:
        b = start_node()
        try:
            a_steps, b_steps = next_steps(a), next_steps(b)
            assert shlex.split(a_steps["stop"])[-3:] == ["ray", "stop", f"--temp-dir={a.temp_dir}"]
            assert shlex.split(b_steps["stop cluster"])[-1] == f"--address={b.gcs_address}"
            a_before, b_before = processes(a), processes(b)
            b_group = {pid: cmd for pid, cmd in b_before.items() if _pgid(pid) == b.pgid}
            a_raylet = a.raylet_pid()
            stopped = run_shell(a_steps["stop"], a)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert f"  {a_raylet} raylet: stopped (SIGTERM)" in stopped.stdout.splitlines()
            assert still_there(a_before) == [], stopped.stdout
            assert a.members() == []
            assert len(still_there(b_group)) == len(b_group), "another node's process was stopped"
            ray_counts(b)  # its agent answers
            assert not (a.temp_dir / "ray_current_cluster").exists()
            assert (b.temp_dir / "ray_current_cluster").exists()
            stopped = run_shell(b_steps["stop cluster"], b)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert still_there(b_before) == [], stopped.stdout
            assert b.members() == []
            again = run_shell(a_steps["stop"], a)
            assert again.returncode == 3, again.stdout + again.stderr
            assert "no Ray node to stop" in again.stderr
        finally:
            b.stop()
    finally:
        a.stop()


def test_the_printed_add_line_starts_a_node_on_this_agent_and_the_cluster_line_stops_both() -> None:
    head = start_node()
    try:
        steps = next_steps(head)
        words = shlex.split(steps["add"])
        assert words[-3:] == ["ray", "start", f"--address={head.gcs_address}"]
        # the printed command, with the flags a second node on this machine needs
        node = start_node(head=head, ip="127.0.0.3", cli=words[:-2])
        try:
            if RAY_RELEASE >= (2, 54):  # before, a worker node's session is in its head's folder
                own = shlex.split(next_steps(node)["stop"])
                assert own[-1] == f"--temp-dir={node.temp_dir}"
            assert "stop cluster" not in next_steps(node), "only a head says it"
            before = processes(head) | processes(node)
            stopped = run_shell(steps["stop cluster"], head)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert still_there(before) == [], stopped.stdout
            assert head.members() == []
            assert node.members() == []
        finally:
            node.stop()
    finally:
        head.stop()


def _pgid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[2])
