"""Real Ray nodes for the drop-in's end-to-end tests: nodes started with the stock ``ray start``
CLI (or ``rtenv-agent ray start``, which makes their raylets launch this agent), drivers as
processes of their own (``tests/harness/ray_driver.py``), and readers of what each node's agent
holds.

The switch: ``RTENV_E2E_AGENT`` is ``ours`` (the default: every node runs this agent) or ``ray``
(Ray's own agent; tests that read what only this agent has are skipped). The same tests run on
both, so a behaviour they pin is Ray's as much as ours.

Every node gets a short temp dir of its own (``/tmp/r-e2e-*``), free ports chosen at run time,
and a loopback node IP of its own: 127.0.0.2 for a head, 127.0.0.3, 127.0.0.4... for worker
nodes (Ray replaces 127.0.0.1 with the machine's address; any other loopback one it keeps).
``ray start`` runs in a new session, so the node's processes (GCS, raylet, the agents) are in one
process group, and its workers (each in a group of its own) are their descendants: stopping a
node is SIGKILL to those, by PID; never ``ray stop``, which kills every Ray process on the
machine, other suites' too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc
import pytest

from agent.ops import loops
from agent.ops.ray_agent import grpc_address
from agent.ops.ray_flags import TOKEN_AUTH_SINCE
from agent.ops.ray_swap import ray_release
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.package_server import PackageServer
from tests.harness.packages import make_zip
from tests.harness.pip_wheels import hermetic_pip_environ

T = TypeVar("T")
Json = dict[str, Any]

# The installed Ray (CI runs these tests on 2.60 and on the oldest supported, agent.launcher.hook's
# SUPPORTED_RAY): before 2.54 the raylet passes no node id and picks the agent's port itself
# (no port file); before 2.52 Ray has no token auth.
RAY_RELEASE = ray_release(importlib.metadata.version("ray")) or (0, 0)
PORT_FILES = RAY_RELEASE >= (2, 54)
needs_token_auth = pytest.mark.skipif(
    RAY_RELEASE < TOKEN_AUTH_SINCE, reason="Ray before 2.52 has no token auth"
)
AGENT = os.environ.get("RTENV_E2E_AGENT", "ours")
OURS = AGENT == "ours"
assert AGENT in ("ours", "ray"), f"RTENV_E2E_AGENT must be 'ours' or 'ray', not {AGENT!r}"
needs_ours = pytest.mark.skipif(not OURS, reason="reads what only this agent has")
# http:// packages: Ray's driver takes them from 2.56 (https only before), and Ray's own agent
# needs smart_open for them; pip: Ray's own agent needs virtualenv (this agent needs neither)
HTTP_OK = RAY_RELEASE >= (2, 56) and (OURS or importlib.util.find_spec("smart_open") is not None)
needs_http = pytest.mark.skipif(
    not HTTP_OK, reason="Ray before 2.56 takes no http:// URIs; Ray's own agent needs smart_open"
)
PIP_OK = OURS or importlib.util.find_spec("virtualenv") is not None

DRIVER = Path(__file__).with_name("ray_driver.py")
HEAD_IP = "127.0.0.2"
START_S = 90.0  # `ray start` to return, and the node's agent to have written its port file
DRIVER_S = 180.0  # a whole driver process
EXIT_S = 30.0  # a process to exit once it should
STOP_S = 20.0  # a node's processes to be gone after SIGKILL


# in the agent's command line: this agent's subcommand, or Ray's agent's process title
AGENT_MARK = " -m agent ray-agent " if OURS else "ray::RuntimeEnvAgent"


def _ray_cli(python: str | None = None) -> list[str]:
    if OURS:
        return [python or sys.executable, "-m", "agent", "ray"]
    return [python or sys.executable, "-m", "ray.scripts.scripts"]


def poll(probe: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 0.1) -> T:
    """Call ``probe`` until it returns something other than None, within a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the kernel says are free now (all bound at once, then let go)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def base_environ(**extra: str) -> dict[str, str]:
    """This process's environment for a node or a driver: no Ray or pip settings of the
    machine's, no usage stats, no agent settings but the session's event loop (RTENV_EVENT_LOOP:
    the raylets' agents run on the loop the rest of the tests run on); then ``extra``."""
    env = {
        k: v
        for k, v in hermetic_pip_environ().items()
        if not k.startswith(("RAY_", "RTENV_")) or k == loops.ENV
    }
    env.update(
        RAY_USAGE_STATS_ENABLED="0",
        # explicit: unset, Ray turns token auth on when ~/.ray/auth_token exists
        RAY_AUTH_MODE="disabled",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# -- processes -------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _live() -> dict[int, list[str]]:
    """Every live process's stat fields."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                found[int(entry)] = fields
    return found


def group_and_descendants(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``, and their descendants (a raylet puts each
    worker in a process group of its own)."""
    live = _live()
    found = {pid for pid, fields in live.items() if int(fields[2]) == pgid}
    for _ in range(len(live)):
        more = {pid for pid, fields in live.items() if int(fields[1]) in found} - found
        if not more:
            break
        found |= more
    return sorted(found)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    return inodes


def wait_listening(port: int, timeout_s: float, what: str) -> None:
    """Until something listens on TCP ``port`` (a node's server that starts after ``ray start``
    returns, such as Ray Client's: on a loaded machine a client may time out before it)."""
    poll(lambda: True if _listening_inodes(port) else None, timeout_s, what)


def listener(port: int, among: list[int]) -> int | None:
    """The process among ``among`` that listens on TCP ``port``."""
    inodes = {f"socket:[{i}]" for i in _listening_inodes(port)}
    for pid in among:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return pid
    return None


# -- nodes -----------------------------------------------------------------------------------


@dataclass
class RayNode:
    """One Ray node (its own raylet and agent) started by ``ray start`` in a session of its own."""

    temp_dir: Path
    head: bool
    ip: str
    gcs_address: str
    ports: dict[str, int]
    env: dict[str, str]
    pgid: int
    node_id: str = ""
    token: str | None = None
    stopped: bool = False
    session: Path | None = None  # Ray before 2.54: the session its raylet named (_logged_node)

    @property
    def session_dir(self) -> Path:
        if self.session is not None:
            return self.session
        return (self.temp_dir / "session_latest").resolve()

    @property
    def root(self) -> Path:
        """This agent's root: $RTENV_ROOT, else <session>/runtime_resources/rtenv."""
        given = self.env.get("RTENV_ROOT")
        return Path(given) if given else self.session_dir / "runtime_resources" / "rtenv"

    @property
    def agent_port(self) -> int:
        return self.ports["runtime-env-agent-port"]

    @property
    def agent_key(self) -> str:
        """The node in the agent's socket name (``RayFlags.node_key``): its id, or where the
        raylet passes none (Ray before 2.54) ``port<agent port>``."""
        return self.node_id if PORT_FILES else f"port{self.agent_port}"

    @property
    def grpc_address(self) -> str:
        """The agent's gRPC socket, by ray-agent's own rule."""
        return grpc_address(self.root, self.temp_dir, self.agent_key)

    def members(self) -> list[int]:
        """The node's live processes: those ``ray start`` started and what they started."""
        return group_and_descendants(self.pgid)

    def raylet_pid(self) -> int | None:
        return listener(self.ports["node-manager-port"], self.members())

    def agent_pid(self) -> int | None:
        return listener(self.agent_port, self.members())

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.session_dir / "logs" / name
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"({path} unreadable)"
        return f"--- {name} ---\n" + "\n".join(text)

    def logs(self) -> str:
        """The tails of the logs that say why a node or its agent failed."""
        names = ["raylet.out", "runtime_env_agent.log", "runtime_env_agent.err"]
        start = (self.temp_dir / "start.log").read_text(errors="replace")[-3000:]
        return "\n".join([f"--- ray start ---\n{start}", *(self.log_tail(n) for n in names)])

    def stop(self) -> None:
        """SIGKILL the node's processes (found first: a worker whose raylet is gone has no tie
        to the node left); wait until they are gone; remove the temp dir."""
        if not self.stopped:
            self.stopped = True
            doomed = self.members()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(AssertionError):
                poll(lambda: None if any(map(alive, doomed)) else True, STOP_S, "the node's end")
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_node(
    *,
    head: RayNode | None = None,
    ip: str = HEAD_IP,
    num_cpus: int = 1,
    env: dict[str, str] | None = None,
    token: str | None = None,
    dashboard: bool = False,
    python: str | None = None,
    cli: list[str] | None = None,
) -> RayNode:
    """Start a head node (``head`` None) or a worker node joining ``head``; return once its
    agent has written its port file. With ``token``, Ray's token auth is on for the node; with
    ``dashboard`` (a head), Ray's dashboard and job server run, on ``ports["dashboard-port"]``
    (they need ``ray[default]``); ``python`` runs ``ray start`` (default: this process's);
    ``cli``, the words before ``start`` (default: ``<python> -m agent ray``, or Ray's own CLI).
    A worker node needs an ``ip`` of its own (127.0.0.3...)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="r-e2e-", dir="/tmp"))
    (temp_dir / "tmp").mkdir()
    names = [
        "node-manager-port", "object-manager-port", "runtime-env-agent-port",
        "dashboard-agent-grpc-port", "dashboard-agent-listen-port", "metrics-export-port",
    ]  # fmt: skip
    if head is None:
        names += ["port", "ray-client-server-port", "dashboard-port"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    extra = dict(env or {})
    extra["TMPDIR"] = str(temp_dir / "tmp")
    assert head is None or ip != head.ip, "a worker node needs a loopback IP of its own"
    if token is not None:
        extra.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    node_env = base_environ(**extra)
    gcs = f"{ip}:{ports['port']}" if head is None else head.gcs_address
    shown = [f"--include-dashboard={str(dashboard).lower()}", f"--dashboard-host={ip}"]
    where = ["--head", *shown] if head is None else [f"--address={gcs}"]
    args = [
        "start", *where, f"--temp-dir={temp_dir}", f"--node-ip-address={ip}",
        f"--num-cpus={num_cpus}", "--disable-usage-stats",
        "--object-store-memory=80000000", "--min-worker-port=0", "--max-worker-port=0",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    command = [*(cli or _ray_cli(python)), *args]
    with (temp_dir / "start.log").open("wb") as log:
        proc = subprocess.Popen(
            command, env=node_env, cwd=temp_dir, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    node = RayNode(temp_dir, head is None, ip, gcs, ports, node_env, proc.pid, token=token)
    try:
        try:
            code = proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"ray start exited with {code}:\n{node.logs()}"
        node.node_id = poll(
            lambda: _port_file_node(node) if PORT_FILES else _logged_node(node),
            START_S, "the agent's port file" if PORT_FILES else "the raylet's node id and agent",
        )  # fmt: skip
        agent = node.agent_pid()
        assert agent is not None, f"nothing listens on the agent's port:\n{node.logs()}"
        # the switch took: the raylet launched the agent the tests mean to run
        assert AGENT_MARK in cmdline(agent), f"the agent is {cmdline(agent)!r}"
    except BaseException:
        node.stop()
        raise
    return node


def _port_file_node(node: RayNode) -> str | None:
    """The node id in the name of ``runtime_env_agent_port_<node id>``, once the file is there
    and names our port."""
    with contextlib.suppress(OSError):
        for path in node.session_dir.glob("runtime_env_agent_port_*"):
            if path.read_text().strip() == str(node.agent_port):
                return path.name.rsplit("_", 1)[1]
    return None


def _logged_node(node: RayNode) -> str | None:
    """Ray before 2.54 (no port file): the node id on its raylet's command line, once the agent
    listens (and, this agent, has logged its event loop: the last line of its start). The
    node's session folder is the one the raylet gave its agent (--log-dir's parent): on these
    Rays a worker node's session is in the head's temp dir, not in its own."""
    agent, raylet = node.agent_pid(), node.raylet_pid()
    if agent is None or raylet is None:
        return None
    log_dir = re.search(r"--log-dir[= ](\S+)", cmdline(agent))
    node_id = re.search(r"--node_id=([0-9a-f]{56})", cmdline(raylet))
    if log_dir is None or node_id is None:
        return None
    node.session = Path(log_dir[1]).parent
    with contextlib.suppress(OSError):
        if (
            not OURS
            or "event loop: " in (node.session / "logs" / "runtime_env_agent.log").read_text()
        ):
            return node_id[1]
    return None


@contextlib.contextmanager
def ray_nodes(count: int, **kwargs: Any) -> Iterator[list[RayNode]]:
    """A head and ``count - 1`` worker nodes, all stopped afterwards, whatever happens."""
    nodes: list[RayNode] = []
    try:
        nodes.append(start_node(**kwargs))
        for i in range(count - 1):
            nodes.append(start_node(head=nodes[0], ip=f"127.0.0.{i + 3}", **kwargs))
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()


# -- drivers ---------------------------------------------------------------------------------


class DriverError(AssertionError):
    pass


class Driver:
    """``tests/harness/ray_driver.py SCENARIO ARGS`` connected to ``node``'s cluster, in a session
    of its own (so a timeout kills it and whatever it started)."""

    def __init__(
        self, node: RayNode, scenario: str, args: Json, *, cwd: Path | None = None
    ) -> None:
        self.node = node
        env = dict(node.env, RAY_ADDRESS=node.gcs_address, RTENV_E2E_NODE_IP=node.ip)
        # the args in a file: a large env var would not fit on a command line
        fd, args_path = tempfile.mkstemp(suffix=".json", dir=node.temp_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(args, f)
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), scenario, args_path], env=env,
            cwd=cwd or node.temp_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._keep, args=(self.proc.stderr,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.deadline = time.monotonic() + DRIVER_S

    @staticmethod
    def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def _keep(self, stream: IO[str]) -> None:
        for line in stream:
            self.err.append(line)
            del self.err[:-200]

    def _fail(self, why: str) -> DriverError:
        self.kill()
        return DriverError(f"driver: {why}\n--- stderr ---\n{''.join(self.err)[-4000:]}")

    def expect(self, prefix: str) -> Json:
        """The next ``PREFIX <json>`` line (other lines skipped), within the driver's deadline."""
        while True:
            left = self.deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise self._fail(f"no {prefix} line within {DRIVER_S}s") from None
            if line is None:
                self.proc.wait(timeout=EXIT_S)
                raise self._fail(f"exited with {self.proc.returncode} before a {prefix} line")
            if line.startswith(prefix + " "):
                value: Json = json.loads(line[len(prefix) + 1 :])
                return value

    def go(self) -> None:
        """Let a driver waiting at a STEP go on."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self) -> Json:
        """The RESULT, once the driver has exited with 0."""
        value = self.expect("RESULT")
        try:
            code = self.proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            raise self._fail(f"still running {EXIT_S}s after its result") from None
        if code != 0:
            raise self._fail(f"exited with {code}")
        return value

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=EXIT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what it left in its session


def drive(node: RayNode, scenario: str, args: Json, *, cwd: Path | None = None) -> Json:
    """Run a driver to its end and return its RESULT."""
    driver = Driver(node, scenario, args, cwd=cwd)
    try:
        return driver.result()
    finally:
        driver.kill()


# -- what an agent holds ---------------------------------------------------------------------


def ray_post(node: RayNode, path: str, body: bytes, *, token: str | None = "") -> tuple[int, bytes]:
    """POST to the node's agent on Ray's port (``token`` "" = the node's own, None = none)."""
    sent = node.token if token == "" else token
    request = urllib.request.Request(
        f"http://{node.ip}:{node.agent_port}{path}", data=body, method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    if sent:
        request.add_header("Authorization", f"Bearer {sent}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def ray_counts(node: RayNode) -> dict[str, int]:
    """Each serialized env the node's agent knows, with its count, asked as the raylet asks
    (``/get_runtime_envs_info`` on Ray's port): what either agent says."""
    status, body = ray_post(
        node, "/get_runtime_envs_info", ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()
    )
    assert status == 200, f"{status}: {body[:300]!r}"
    reply = ray_pb2.GetRuntimeEnvsInfoReply.FromString(body)
    return {state.runtime_env: state.ref_cnt for state in reply.runtime_env_states}


def agent_info(node: RayNode) -> agent_pb2.GetRuntimeEnvsInfoReply:
    """This agent's own info (envs, packages, cache counters) through its gRPC door."""
    address = node.grpc_address  # ray-agent's own rule
    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        reply: agent_pb2.GetRuntimeEnvsInfoReply = stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10
        )
    return reply


def wait_counts_zero(node: RayNode, timeout_s: float = 60.0) -> dict[str, int]:
    """Wait until every env the node's agent knows has count 0 (and, with this agent, every
    env and package in its own info); return the last counts seen."""
    last: dict[str, int] = {}
    held: list[str] = []

    def settled() -> bool | None:
        nonlocal last, held
        last = ray_counts(node)
        if any(last.values()):
            return None
        if OURS:
            info = agent_info(node)
            envs = [f"{e.serialized_runtime_env[:80]}: {e.references}" for e in info.envs]
            uris = [f"{u.uri}: {u.references}" for u in info.uris]
            held = [text for text in envs + uris if not text.endswith(": 0")]
            if held:
                return None
        return True

    try:
        poll(settled, timeout_s, "every count to return to 0", every_s=0.5)
    except AssertionError as exc:
        workers = [cmdline(pid)[:60].strip() for pid in node.members() if pid != node.pgid]
        raise AssertionError(
            f"node {node.ip}: {exc}: Ray's counts {last}, this agent's {held}; the node's "
            f"processes: {workers}\n{node.log_tail('raylet.out', 40)}"
        ) from None
    return last


def new_token() -> str:
    return secrets.token_hex(16)


def modules_zip(modules: dict[str, str]) -> bytes:
    """A py_modules zip: each module a folder with an ``__init__.py`` defining VALUE, beside a
    top-level file (Ray drops a lone top-level folder of a remote py_modules zip; this agent
    keeps it: with two top-level entries both keep the layout)."""
    files = {f"{name}/__init__.py": f"VALUE = {value!r}\n" for name, value in modules.items()}
    return make_zip({**files, "PKG-INFO": "py_modules for the Ray tests\n"})


# -- the package server, on a thread of its own ----------------------------------------------


@dataclass
class ThreadedPackageServer:
    """tests.helpers.PackageServer (real aiohttp on 127.0.0.1) on an event loop of its own, so
    synchronous tests can serve packages while they wait on processes."""

    server: PackageServer = field(default_factory=PackageServer)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def add(self, name: str, body: bytes) -> str:
        return self.server.add(name, body)

    def gets(self, name: str) -> int:
        return self.server.gets[name]


@contextlib.contextmanager
def package_server() -> Iterator[ThreadedPackageServer]:
    served = ThreadedPackageServer()
    served.start()
    try:
        yield served
    finally:
        served.stop()
