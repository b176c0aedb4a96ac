"""Nothing of a dead agent stays in a shared root: real agent processes (``rtenv-agent serve``,
and ``rtenv-agent ray-agent`` under a stand-in raylet that starts it as Ray's does) on one root.

An agent killed with SIGKILL leaves its socket, its holder row and lock; the next agent on the
root reaps them at its start (a live agent's never). The Ray agent killed as Ray's raylet kills
it (SIGKILL of the process the raylet started) stops cleanly on its own: socket, link, socket
folder and holder gone. Both of its processes killed: the next agent reaps the socket, the
link in the root and the folder under Ray's temp dir."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.state import sockets
from tests.harness.agent_process import REPO, START_S, STOP_S, serving, stop
from tests.harness.polling import wait_until
from tests.harness.ray_nodes import base_environ
from tests.harness.tempdirs import short_tempdir

pytestmark = pytest.mark.timeout(120)

NODE = "62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777"  # a node id as Ray writes it
# a raylet as far as its agent goes: starts it (its pid printed), waits, is killed by the test
RAYLET = """
import subprocess, sys
agent = subprocess.Popen(
    [sys.executable, "-u", "-m", "agent", "ray-agent", *sys.argv[1:]], stdout=subprocess.DEVNULL
)
print(agent.pid, flush=True)
agent.wait()
"""


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kill_if_alive(pid: int) -> None:
    """The agent a test started, by its pid, if a failure left it running."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def holders(root: Path) -> list[tuple[str, int]]:
    """The holders table: (id, pid)."""
    con = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        return [(str(i), int(p)) for i, p in con.execute("SELECT id, pid FROM holders")]
    finally:
        con.close()


def holder_files(root: Path) -> list[str]:
    folder = root / "holders"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def sockets_in(root: Path) -> list[str]:
    """The root's socket files and links (``agent*.sock``)."""
    return sorted(n for n in os.listdir(root) if n.startswith("agent") and n.endswith(".sock"))


async def test_a_killed_agents_socket_and_holder_are_reaped_by_the_next_agent(
    base: Path,
) -> None:
    """SIGKILL an agent: its socket, holder row and lock stay; the next agent's start reaps
    them; a third agent's start leaves the live one's socket and holder alone."""
    root = base / "root"
    async with serving(
        base / "a.log", "--root", str(root), "--address", f"unix:{root}/agent-a.sock"
    ) as a:
        await wait_until(lambda: len(holders(root)) == 1, timeout_s=START_S, what="a's holder row")
        [(a_id, a_pid)] = holders(root)
        assert a_pid == a.proc.pid
        a.proc.kill()
        await a.proc.wait()
    assert sockets_in(root) == ["agent-a.sock"], "SIGKILL: the socket stays"
    assert holders(root) == [(a_id, a_pid)], "SIGKILL: the holder stays"
    assert f"{a_id}.lock" in holder_files(root)
    b_address = f"unix:{root}/agent-b.sock"
    async with serving(base / "b.log", "--root", str(root), "--address", b_address) as b:

        def reaped() -> bool:
            rows = holders(root)
            files = [f"{i}{suffix}" for i, _ in rows for suffix in (".lock", ".socket")]
            return (
                sockets_in(root) == ["agent-b.sock"]
                and [p for _, p in rows] == [b.proc.pid]
                and holder_files(root) == sorted(files)
            )

        await wait_until(reaped, timeout_s=START_S, what="a's socket and holder reaped by b")
        [(b_id, _)] = holders(root)
        c_args = ("--root", str(root), "--address", f"unix:{root}/agent-c.sock")
        async with serving(base / "c.log", *c_args) as c:
            await wait_until(lambda: len(holders(root)) == 2, timeout_s=START_S, what="c's row")
            assert sockets_in(root) == ["agent-b.sock", "agent-c.sock"], "b lives: kept"
            assert b_id in {i for i, _ in holders(root)}
            await stop(c.proc)
        assert b.proc.returncode is None
    assert sockets_in(root) == [], "a clean stop leaves no socket"
    assert holders(root) == []
    assert holder_files(root) == []


def ray_flags(base: Path, runtime_env_dir: Path) -> list[str]:
    """The flags Ray 2.60's raylet passes its agent."""
    values = {
        "node-id": NODE,
        "node-ip-address": "127.0.0.1",
        "runtime-env-agent-port": "0",
        "session-dir": str(base / "s"),
        "gcs-address": "127.0.0.1:1",
        "cluster-id-hex": "e5e266bae6d3c574950cad939fdb5dac2d17973d87b1580bf10452b7",
        "runtime-env-dir": str(runtime_env_dir),
        "logging-rotate-bytes": "536870912",
        "logging-rotate-backup-count": "5",
        "log-dir": str(base / "s" / "logs"),
        "logging-filename": "runtime_env_agent.log",
        "temp-dir": str(base),
    }
    return [f"--{name}={value}" for name, value in values.items()]


async def start_under_raylet(base: Path, root: Path) -> tuple[asyncio.subprocess.Process, int]:
    """A stand-in raylet that starts ``ray-agent`` on ``root`` (RTENV_ROOT); the raylet and the
    pid of the process it started, once the agent's holder row is there."""
    raylet = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RAYLET, *ray_flags(base, base / "s" / "runtime_resources"),
        cwd=REPO, env=base_environ(RTENV_ROOT=str(root)), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert raylet.stdout is not None
    started = int(await asyncio.wait_for(raylet.stdout.readline(), START_S))
    log = base / "s" / "logs" / "runtime_env_agent.log"

    def serving() -> bool:
        return log.exists() and "serving on" in log.read_text(errors="replace")

    await wait_until(serving, timeout_s=START_S, what="the Ray agent serving")
    return raylet, started


@pytest.mark.parametrize("long_root", [False, True], ids=["socket-in-root", "socket-linked"])
async def test_the_ray_agent_killed_as_rays_raylet_kills_it_leaves_nothing(
    base: Path, long_root: bool
) -> None:
    """SIGKILL the process the raylet started (as Ray's raylet ends its agent at
    ``ray.shutdown()``): its socket (or the link in the root, and the socket's folder under
    Ray's temp dir) and its holder are gone, with no other agent on the root; its log says so
    at INFO (a normal end), with no warning."""
    root = base / ("r" * 100 if long_root else "root")
    raylet, started = await start_under_raylet(base, root)
    [(_, agent_pid)] = holders(root)
    try:
        assert agent_pid != started, "the agent runs in a child of the process Ray started"
        assert sockets_in(root) == [f"agent-{NODE[:16]}.sock"]
        assert os.path.islink(root / sockets_in(root)[0]) is long_root
        os.kill(started, signal.SIGKILL)

        def gone() -> bool:
            folders = [n for n in os.listdir(base) if n.startswith("rtenv-")]
            return not (sockets_in(root) or holders(root) or holder_files(root) or folders)

        await wait_until(gone, timeout_s=STOP_S, what="the agent's socket, folder and holder gone")
        await asyncio.wait_for(raylet.communicate(), STOP_S)
        log = (base / "s" / "logs" / "runtime_env_agent.log").read_text()
        said = f"INFO agent.ops.entry: keeper {started} exited (the raylet ends its agent so when"
        assert said in log, "the node's normal end is no warning"
        assert " WARNING " not in log, log
    finally:
        await stop(raylet)
        kill_if_alive(agent_pid)


async def test_both_ray_agent_processes_killed_the_next_agent_reaps_socket_link_and_folder(
    base: Path,
) -> None:
    """SIGKILL the Ray agent and the process the raylet started (nothing stops cleanly): the
    link in the root, the socket and its folder under Ray's temp dir, the holder stay; the next
    agent on the root reaps them all."""
    root = base / ("r" * 100)
    raylet, started = await start_under_raylet(base, root)
    try:
        [(_, agent_pid)] = holders(root)
        os.kill(agent_pid, signal.SIGKILL)
        os.kill(started, signal.SIGKILL)
        await asyncio.wait_for(raylet.communicate(), STOP_S)
    finally:
        await stop(raylet)
    [folder] = [n for n in os.listdir(base) if n.startswith("rtenv-")]
    assert sockets_in(root) == [f"agent-{NODE[:16]}.sock"]
    assert len(os.listdir(base / folder)) == 1, "the socket stays in its folder"
    address = f"unix:{base}/next.sock"
    async with serving(base / "next.log", "--root", str(root), "--address", address) as nxt:

        def reaped() -> bool:
            rows = holders(root)
            folders = [n for n in os.listdir(base) if n.startswith("rtenv-")]
            return not sockets_in(root) and len(rows) == 1 and not folders

        await wait_until(reaped, timeout_s=START_S, what="link, socket, folder and holder reaped")
        assert [p for _, p in holders(root)] == [nxt.proc.pid]


def test_a_dead_holders_note_never_removes_another_socket_at_its_path(base: Path) -> None:
    """The dead holder's socket was replaced by another agent's, bound and not yet listening:
    reaping the dead holder's note keeps it (its inode is not the one noted); the dead one's own
    socket, nobody listening, goes."""
    root = base / "root"
    (root / "holders").mkdir(parents=True)
    path = str(root / "agent-x.sock")
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(path)
    sockets.note(root, "a" * 32, path, bound=True)
    os.unlink(path)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(path)  # bound, not listening: a connect is refused, as to a dead socket
        sockets.reap(root, "a" * 32)
        assert os.path.exists(path), "another agent's socket at the same path: kept"
        assert sockets.noted(root) == []
        sockets.note(root, "b" * 32, path, bound=True)
        sockets.reap(root, "b" * 32)
        assert not os.path.exists(path), "the noted socket itself, nobody listening: removed"
