"""The launcher: ``swap_agent_command`` on a raylet's argv as Ray builds it, ``install()`` on Ray's
``start_ray_process``, ``rtenv-agent ray`` as Ray's CLI, and a real ``rtenv-agent ray start``
whose raylet runs this agent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.launcher import (
    AGENT_FLAG,
    agent_command_problem,
    install,
    installed,
    swap_agent_command,
    uninstall,
)
from agent.launcher.ray_cli import announcement
from agent.ops import loops
from agent.ops.ray_swap import running_ray_version
from tests.harness.agent_process import REPO, stop
from tests.harness.polling import wait_until
from tests.harness.ray_switch import cmdline, pids_naming, ppid

RAY = Path("/venv/lib/python3.11/site-packages/ray")
RAY_MAIN = str(RAY / "_private" / "runtime_env" / "agent" / "main.py")


def ray_agent_flags(session: str = "/tmp/r/session_2026-12-01_06-20-47_190192_20069") -> list[str]:
    """Ray 2.60's flags to its agent (services.py start_raylet), without file redirection: the
    stderr logging format then has spaces and a tab."""
    return [
        "--node-id=62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777",
        "--node-ip-address=127.0.0.1",
        "--runtime-env-agent-port=0",
        f"--session-dir={session}",
        "--gcs-address=127.0.0.1:33337",
        "--cluster-id-hex=e5e266bae6d3c574950cad939fdb5dac2d17973d87b1580bf10452b7",
        f"--runtime-env-dir={session}/runtime_resources",
        "--logging-rotate-bytes=536870912",
        "--logging-rotate-backup-count=5",
        f"--log-dir={session}/logs",
        "--temp-dir=/tmp/r",
        "--logging-filename=",
        "--logging-format=%(asctime)s\t%(levelname)s (runtime_env_agent) %(filename)s:%(lineno)s"
        " -- %(message)s",
    ]


def raylet_argv(agent_command: list[str]) -> list[str]:
    """A raylet's argv in the shape services.py gives start_ray_process."""
    worker = [sys.executable, "-u", str(RAY / "_private/workers/default_worker.py"), "--x=a b"]
    return [
        str(RAY / "core/src/ray/raylet/raylet"),
        "--raylet_socket_name=/tmp/r/s/sockets/raylet",
        "--node_id=62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777",
        f"--python_worker_command={subprocess.list2cmdline(worker)}",
        "--runtime_env_agent_port=0",
        "--dashboard_agent_command=" + subprocess.list2cmdline([sys.executable, "-u", "d.py"]),
        AGENT_FLAG + subprocess.list2cmdline(agent_command),
        "--head",
    ]


def _agent_command(argv: list[str]) -> list[str]:
    (flag,) = [a for a in argv if a.startswith(AGENT_FLAG)]
    return shlex.split(flag.removeprefix(AGENT_FLAG))


# -- swap_agent_command (pure) ---------------------------------------------------------------


def test_the_swap_names_this_agent_with_rays_flags_unchanged_and_leaves_the_rest() -> None:
    argv = raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])
    swapped = swap_agent_command(argv)
    assert _agent_command(swapped) == [
        sys.executable, "-u", "-I", "-m", "agent", "ray-agent", *ray_agent_flags(),
    ]  # fmt: skip
    i = next(n for n, a in enumerate(argv) if a.startswith(AGENT_FLAG))
    assert swapped[:i] + swapped[i + 1 :] == argv[:i] + argv[i + 1 :]
    assert argv == raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])  # not changed


def test_the_swap_is_idempotent() -> None:
    once = swap_agent_command(raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()]))
    assert swap_agent_command(once) == once


def test_a_memory_profiler_prefix_and_paths_with_spaces_survive_the_swap() -> None:
    flags = ray_agent_flags(session="/tmp/my ray/session_1")
    profiled = ["/usr/bin/python3", "-u", "-m", "memray", "run", "-o", "/tmp/x.bin", RAY_MAIN]
    swapped = swap_agent_command(raylet_argv([*profiled, *flags]))
    assert _agent_command(swapped)[6:] == flags


def test_a_raylet_command_without_rays_agent_is_left_alone() -> None:
    argv = raylet_argv(["/opt/some/other/agent", "--x=1"])
    assert swap_agent_command(argv) == argv
    assert swap_agent_command(["gcs_server", "--log_dir=/x"]) == ["gcs_server", "--log_dir=/x"]


def test_the_agents_command_ignores_a_users_own_agent_package_on_pythonpath(
    tmp_path: Path,
) -> None:
    """The raylet passes PYTHONPATH on: an ``agent`` package there must not replace this one;
    the agent still sees PYTHONPATH in its environment (for the workers' contexts)."""
    fake = tmp_path / "agent"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("print('the user agent ran'); raise SystemExit(7)\n")
    argv = raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])
    ours = _agent_command(swap_agent_command(argv))[:6]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    probe = "import os, agent; print(agent.__file__); print(os.environ['PYTHONPATH'])"
    shown = subprocess.run(
        [*ours[:3], "-c", probe], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    where, pythonpath = shown.stdout.splitlines()
    assert Path(where).resolve() == REPO / "agent" / "__init__.py"
    assert pythonpath == str(tmp_path)
    helped = subprocess.run(
        [*ours, "--help"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "the user agent ran" not in helped.stdout
    assert helped.returncode == 0, helped.stderr
    assert "rtenv-agent ray-agent" in helped.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["raylet", "--node_id=1"], "has no --runtime_env_agent_command= flag"),
        (raylet_argv(["/opt/other/agent.py", "--x=1"]), "names neither Ray's"),
    ],
)
def test_a_raylet_command_the_swap_does_not_know_is_named_in_a_warning(
    recorded: list[tuple[str, list[str]]],
    caplog: pytest.LogCaptureFixture,
    argv: list[str],
    said: str,
) -> None:
    from ray._private import services

    install()
    with caplog.at_level(logging.WARNING, logger="agent.ray"):
        services.start_ray_process(argv, "raylet", fate_share=False)
    assert recorded == [("raylet", argv)]  # started as it is
    (record,) = [r for r in caplog.records if r.name == "agent.ray"]
    assert said in record.getMessage()
    assert "not this one" in record.getMessage()


def test_rays_own_agent_and_ours_are_no_problem() -> None:
    argv = raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])
    assert agent_command_problem(argv) is None
    assert agent_command_problem(swap_agent_command(argv)) is None


# -- install() on Ray's start_ray_process ----------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, list[str]]]]:
    """Ray's start_ray_process replaced by a recorder (no process is started); install()
    wraps whatever is there."""
    from ray._private import services

    calls: list[tuple[str, list[str]]] = []

    def record(command: list[str], process_type: str, *a: Any, **kw: Any) -> str:
        calls.append((process_type, list(command)))
        return "started"

    monkeypatch.setattr(services, "start_ray_process", record)
    try:
        yield calls
    finally:
        uninstall()


def test_install_swaps_the_agent_of_raylets_only_and_uninstall_restores_ray(
    recorded: list[tuple[str, list[str]]],
) -> None:
    from ray._private import services

    ray_own = services.start_ray_process
    argv = raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])
    assert not installed()
    install()
    install()  # twice: still one wrapper
    assert installed()
    assert services.start_ray_process.__wrapped__ is ray_own  # type: ignore[attr-defined]
    assert services.start_ray_process(argv, "raylet", fate_share=False) == "started"
    assert services.start_ray_process(argv, "gcs_server", fate_share=False) == "started"
    assert recorded[0] == ("raylet", swap_agent_command(argv, ray_version=running_ray_version()))
    assert f"--ray-version={running_ray_version()} " in " ".join(recorded[0][1])
    assert recorded[1] == ("gcs_server", argv)
    uninstall()
    assert not installed()
    assert services.start_ray_process is ray_own
    services.start_ray_process(argv, "raylet", fate_share=False)
    assert recorded[2] == ("raylet", argv)


def test_install_tells_on_swap_each_raylet_command_it_swapped_and_no_other(
    recorded: list[tuple[str, list[str]]],
) -> None:
    from ray._private import services

    told: list[list[str]] = []
    ours = raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()])
    other = raylet_argv(["/opt/other/agent.py", "--x=1"])
    install(on_swap=told.append)
    services.start_ray_process(ours, "raylet", fate_share=False)
    services.start_ray_process(ours, "gcs_server", fate_share=False)
    services.start_ray_process(other, "raylet", fate_share=False)
    assert told == [swap_agent_command(ours, ray_version=running_ray_version())]
    assert recorded[0] == ("raylet", told[0])  # told before it started
    uninstall()
    install()
    services.start_ray_process(ours, "raylet", fate_share=False)
    assert len(told) == 1, "uninstall() forgets on_swap"


def test_the_announcement_names_this_agent_and_its_root_in_rays_session_or_rtenv_root() -> None:
    session = "/tmp/r/session_2026-12-01_06-20-47_190192_20069"
    swapped = swap_agent_command(raylet_argv([sys.executable, "-u", RAY_MAIN, *ray_agent_flags()]))
    said = announcement(swapped, {})
    assert said.startswith(
        "rtenv-agent ray: this node's runtime env agent is runtime-env-agent's (rtenv-agent "
        f"ray-agent), not Ray's; its root: '{session}/runtime_resources/rtenv', in Ray's session"
    ), said
    assert "set RTENV_ROOT to keep one" in said
    kept = announcement(swapped, {"RTENV_ROOT": "/data/rtenv\n" + "x" * 1000})
    assert "(RTENV_ROOT); what it holds: " in kept, kept
    assert "'/data/rtenv\\nxxx" in kept, "quoted, control characters escaped"
    assert "(1012 characters)" in kept, "cut"
    assert "\n" not in kept, "one line"


# -- rtenv-agent ray -------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "ray", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_rtenv_agent_ray_is_rays_cli_with_its_exit_code() -> None:
    helped = _cli("status", "--help")  # stop is ours (agent.launcher.stop)
    assert helped.returncode == 0, helped.stderr
    assert "Print cluster status" in helped.stdout
    assert "runtime env agent" not in helped.stderr, "said only as a raylet starts"
    wrong = _cli("no-such-command")
    assert wrong.returncode == 2
    assert "no-such-command" in wrong.stderr


def test_rtenv_agent_ray_without_ray_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no ray here (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = _cli("start", "--head", env=env)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("rtenv-agent ray: Ray is not installed"), result.stderr


# -- a real node -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _kill_all_naming(text: str) -> None:
    """Stop our node by its PIDs: SIGTERM, a bounded wait, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = pids_naming(text)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids_naming(text) and time.monotonic() < deadline:
            time.sleep(0.1)


async def test_rtenv_agent_ray_start_gives_the_raylet_this_agent_as_its_child(
    tmp_path: Path,
) -> None:
    """The raylet runs this agent as its child; the launcher says so on stderr, in one line
    naming the root the agent then serves, in Ray's session."""
    temp = tempfile.mkdtemp(prefix="r-launch-", dir="/tmp")
    said = tmp_path / "launcher.err"
    ports = [str(_free_port()) for _ in range(4)]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTENV_", "RAY_ADDRESS")) or k == loops.ENV  # the session's loop
    }
    with said.open("wb") as err:  # the child holds its own copy
        launcher = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "ray", "start", "--head", "--temp-dir", temp,
            "--node-ip-address", "127.0.0.1", "--port", ports[0], "--ray-client-server-port",
            ports[1], "--dashboard-port", ports[2], "--dashboard-agent-listen-port", ports[3],
            "--include-dashboard=false", "--num-cpus", "1", "--disable-usage-stats",
            cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    found: dict[str, int] = {}

    def raylet_with_our_agent() -> bool:
        for pid in pids_naming(temp):
            cmd = cmdline(pid)
            if cmd and cmd[0].endswith("/raylet"):
                found["raylet"] = pid
            if cmd[1:6] == ["-u", "-I", "-m", "agent", "ray-agent"]:
                found["agent"] = pid
        return "raylet" in found and "agent" in found

    try:
        await wait_until(raylet_with_our_agent, timeout_s=60, what="a raylet and our agent")
        raylet_cmd = cmdline(found["raylet"])
        agent_command = _agent_command(raylet_cmd)
        assert agent_command[:6] == [sys.executable, "-u", "-I", "-m", "agent", "ray-agent"]
        assert f"--temp-dir={temp}" in agent_command
        assert ppid(found["agent"]) == found["raylet"]
        assert cmdline(found["agent"]) == agent_command
        (line,) = [x for x in said.read_text().splitlines() if "runtime env agent" in x]
        flags = agent_command[agent_command.index("ray-agent") + 1 :]
        (flag,) = [f for f in flags if f.startswith("--runtime-env-dir=")]
        root = Path(flag.partition("=")[2]) / "rtenv"
        assert line.startswith(
            "rtenv-agent ray: this node's runtime env agent is runtime-env-agent's (rtenv-agent "
            f"ray-agent), not Ray's; its root: '{root}', in Ray's session"
        ), line
        assert str(root).startswith(f"{temp}/session_"), root
        # the raylet then reads the port file and the node comes up
        code = await asyncio.wait_for(launcher.wait(), 90)
        assert code == 0, "rtenv-agent ray start failed"
        # the root said is the one the agent serves (Ray before 2.54 waits for no port file:
        # its ray start may return before the agent made it)
        await wait_until(root.is_dir, timeout_s=30, what=f"the agent's root {root}")
    finally:
        await stop(launcher)
        await asyncio.to_thread(_kill_all_naming, temp)
        left = pids_naming(temp)
        shutil.rmtree(temp, ignore_errors=True)
    assert left == [], [cmdline(p) for p in left]
