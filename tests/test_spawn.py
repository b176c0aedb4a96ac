"""agent.install.venvs.spawn: installers start with no Python code run in the child before exec, on
either loop; their exit is awaited on the loop; a short command's output is kept bounded; a
deadline or a cancellation kills what was started."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.install.venvs import spawn
from agent.ops import loops

UVLOOP = importlib.util.find_spec("uvloop") is not None
NO_UVLOOP = pytest.mark.skipif(not UVLOOP, reason="uvloop is not installed")
LOOPS = ["asyncio", pytest.param("uvloop", marks=NO_UVLOOP)]
DEADLINE_S = 30.0
_hook_file: list[Path] = []  # where the after-fork hook below writes, when a test sets it


def _after_fork_in_child() -> None:
    if _hook_file:
        fd = os.open(_hook_file[0], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, b"the child ran Python code before exec\n")
        os.close(fd)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _run_on(loop_name: str, coro_fn: object) -> object:
    """Run ``coro_fn()`` on a fresh loop of that name, whatever loop this session runs on."""
    factory = loops.loop_factory({loops.ENV: loop_name})
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_fn())  # type: ignore[operator]


def _fork_with_python_in_the_child() -> tuple[int, int]:
    child = subprocess.Popen(["true"], preexec_fn=lambda: None)  # Python between fork and exec
    return os.waitpid(child.pid, 0)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_no_python_code_runs_in_the_child_before_exec_on_either_loop(
    tmp_path: Path, loop_name: str
) -> None:
    """uvloop's own spawn runs the at-fork hooks in the child (what crashed installers now and
    then beside gRPC's threads); the agent's spawn runs none, on asyncio and on uvloop."""
    marker = tmp_path / "hook-ran"
    _hook_file.append(marker)

    async def go() -> int:
        child = await spawn.spawn(["true"], env=os.environ)
        return await asyncio.wait_for(child.wait(), DEADLINE_S)

    try:
        assert _run_on(loop_name, go) == 0
    finally:
        _hook_file.clear()
    assert not marker.exists(), marker.read_text()


async def test_the_hook_above_does_see_a_fork_that_runs_python_in_the_child(
    tmp_path: Path,
) -> None:
    """The oracle of the test above can fail: a preexec_fn is Python in the child, and it shows."""
    marker = tmp_path / "hook-ran"
    _hook_file.append(marker)
    try:
        done = await asyncio.to_thread(_fork_with_python_in_the_child)
    finally:
        _hook_file.clear()
    assert done[1] == 0
    assert marker.exists(), "the at-fork hook did not run where Python code ran in the child"


async def test_wait_gives_the_exit_status_and_a_killed_child_its_signal() -> None:
    child = await spawn.spawn([sys.executable, "-c", "raise SystemExit(7)"], env=os.environ)
    assert await asyncio.wait_for(child.wait(), DEADLINE_S) == 7
    assert await child.wait() == 7, "a second wait answers at once"
    sleeper = await spawn.spawn(["sleep", "60"], env=os.environ)
    sleeper.kill()
    assert await asyncio.wait_for(sleeper.wait(), DEADLINE_S) == -9


async def test_kill_group_kills_the_childs_own_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    child = await spawn.spawn(["sh", "-c", script], env=os.environ, start_new_session=True)
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert asyncio.get_running_loop().time() < deadline, "no grandchild started"
        await asyncio.sleep(0.01)
    grandchild = int(pid_file.read_text())
    child.kill(group=True)
    assert await asyncio.wait_for(child.wait(), DEADLINE_S) == -9
    while Path(f"/proc/{grandchild}").exists() and _state(grandchild) != "Z":
        assert asyncio.get_running_loop().time() < deadline, "the grandchild outlived the kill"
        await asyncio.sleep(0.01)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


async def test_run_keeps_the_last_of_a_large_output_and_both_streams() -> None:
    code = (
        "import sys; sys.stdout.write('a' * 200000); sys.stdout.flush(); "
        "sys.stderr.write('END'); raise SystemExit(3)"
    )
    done = await spawn.run([sys.executable, "-c", code], env=os.environ, timeout_s=DEADLINE_S)
    assert done.code == 3
    assert len(done.output) == spawn.OUTPUT_TAIL_BYTES
    assert done.output.endswith(b"aaaEND")


async def test_run_past_its_deadline_kills_the_command_and_raises_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; exec sleep 60"
    with pytest.raises(TimeoutError):
        await spawn.run(["sh", "-c", script], env=os.environ, timeout_s=0.5)
    pid = int(pid_file.read_text())
    assert _state(pid) == "gone", "the command outlived its deadline (or was not reaped)"


async def test_a_cancelled_run_kills_and_reaps_its_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; exec sleep 60"
    task = asyncio.ensure_future(
        spawn.run(["sh", "-c", script], env=os.environ, timeout_s=DEADLINE_S)
    )
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert asyncio.get_running_loop().time() < deadline, "the command did not start"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _state(int(pid_file.read_text())) == "gone"
