"""The Ray switch's test rig: Python environments to switch, an installation of this agent to
switch them to, ``rtenv-agent ray enable|disable|enabled`` run as a user runs it, and a bare
``ray.init()`` driver run as a process of its own, read while it waits.

- ``ray_venv``: a venv (no pip) that can import Ray: a ``.pth`` naming the site-packages of the
  python running the tests (Ray 2.60 is there). Test-only: a user's env has Ray installed. It has
  no ``agent``: that package is not on the path a plain path entry gives (this repository is
  installed there as an editable finder, which a ``.pth`` path line does not run).
- ``agent_venv``: the agent's own installation, as a user's ``pip install runtime-env-agent`` makes
  it: a venv whose ``.pth`` names this repository first, then that site-packages; ``-I`` keeps
  both, so a raylet's ``<python> -u -I -m agent ray-agent`` runs this checkout's agent; and its
  ``bin/rtenv-agent`` script.
- ``Driver``: ``launch.py`` (below: a bare ``ray.init(num_cpus=1)``, one task, no import of the
  agent) in a process of its own; it prints ``TASK <pid>`` and waits for a line on stdin while
  the test reads the node's processes, found by the driver's short ``RAY_TMPDIR`` in their
  command lines; stopped by those PIDs, never ``ray stop``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.agent_process import REPO
from tests.harness.uv_projects import UV

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"
RAY_AGENT_MAIN = "runtime_env/agent/main.py"  # in Ray's own agent's command line
OUR_AGENT = ["-u", "-I", "-m", "agent", "ray-agent"]
TASK_S = 150.0  # a driver: ray.init, its node up, one task run (a worker started, maybe by uv)
EXIT_S = 60.0  # a driver to shut its node down and exit once told
LAUNCH = """\
import os
import sys

import ray

ray.init(num_cpus=1)


@ray.remote
def where():
    return os.getpid()


print("TASK", ray.get(where.remote(), timeout=120), flush=True)
sys.stdin.readline()  # the test reads the node's processes meanwhile
ray.shutdown()
"""


def site_packages(venv: Path) -> Path:
    return venv / "lib" / PY / "site-packages"


def _venv(path: Path, lines: list[str]) -> Path:
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)],
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    (site_packages(path) / "zz_test_paths.pth").write_text("".join(f"{x}\n" for x in lines))
    return path / "bin" / "python"


def tests_site_packages() -> str:
    """The site-packages of the python running the tests, where Ray is."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None, "Ray is not installed here"
    assert spec.origin is not None, "Ray is not installed here"
    return str(Path(spec.origin).parent.parent)


def ray_venv(path: Path) -> Path:
    """A venv whose python imports Ray (and not this agent); its python."""
    return _venv(path, [tests_site_packages()])


def agent_venv(path: Path) -> Path:
    """The agent's own installation: its python imports this checkout's agent, isolated too;
    ``rtenv-agent`` beside it, as pip writes the console script."""
    python = _venv(path, [str(REPO), sysconfig.get_paths()["purelib"], tests_site_packages()])
    script = python.parent / "rtenv-agent"
    script.write_text(SCRIPT.replace("PYTHON", shlex.quote(str(python))))
    script.chmod(0o755)
    return python


# a console script as pip writes it where its python's path has a space (which a #! line cannot
# hold): sh runs the python on the script; to Python the first lines are a string
SCRIPT = """#!/bin/sh
'''exec' PYTHON "$0" "$@"
' '''
import sys
from agent.launcher.main import main
sys.exit(main())
"""


def switch(
    python: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rtenv-agent ray ARGS`` run by ``python`` (the agent's installation)."""
    return subprocess.run(
        [str(python), "-m", "agent", "ray", *args], cwd="/", env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def switched(venvs: Path, root: Path) -> tuple[Path, Path]:
    """The agent's installation (``venvs/agent``, its uv beside its python, where the agent's
    uv extra puts it) and a python with Ray (``venvs/ray``) whose nodes run it on ``root``
    (``enable``): (the agent's python, the Ray python). A failed ``enable`` is a RuntimeError
    quoting it."""
    agent_python = agent_venv(venvs / "agent")
    (agent_python.parent / "uv").symlink_to(UV)
    python = ray_venv(venvs / "ray")
    done = switch(agent_python, "enable", "--python", str(python), "--root", str(root))
    if done.returncode != 0:
        raise RuntimeError(f"rtenv-agent ray enable: {done.stderr.strip()}")
    return agent_python, python


PYPROJECT = """\
[project]
name = "experiment"
version = "0.1.0"
requires-python = ">=3.9"
dependencies = []
"""


def uv_environ(base: dict[str, str], tmp: Path, project: Path) -> dict[str, str]:
    """uv offline, with a cache and config of the test's own; the project's venv named
    absolutely (``UV_PROJECT_ENVIRONMENT``), so that a worker's ``uv run`` in its copy of the
    working dir runs in that venv, which has Ray (a fresh one would not: test-only)."""
    env = {k: v for k, v in base.items() if not k.startswith("UV_")}
    temp = tmp / "uv-tmp"  # uv leaves its lock files (uv-<hash>.lock) in the temp dir
    temp.mkdir(exist_ok=True)
    env.update(
        UV_OFFLINE="1", UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never",
        UV_CACHE_DIR=str(tmp / "uv-cache"), UV_PROJECT_ENVIRONMENT=str(project / ".venv"),
        TMPDIR=str(temp),
    )  # fmt: skip
    return env


def uv_project(uv: str, project: Path, env: dict[str, str]) -> Path:
    """A uv project with no dependencies, synced offline with the tests' base python, its venv
    given Ray the test-only way; its venv's python."""
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "launch.py").write_text(LAUNCH)
    base_python = str(Path(sys._base_executable).resolve())  # type: ignore[attr-defined]
    subprocess.run(
        [uv, "sync", "--offline", "--python", base_python], cwd=project, env=env,
        check=True, timeout=120, capture_output=True,
    )  # fmt: skip
    (site_packages(project / ".venv") / "zz_test_paths.pth").write_text(
        tests_site_packages() + "\n"
    )
    return project / ".venv" / "bin" / "python"


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rpartition(")")[2].split()[1])


def pids_naming(text: str) -> list[int]:
    """The live processes whose command line names ``text`` (a test's own temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        pid = int(entry.name) if entry.name.isdigit() else os.getpid()
        if pid != os.getpid() and any(text in part for part in cmdline(pid)):
            found.append(pid)
    return found


def kill_naming(text: str) -> list[int]:
    """SIGKILL the processes naming ``text``, a bounded number of rounds; those left."""
    for _ in range(50):
        pids = pids_naming(text)
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return pids_naming(text)


@dataclass
class Driver:
    """A driver process: its stdout lines as they come, its stderr in a file."""

    process: subprocess.Popen[str]
    err: Path
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def task_pid(self) -> int:
        """Wait for ``TASK <pid>``: the node is up and ran a task."""
        deadline = time.monotonic() + TASK_S
        while time.monotonic() < deadline:
            said = [x for x in self.lines if x.startswith("TASK ")]
            if said:
                return int(said[0].split()[1])
            if self.process.poll() is not None:
                time.sleep(0.2)  # the reader's last lines
                said = [x for x in self.lines if x.startswith("TASK ")]
                if said:
                    return int(said[0].split()[1])
                break
            time.sleep(0.1)
        raise AssertionError(
            f"the driver ran no task (exit {self.process.poll()}): {self.lines[-5:]} "
            f"{self.err.read_text()[-3000:]}"
        )

    def finish(self) -> int:
        """Let it shut down and exit; its exit code."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.write("\n")
            self.process.stdin.close()
        return self.process.wait(EXIT_S)


@contextlib.contextmanager
def driver(command: list[str], cwd: Path, env: dict[str, str], mark: str):  # type: ignore[no-untyped-def]
    """Run ``command`` (a driver) in ``cwd``; on the way out, whatever names ``mark`` (the
    driver's temp dir: its node's processes) is killed by PID."""
    err = cwd.parent / f"{cwd.name}-driver.err"  # not in cwd: a uv run driver uploads cwd
    with err.open("w") as stderr:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, text=True, start_new_session=True,
        )  # fmt: skip
    try:
        yield Driver(process, err)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(EXIT_S)
        left = kill_naming(mark)
        assert left == [], [cmdline(p) for p in left]


def raylet(mark: str) -> tuple[int, list[str]] | None:
    """The node's raylet, found by ``mark`` in its command line: its pid and command line."""
    for pid in pids_naming(mark):
        cmd = cmdline(pid)
        if cmd and cmd[0].endswith("/raylet"):
            return pid, cmd
    return None


def children(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and ppid(int(entry.name)) == pid
    ]


def node_agent(raylet_pid: int) -> tuple[int, list[str]] | None:
    """The raylet's runtime env agent, this agent or Ray's (whose process title is
    ``ray::RuntimeEnvAgent``): its pid and command line; None when there is none (yet)."""
    for pid in children(raylet_pid):
        cmd = cmdline(pid)
        if cmd[1:6] == OUR_AGENT or "RuntimeEnvAgent" in " ".join(cmd[:1]):
            return pid, cmd
        if any(part.endswith(RAY_AGENT_MAIN) for part in cmd):
            return pid, cmd
    return None
