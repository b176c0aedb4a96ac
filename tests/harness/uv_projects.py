"""uv PROJECT folders as the `uv run` user has them, for the tests and the uv-run benchmark: a
virtual project (``pyproject.toml`` with ``[project]`` dependencies on Ray and the large
dependency, no build system; ``[tool.uv]`` find-links to offline folders, ``no-index``), a
``uv.lock`` made by the real uv offline, a ``.gitignore`` naming ``.venv`` (what ``uv init``
writes, and what keeps the driver's venv out of the working_dir Ray uploads) and ``launch.py``,
an unmodified driver: a bare ``ray.init(num_cpus=2)``, tasks and an actor that import the
dependency and report facts about their worker process.

The driver prints one line per fact, ``FACT {json}``: ``start`` (its own clock at the top),
``init`` (the job's runtime env, after ``ray.init``), ``task`` and ``actor`` (a worker's
facts: pid, ``sys.executable``, ``VIRTUAL_ENV``, cwd, the ``bigdep`` payload's size, whether
``uv`` is among its ancestor processes, its ancestors' command lines) and ``done``; each with
``time.time()`` (the parent compares them with its own clock: the same machine).

The environment ``uv_environ`` gives uv and Ray: no index (every proxy at a closed port of
127.0.0.1, ``UV_OFFLINE``, no python downloads), the cache where the caller says, and the base
interpreter of this python as the project's python (``UV_PYTHON``), which Ray's uv-run hook
also passes to the workers' ``uv run --python``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.ray_wheelhouse import BIG, RAY_VERSION, user_base

UV = Path(sys.executable).with_name("uv")  # the dev venv's uv (a binary named uv: Ray's hook
# looks for an ancestor whose argv[0]'s name is "uv")
FACT = "FACT "
_CLOSED = "http://127.0.0.1:9"
# the top of every driver: its start fact, then ray, and its workers' ancestors' command lines
LAUNCH_HEAD = '''"""An experiment's driver, as its user wrote it: a bare ray.init()."""
import json
import os
import sys
import time

print("FACT " + json.dumps({"kind": "start", "t": time.time(), "pid": os.getpid()}), flush=True)
import ray


def _ancestors():
    """Each ancestor's command line, nearest first (read from /proc)."""
    out, pid = [], os.getppid()
    for _ in range(64):
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\\0")
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        out.append([a.decode(errors="replace") for a in argv if a])
    return out
'''
LAUNCH_PY = (
    LAUNCH_HEAD
    + """

def facts(kind):
    import bigdep

    ancestors = _ancestors()
    return {
        "kind": kind, "t": time.time(), "pid": os.getpid(), "executable": sys.executable,
        "virtual_env": os.environ.get("VIRTUAL_ENV"), "cwd": os.getcwd(),
        "bigdep_version": bigdep.VERSION, "bigdep_size": bigdep.size(),
        "bigdep_file": bigdep.__file__,
        "uv_ancestor": any(a and os.path.basename(a[0]) == "uv" for a in ancestors),
        "ancestors": [" ".join(a)[:300] for a in ancestors[:6]],
    }


@ray.remote
def task(i):
    write_mib = int(os.environ.get("EXPERIMENT_WRITE_MIB") or 0)  # the test's knob
    if i == 0 and write_mib:  # an output written into the working dir, as users do
        with open("output.bin", "wb") as f:
            f.write(os.urandom(write_mib * 2**20))
    return facts("task")


@ray.remote
class Holder:
    def report(self):
        return facts("actor")


ray.init(num_cpus=2)
env = ray.get_runtime_context().runtime_env
print("FACT " + json.dumps({"kind": "init", "t": time.time(), "runtime_env": dict(env)}),
      flush=True)
pending = [task.remote(i) for i in range(4)]
first, pending = ray.wait(pending, num_returns=1)
print("FACT " + json.dumps(ray.get(first[0])), flush=True)
for result in ray.get(pending):
    print("FACT " + json.dumps(result), flush=True)
holder = Holder.remote()
print("FACT " + json.dumps(ray.get(holder.report.remote())), flush=True)
print("FACT " + json.dumps({"kind": "done", "t": time.time()}), flush=True)
"""
)


def base_python() -> Path:
    """The interpreter this venv's python was made from (uv finds it offline)."""
    v = sys.version_info
    return Path(sys.base_prefix) / "bin" / f"python{v.major}.{v.minor}"


def uv_environ(cache: Path, base: Mapping[str, str], **extra: str) -> dict[str, str]:
    """``base`` for uv and Ray, offline: uv's cache at ``cache``, no python downloads, the
    project's python this one's base, every proxy at a closed loopback port, no venv active
    and no uv settings of the machine's; then ``extra``."""
    env = {k: v for k, v in base.items() if not k.startswith("UV_") and k != "VIRTUAL_ENV"}
    for key in ("NO_PROXY", "no_proxy"):
        env.pop(key, None)
    env.update({key: _CLOSED for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                          "http_proxy", "https_proxy")})  # fmt: skip
    env.update(
        UV_CACHE_DIR=str(cache), UV_OFFLINE="1", UV_PYTHON_DOWNLOADS="never",
        UV_PYTHON=str(base_python()), UV_NO_PROGRESS="1",
    )  # fmt: skip
    env.update(extra)
    return env


def pyproject(
    name: str, find_links: Sequence[Path], big_version: str, requires: Sequence[str] = ()
) -> str:
    """A virtual project on Ray and ``requires``, or, when none, ``bigdep==big_version``."""
    v = sys.version_info
    links = ", ".join(json.dumps(str(p)) for p in find_links)
    deps = ", ".join(
        json.dumps(d) for d in [f"ray=={RAY_VERSION}", *(requires or [f"{BIG}=={big_version}"])]
    )
    return (
        f'[project]\nname = {json.dumps(name)}\nversion = "0.1.0"\n'
        f'requires-python = "=={v.major}.{v.minor}.*"\n'
        f"dependencies = [{deps}]\n\n"
        f"[tool.uv]\nfind-links = [{links}]\nno-index = true\n"
        "environments = [\"sys_platform == 'linux'\"]\n"
    )


@dataclass(frozen=True)
class Project:
    path: Path
    big_version: str

    @property
    def lock(self) -> Path:
        return self.path / "uv.lock"

    @property
    def venv(self) -> Path:
        return self.path / ".venv"


def make_project(
    path: Path,
    find_links: Sequence[Path],
    env: Mapping[str, str],
    *,
    big_version: str = "1.0",
    note: str = "",
    lock_from: Project | None = None,
    requires: Sequence[str] = (),
    launch: str = LAUNCH_PY,
) -> Project:
    """A project folder at ``path``: pyproject.toml (named after the folder), launch.py,
    .gitignore, ``experiment.txt`` holding ``note`` (the one file experiments differ by), and
    uv.lock: copied from ``lock_from`` (same pyproject, so the same lock: saves a resolve) or
    made by ``uv lock --offline`` with ``env`` (``uv_environ``'s). ``requires``: the project's
    dependencies besides Ray (default ``bigdep``); ``launch``: the driver's text."""
    path.mkdir(parents=True, exist_ok=True)
    text = pyproject("experiment", find_links, big_version, requires)
    (path / "pyproject.toml").write_text(text)
    (path / "launch.py").write_text(launch)
    (path / ".gitignore").write_text(".venv\n")
    (path / "experiment.txt").write_text(note + "\n")
    project = Project(path, big_version)
    if lock_from is not None and lock_from.big_version == big_version:
        project.lock.write_bytes(lock_from.lock.read_bytes())
    else:
        run_uv(["lock", "--offline"], path, env)
    return project


def run_uv(args: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float = 300) -> str:
    """``uv ARGS`` in ``cwd``; its output, or an error with its tail."""
    done = subprocess.run(
        [str(UV), *args], cwd=cwd, env=dict(env), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"uv {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def launch_command(extra_uv_args: Sequence[str] = ()) -> list[str]:
    """The user's command: ``uv run --offline [ARGS] python launch.py``, by ``user_uv()``."""
    return [str(user_uv()), "run", "--offline", *extra_uv_args, "python", "launch.py"]


@functools.cache
def user_uv() -> Path:
    """``UV`` at a path without a space, as a user's uv is (``~/.local/bin/uv``): Ray's uv-run
    hook joins the driver's ``uv run`` line with spaces, unquoted, into the workers'
    ``py_executable``, so a uv whose path has one (a clone in "a b-c/") breaks every worker's
    command, with Ray's agent as with this one. Where ``UV``'s path has a space: a link to it,
    named ``uv``, in this user's folder beside the wheelhouse (``/tmp/rtenv-wheelhouse-<uid>``)."""
    if " " not in str(UV):
        return UV
    folder = user_base() / "bin"
    folder.mkdir(mode=0o700, exist_ok=True)
    link = folder / "uv"
    if not link.is_symlink() or os.readlink(link) != str(UV):
        fresh = folder / f".uv-{os.getpid()}"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(UV)
        os.replace(fresh, link)
    if " " in str(link):
        raise RuntimeError(f"no path without a space for uv: {link} (set RTENV_WHEELHOUSE_BASE)")
    return link


def parse_facts(stdout: str) -> list[dict[str, Any]]:
    """The driver's ``FACT`` lines, in order."""
    return [json.loads(line[len(FACT) :]) for line in stdout.splitlines() if line.startswith(FACT)]


def worker_facts(facts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [f for f in facts if f.get("kind") in ("task", "actor")]


def workers_running_uv(facts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The workers (``task pid ...``) that ran under ``uv run``: a uv among their ancestors
    below their raylet (the driver's own ``uv run`` is above it: a local cluster's raylet is a
    child of the driver). Stock Ray's hook gives every worker ``uv run``; the agent's `uv run`
    build gives none (issue 30 item 1): ``assert workers_running_uv(facts) == []``."""
    return [
        f"{f['kind']} pid {f['pid']} ({f['executable']}; {f['ancestors'][:2]})"
        for f in worker_facts(facts)
        if _uv_below_raylet(f["ancestors"])
    ]


def _uv_below_raylet(ancestors: Sequence[str]) -> bool:
    """Whether a uv comes before the raylet in a worker's ancestors' command lines (nearest
    first)."""
    for line in ancestors:
        program = os.path.basename(line.split(" ", 1)[0])
        if program == "raylet":
            return False
        if program == "uv":
            return True
    return False


def check_driver_facts(facts: Sequence[Mapping[str, Any]], big_bytes: int) -> list[str]:
    """What is wrong with a driver's facts (empty: nothing): it started, initialised, and 4
    tasks and an actor each imported ``bigdep`` with its ``big_bytes`` payload."""
    kinds = [f.get("kind") for f in facts]
    problems = [f"no {k!r} fact" for k in ("start", "init", "done") if k not in kinds]
    if kinds.count("task") != 4 or kinds.count("actor") != 1:
        problems.append(f"{kinds.count('task')} task and {kinds.count('actor')} actor facts")
    problems += [
        f"{f['kind']} pid {f['pid']}: bigdep size {f['bigdep_size']}, not {big_bytes}"
        for f in worker_facts(facts)
        if f["bigdep_size"] != big_bytes
    ]
    return problems


def first_task_s(facts: Sequence[Mapping[str, Any]], since: float) -> float:
    """Seconds from ``since`` (``time.time()``) to the first task's result."""
    return float(min(f["t"] for f in facts if f.get("kind") == "task")) - since


def job_py_executable(facts: Sequence[Mapping[str, Any]]) -> str:
    """The job's ``py_executable`` as the driver saw it after ``ray.init`` ("" if none)."""
    for f in facts:
        if f.get("kind") == "init":
            return str(f["runtime_env"].get("py_executable", ""))
    return ""


def ray_environ(cache: Path, ray_tmpdir: Path, **extra: str) -> dict[str, str]:
    """``uv_environ`` over this process's environment for an experiment's driver: Ray's temp
    dir ``ray_tmpdir``, no usage stats, token auth off, no Ray or agent settings of the
    machine's, no PYTHONPATH (the user's shell has none of this checkout's); then ``extra``."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RAY_", "RTENV_", "PIP_")) and k != "PYTHONPATH"}  # fmt: skip
    return uv_environ(
        cache, base, RAY_TMPDIR=str(ray_tmpdir), RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1", **extra,
    )  # fmt: skip


def processes_naming(path: Path) -> list[int]:
    """Live processes (not zombies) whose command line names ``path`` (a Ray temp dir: its
    GCS, raylet, agents and workers all carry their session's path), but this one."""
    needle = os.fsencode(str(path))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in argv and state not in ("Z", "X"):
            found.append(int(entry))
    return sorted(found)


def kill_all(pids: Sequence[int]) -> None:
    """SIGKILL each of ``pids`` (gone already: fine)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def leftover_processes(path: Path, timeout_s: float) -> list[str]:
    """The processes naming ``path`` still alive ``timeout_s`` after a driver exited (polled:
    Ray's own stop takes a moment), each as ``PID: command``; they are SIGKILLed."""
    deadline = time.monotonic() + timeout_s
    while (pids := processes_naming(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for pid in pids:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            left.append(f"{pid}: {argv.decode(errors='replace')[:200]}")
    kill_all(pids)
    return left


def run_driver(
    project: Project, env: Mapping[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """The user's command in ``project`` (``launch_command``), in a session of its own: on
    ``timeout_s`` its whole process group (uv and the driver) is SIGKILLed, and the run is
    returned with exit code -9 and a line saying so (a cluster's processes are found by its Ray
    temp dir: ``leftover_processes``)."""
    proc = subprocess.Popen(
        launch_command(), cwd=project.path, env=dict(env), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(the driver was killed after {timeout_s:.0f}s)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
