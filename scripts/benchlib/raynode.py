"""A real Ray head node for the peer run, on loopback, with its own temp dir and free ports.

``ray start --head`` (or this agent's launcher, ``python -m agent ray start --head``, whose
raylet runs this agent instead of Ray's) is run to completion; then the runtime env agent's
HTTP port is read from the file Ray's agent writes in the session dir
(``runtime_env_agent_port_<node id>``, Ray's ``persist_port``), and its pid is found among the
raylet's children. The node is stopped by pid: every process whose command line names the
node's temp dir, and the raylet's children (agents and workers retitle themselves ``ray::...``);
SIGTERM, a bounded wait, SIGKILL. Never ``ray stop``: it stops every Ray node on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchlib.procs import BenchError, free_port
from benchlib.ray_http import wait_serving
from benchlib.rpc import CallFailed

_PORT_FILE = "runtime_env_agent_port_"
# what a runtime env agent's command line holds: Ray's own (before and after it retitles
# itself) and this agent's (``ray-agent``, the subcommand the launcher puts in Ray's place)
_AGENT_MARKS = ("runtime_env/agent/main.py", "ray::RuntimeEnvAgent", "ray-agent")
# Token auth off, whatever ~/.ray holds (Ray turns it on when a token file exists): its cost is
# not what is measured, and both agents are run alike
NODE_IP = "127.0.0.2"  # a loopback address Ray keeps (it rewrites 127.0.0.1)
NODE_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
RAY_CLI = "import sys; from ray.scripts.scripts import main; sys.exit(main())"
OURS_CLI = "import sys; from agent.launcher.main import main; sys.exit(main(sys.argv[1:]))"


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _names(line: str, folder: str) -> bool:
    """Whether a command line names ``folder`` (itself or a path inside it)."""
    return any(line.endswith(folder) or f"{folder}{end}" in line for end in ("/", " "))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class RayNode:
    """A Ray head node: ``ray start --head`` with its own temp dir under /tmp (short: Ray's
    unix sockets live in it) and free ports. ``ours``: started by this agent's launcher, so its
    raylet runs this agent. Use ``async with``; ``env`` is added to the node's environment."""

    def __init__(
        self,
        log_dir: Path,
        name: str,
        *,
        ours: bool = False,
        num_cpus: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.ours = ours
        self.num_cpus = num_cpus
        self.log_path = log_dir / f"ray-{name}.log"
        self.env = env or {}
        self.temp_dir = Path(tempfile.mkdtemp(prefix="r-bench-", dir="/tmp"))
        self.gcs_address = ""
        self.agent_address = ""  # HOST:PORT of the runtime env agent's HTTP door
        self.agent_pid = 0
        self.raylet_pid = 0
        # Ray rewrites 127.0.0.1 to the machine's own address, but keeps any other loopback
        # address: 127.0.0.2 keeps every byte of the run on loopback.
        self.node_ip = NODE_IP
        self.start_s = 0.0

    def _argv(self) -> list[str]:
        port = free_port()
        self.gcs_address = f"{NODE_IP}:{port}"
        cli = OURS_CLI if self.ours else RAY_CLI
        head = [sys.executable, "-c", cli] + (["ray"] if self.ours else [])
        return [
            *head, "start", "--head", "--temp-dir", str(self.temp_dir), "--port", str(port),
            "--node-ip-address", NODE_IP, "--include-dashboard=false",
            "--num-cpus", str(self.num_cpus), "--disable-usage-stats",
            "--object-store-memory", str(100 * 2**20),
            "--ray-client-server-port", str(free_port()),
            "--dashboard-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
        ]  # fmt: skip

    async def __aenter__(self) -> RayNode:
        started = time.monotonic()
        env = {**os.environ, **NODE_ENV, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    env=env,
                )  # fmt: skip
            finally:
                os.close(log)
            try:
                code = await asyncio.wait_for(proc.wait(), 180)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise BenchError(f"ray start ({self.name}) did not finish in 180 s") from None
            if code != 0:
                raise BenchError(f"ray start ({self.name}) exited with {code}:\n{self._tail()}")
            await self._find_agent(time.monotonic() + 60)
        except BaseException:
            await self.stop()
            raise
        self.start_s = time.monotonic() - started
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _tail(self, size: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def _session(self) -> Path:
        return (self.temp_dir / "session_latest").resolve()

    async def _find_agent(self, deadline: float) -> None:
        """Wait (bounded) for the agent's port file and its process among the raylet's
        children."""
        port = ""
        for _ in range(int(max(deadline - time.monotonic(), 0) / 0.1) + 1):
            if time.monotonic() >= deadline:
                break
            session = self._session()
            port_files = sorted(session.glob(f"{_PORT_FILE}*")) if session.is_dir() else []
            if port_files and not port:
                text = port_files[0].read_text().strip()
                port = text if text.isdigit() else ""
            if port and not self.agent_pid:
                self.agent_pid = await asyncio.to_thread(self._agent_pid)
            if self.agent_pid and not self.agent_address:
                # Ray replaces 127.0.0.1 with the machine's own address: the raylet says which
                self.agent_address = f"{self.node_ip}:{port}"
            if self.agent_pid:
                try:
                    await wait_serving(self.agent_address, max(deadline - time.monotonic(), 1))
                except CallFailed as exc:
                    raise BenchError(f"Ray node {self.name}: {exc}") from exc
                return
            await asyncio.sleep(0.1)
        raise BenchError(
            f"Ray node {self.name}: no runtime env agent (port {self.agent_address or '?'}, "
            f"pid {self.agent_pid or '?'}) within 60 s; see {self.temp_dir}"
        )

    def _agent_pid(self) -> int:
        mark = str(self.temp_dir)
        for pid in _pids():
            line = _cmdline(pid)
            if "raylet/raylet" in line.split(" ", 1)[0] and _names(line, mark):
                self.raylet_pid = pid
                found = re.search(r"--node_ip_address=(\S+)", line)
                self.node_ip = found.group(1) if found else NODE_IP
                break
        if not self.raylet_pid:
            return 0
        for pid in _pids():
            if _ppid(pid) == self.raylet_pid and any(m in _cmdline(pid) for m in _AGENT_MARKS):
                return pid
        return 0

    def _node_pids(self) -> set[int]:
        """Every process of this node: its command line names the temp dir, or its parent is
        one of them (the raylet's agents and workers)."""
        mark = str(self.temp_dir)
        pids = _pids()
        ours = {pid for pid in pids if _names(_cmdline(pid), mark)}
        if self.raylet_pid:
            ours.add(self.raylet_pid)
        for _ in range(3):  # children and grandchildren (a worker's own children)
            ours |= {pid for pid in pids if _ppid(pid) in ours}
        ours.discard(os.getpid())
        return ours

    async def stop(self, grace_s: float = 15.0) -> None:
        pids = await asyncio.to_thread(self._node_pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        # not our children (``ray start`` detaches them): poll /proc, bounded
        for _ in range(int(grace_s / 0.2) + 1):
            if time.monotonic() >= deadline or not any(_alive(p) for p in pids):
                break
            await asyncio.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
