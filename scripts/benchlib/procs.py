"""The processes the benchmark starts, and what /proc says about them.

Every child is started here, remembered by its pid, and stopped by that pid (SIGTERM, a bounded
wait, SIGKILL). CPU seconds and memory are read from /proc for the server's own pid, so the
client's cost on the same cores is left out of a server's figures.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import importlib.util
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchlib.ray_http import wait_serving

# gRPC waits a second before its first reconnect by default: that, not the server, would be timed
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 100),
]

SCRIPTS = Path(__file__).resolve().parents[1]  # so children can run ``-m benchlib.x``
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_MAX_UNIX_PATH = 100  # AF_UNIX allows 107 bytes; keep a margin

# Runs the agent's own CLI on uvloop's event loop: the agent is not changed, only its loop.
_UVLOOP_LAUNCH = (
    "import sys, uvloop; uvloop.install(); from agent.launcher.main import main; "
    "sys.exit(main(sys.argv[1:]))"
)


class BenchError(Exception):
    """A workload cannot go on (a child died, a baseline failed); the run reports it and goes
    on with the next workload."""


def free_port() -> int:
    """A port free on 127.0.0.1 now (bound to port 0 and read back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def ray_door_missing() -> str:
    """Why this checkout's agent has no Ray door to measure ("" if it has one)."""
    if importlib.util.find_spec("agent.doors.ray_http") is None:
        return "this agent has no Ray door in this checkout (agent.doors.ray_http)"
    return ""


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


# -- /proc -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a whole process (all its threads) and of its children, live
    or ended (the agent's unpack workers, pip): its own from /proc/PID/stat, its waited-for
    children's from the same line (cutime, cstime), and each live descendant's in turn."""
    total = 0.0
    for one in (pid, *_descendants(pid)):
        try:
            with open(f"/proc/{one}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile: its parent's cutime has it once it is waited for
        # utime, stime, cutime, cstime (fields 14-17 of proc(5))
        total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / _CLK_TCK
    return total


def _descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, theirs, ...), from /proc's parent ids."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 10_000:  # bounded: a process tree, not a loop
        children = parents.get(todo.pop(), [])
        found.extend(children)
        todo.extend(children)
    return found


def status_bytes(pid: int, key: str) -> int:
    """A ``kB`` line of /proc/PID/status (VmRSS, VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak_rss(pid: int) -> None:
    """Reset VmHWM to the current RSS (Linux clear_refs 5), so a phase's peak is its own."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not permitted: the peak is then since the process started


@dataclass
class Usage:
    cpu_s: float
    peak_rss_bytes: int


class ProcWatch:
    """CPU seconds and peak RSS of one process over a phase: ``start()``, then ``stop()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._cpu0 = 0.0

    def start(self) -> None:
        reset_peak_rss(self.pid)
        self._cpu0 = cpu_seconds(self.pid)

    def stop(self) -> Usage:
        return Usage(cpu_seconds(self.pid) - self._cpu0, status_bytes(self.pid, "VmHWM"))


# -- the machine -------------------------------------------------------------------------------


def probe_file_creation(directory: Path, files: int = 400) -> float:
    """Files created (written, closed) per second in a new folder of ``directory``. Blocking:
    run it in a thread. The folder stays until the end of the run (no deletions mid-run)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = Path(tempfile.mkdtemp(prefix="probe-", dir=directory))
    payload = b"x" * 512
    started = time.perf_counter()
    for i in range(files):
        with open(probe / f"f{i}", "wb") as f:
            f.write(payload)
    return files / (time.perf_counter() - started)


def read_through(path: Path) -> int:
    """Read a file to its end so it is in the page cache before it is timed. Blocking."""
    total = 0
    with open(path, "rb") as f:
        while chunk := f.read(4 * 1024 * 1024):
            total += len(chunk)
    return total


def read_all(paths: Iterable[Path]) -> None:
    """``read_through`` each file. Blocking."""
    for path in paths:
        read_through(path)


_short_dir: Path | None = None  # made on first need, removed when the benchmark exits


def short_address(path: Path) -> str:
    """``unix:PATH``, or, when PATH is too long for AF_UNIX, a short path in a private (0700)
    folder of the temp dir: the agent refuses a socket folder others may write to, as /tmp."""
    if len(os.fsencode(str(path))) <= _MAX_UNIX_PATH:
        return f"unix:{path}"
    global _short_dir
    if _short_dir is None:
        _short_dir = Path(tempfile.mkdtemp(prefix="rtb-"))
        atexit.register(shutil.rmtree, _short_dir, True)
    digest = hashlib.sha256(os.fsencode(str(path))).hexdigest()[:16]
    return f"unix:{_short_dir / digest}.sock"


# -- child processes -----------------------------------------------------------------------------


class Child:
    """A child process, stopped by its pid: SIGTERM, a bounded wait, then SIGKILL."""

    def __init__(self, argv: list[str], log_path: Path, *, stdout_pipe: bool = False) -> None:
        self.argv = argv
        self.log_path = log_path
        self._stdout_pipe = stdout_pipe
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def spawn(self) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(_pythonpath())}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if self._stdout_pipe else asyncio.subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        finally:
            os.close(log)
        return self.proc

    def log_tail(self, size: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-size:].decode(errors="replace")

    async def stop(self, grace_s: float = 20.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _pythonpath() -> list[str]:
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [str(SCRIPTS), *rest]


async def wait_healthy(address: str, child: Child, timeout_s: float) -> None:
    """Poll the standard health service until SERVING (bounded); fail with the child's log."""
    assert child.proc is not None
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address, options=FAST_RECONNECT) as channel:
        health = cast(Any, health_pb2_grpc.HealthStub(channel))
        while time.monotonic() < deadline:
            if child.proc.returncode is not None:
                raise BenchError(
                    f"{child.argv[:4]} exited with {child.proc.returncode}:\n{child.log_tail()}"
                )
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.005)
    raise BenchError(f"{child.argv[:4]} did not serve within {timeout_s}s:\n{child.log_tail()}")


class AgentProcess(Child):
    """``python -m agent serve`` on a root, on its unix socket; optionally on uvloop's loop
    (a launcher installs uvloop's policy, then runs the agent's own CLI unchanged), and
    optionally with its Ray door (Ray's HTTP protocol) on a free port of 127.0.0.1
    (``ray_address``)."""

    def __init__(
        self, root: Path, *extra: str, uvloop: bool = False, ray_door: bool = False
    ) -> None:
        self.root = root
        self.address = short_address(root / "agent.sock")
        self.ray_address = ""
        if ray_door:
            self.ray_address = f"127.0.0.1:{free_port()}"
            extra = ("--ray-address", self.ray_address, *extra)
        launch = ["-c", _UVLOOP_LAUNCH] if uvloop else ["-m", "agent"]
        argv = [
            sys.executable, *launch, "serve", "--root", str(root), "--address", self.address,
            "--log-level", "WARNING", *extra,
        ]  # fmt: skip
        super().__init__(argv, root.parent / f"{root.name}.log")
        self.ready_s = 0.0

    async def __aenter__(self) -> AgentProcess:
        started = time.monotonic()
        await self.spawn()
        try:
            await wait_healthy(self.address, self, 120.0)
            if self.ray_address:
                await wait_serving(self.ray_address, 60.0)
        except BaseException:
            await self.stop()
            raise
        self.ready_s = time.monotonic() - started
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def watch(self) -> ProcWatch:
        return ProcWatch(self.pid)


class EchoProcess(Child):
    """The bare gRPC server of the hot baseline (``benchlib.echo_server``), served by
    ``route`` (``echo_server.ROUTES``)."""

    def __init__(
        self, workdir: Path, name: str, replies: Path, *, uvloop: bool = False,
        route: str = "servicer",
    ) -> None:  # fmt: skip
        self.address = short_address(workdir / f"{name}.sock")
        argv = [
            sys.executable, "-m", "benchlib.echo_server", "--address", self.address,
            "--replies", str(replies), "--route", route, *(["--uvloop"] if uvloop else []),
        ]  # fmt: skip
        super().__init__(argv, workdir / f"{name}.log")

    async def __aenter__(self) -> EchoProcess:
        await self.spawn()
        try:
            await wait_healthy(self.address, self, 60.0)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def watch(self) -> ProcWatch:
        return ProcWatch(self.pid)


class PackageServer(Child):
    """``benchlib.pkg_server``: serves a folder over http on 127.0.0.1 and counts GETs;
    ``rate``: at most that many bytes per second, all connections together."""

    def __init__(self, directory: Path, log_path: Path, *, rate: float | None = None) -> None:
        argv = [sys.executable, "-m", "benchlib.pkg_server", "--dir", str(directory)]
        if rate is not None:
            argv += ["--rate", str(rate)]
        super().__init__(argv, log_path, stdout_pipe=True)
        self.base_url = ""

    async def __aenter__(self) -> PackageServer:
        proc = await self.spawn()
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
        except BaseException:
            await self.stop()
            raise
        if not line.startswith(b"http://127.0.0.1:"):
            await self.stop()
            raise BenchError(f"the package server did not start:\n{self.log_tail()}")
        self.base_url = line.decode().strip()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def gets(self) -> dict[str, int]:
        """GETs per file name so far, as the server counted them."""
        import aiohttp

        async with (
            aiohttp.ClientSession(trust_env=False) as session,
            session.get(f"{self.base_url}/_stats", timeout=aiohttp.ClientTimeout(total=10)) as r,
        ):
            counts: dict[str, int] = await r.json()
        return counts

    async def total_gets(self) -> int:
        return sum((await self.gets()).values())
