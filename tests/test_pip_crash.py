"""Whole agent processes killed (-9) inside a venv's install: a restart on the same root keeps
nothing of it, drains tmp/, and the next create builds the venv again. The agent's index is the
real state.db, read from the test."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import grpc
import pytest

from tests.harness.crashing_agent import AgentProc, agent_process, leftovers, listing, read_index
from tests.harness.in_process import listed
from tests.harness.pip_wheels import (
    isolate_pip,
    pip_env,
    processes_mentioning,
    read_pids,
    reaped,
    run,
    slow_env,
    slow_sdist,
    survivors,
)
from tests.harness.polling import wait_until

BUILD_S = 60.0


@pytest.fixture(autouse=True)
def agent_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent processes inherit this environment: pip without this machine's configuration,
    and gRPC's fork support off, the workaround for the bug pinned by test_pip_env.py's
    test_installer_spawns_survive_grpc_traffic_in_the_agent."""
    isolate_pip(monkeypatch)


def pip_dirs(root: Path) -> list[str]:
    return [name for name in listing(root / "uris") if name.startswith("pip-")]


async def imports_alpha(python: str) -> str:
    code, out, err = await run(python, "-c", "import alpha_pkg; print(alpha_pkg.VALUE)")
    assert code == 0, err
    return out.strip()


async def recovered_with_nothing(agent: AgentProc, root: Path) -> None:
    """No venv directory, no row, no package reported; tmp/ and trash/ drained."""
    assert agent.address, agent.log_text()
    assert pip_dirs(root) == []
    assert read_index(root).uris == {}
    info = await agent.info()
    assert list(info.uris) == []
    await wait_until(lambda: not leftovers(root), timeout_s=10, what="tmp/, trash/ drained")


@pytest.mark.parametrize("point", ["after_extract", "before_rename"])
async def test_a_crash_after_the_venv_is_built_leaves_nothing_kept_and_the_next_create_builds(
    point: str, base: Path, wheels: Path
) -> None:
    root = base / "root"
    env = pip_env(["alpha-pkg"], wheels)
    async with agent_process(root, base / "armed.log", crash_at=point) as armed:
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await armed.create(env)
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value
        assert await armed.died() == -signal.SIGKILL, armed.log_text()
    [staging] = (root / "tmp").glob("*/*")  # tmp/<the dead agent's holder id>/<random>
    venv = staging / "venv"
    assert list(venv.glob("lib/python*/site-packages/alpha_pkg/__init__.py")), "venv not built"
    assert pip_dirs(root) == [], "the crash came after the rename"

    async with agent_process(root, base / "clean.log") as clean:
        await recovered_with_nothing(clean, root)
        reply = await clean.create(env)
        python = reply.context.py_executable
        assert await imports_alpha(python) == "alpha 1.0"
        [venv_dir] = pip_dirs(root)
        assert python == str(root.resolve() / "uris" / venv_dir / "bin" / "python")
        assert [(d, kind) for d, (kind, _, _) in read_index(root).uris.items()] == [
            (venv_dir, "pip")
        ]
        await clean.sigterm()


async def kill_mid_install(root: Path, log: Path, slow: Path, found: set[int]) -> None:
    """Start an agent, let its installer hang in the build backend, note the installer's
    processes in ``found``, and SIGKILL the agent (by its pid)."""
    pidfile = slow / "backend.pids"
    async with agent_process(root, log) as agent:
        create = asyncio.create_task(agent.create(slow_env(slow)))
        try:
            await wait_until(pidfile.exists, timeout_s=BUILD_S, what="pip in the build backend")
            found.update(read_pids(pidfile))
            found.update(processes_mentioning(f"{root.resolve() / 'tmp'}/"))
            assert len(found) >= 3, "pip under the venv, the backend and its child"
            agent.proc.send_signal(signal.SIGKILL)
            assert await agent.died() == -signal.SIGKILL
        finally:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await asyncio.wait_for(create, 30)


async def test_a_kill_9_mid_install_leaves_nothing_that_recovery_keeps(
    base: Path, tmp_path: Path
) -> None:
    root, slow = base / "root", tmp_path / "slow"
    slow_sdist(slow)
    with reaped(set()) as found:
        await kill_mid_install(root, base / "killed.log", slow, found)
        async with agent_process(root, base / "clean.log") as clean:
            await recovered_with_nothing(clean, root)
            assert listed(root, "tmp") == []
            await clean.sigterm()


async def test_a_kill_9_mid_install_leaves_no_installer_process_running(
    base: Path, tmp_path: Path
) -> None:
    """The installer dies with the agent: its whole process group, not only the process the
    agent started (pip), whose children (pip re-run under the venv's python, a build backend
    and its child) would otherwise run on, orphaned, for an install nobody will ever use."""
    root, slow = base / "root", tmp_path / "slow"
    slow_sdist(slow)
    with reaped(set()) as found:
        await kill_mid_install(root, base / "killed.log", slow, found)
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: not survivors(found), timeout_s=10)
        assert survivors(found) == {}, "installer processes outlived the agent (10 s on)"
