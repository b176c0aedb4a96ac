"""An agent process that may crash at a named point (``rtenv-agent serve``, or ``rtenv-agent
ray-agent`` as a raylet starts it, with Ray's flags for a node's session: ``RayNode``), the
packages it installs, and readers of what it left on disk and in its index."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent.crash import ENV_VAR
from agent.state.holders import is_alive, lock_files
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import REPO, START_S, STOP_S, stop, wait_health_serving
from tests.harness.in_process import listed
from tests.harness.package_server import PackageServer
from tests.harness.packages import env_json, make_zip
from tests.harness.polling import wait_until

PREFIX = "rtenv-agent serving on "
NODE = "62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777"  # a node id as Ray writes it


X_ZIP = make_zip({"proj/x.txt": "x" * 10_000})  # working_dir: unpacked without "proj/"


Y_ZIP = make_zip({"ymod/__init__.py": "VALUE = 'y'\n", "ymod/blob.txt": "y" * 10_000})


ZIPS = {"x.zip": X_ZIP, "y.zip": Y_ZIP}


FILES = {"x.zip": "x.txt", "y.zip": "ymod/__init__.py"}  # a file each package's dir must hold


def env_of(server: PackageServer, name: str) -> str:
    """Env A uses X as its working_dir; env B uses Y as a py_module."""
    url = f"{server.base_url}/{name}"
    return env_json(working_dir=url) if name == "x.zip" else env_json(py_modules=[url])


@dataclass(frozen=True)
class RayNode:
    """A node's session, as a raylet names it to the ``ray-agent`` it starts (Ray 2.60's flags,
    its log to stderr); no GCS listens at its address (no ``gcs://`` package is read)."""

    session: Path
    node_id: str = NODE

    @property
    def runtime_resources(self) -> Path:
        """The node's Ray folders' folder (``--runtime-env-dir``)."""
        return self.session / "runtime_resources"

    def flags(self) -> list[str]:
        values = {
            "node-id": self.node_id,
            "node-ip-address": "127.0.0.1",
            "runtime-env-agent-port": "0",
            "session-dir": str(self.session),
            "gcs-address": "127.0.0.1:1",
            "cluster-id-hex": "e5e266bae6d3c574950cad939fdb5dac2d17973d87b1580bf10452b7",
            "runtime-env-dir": str(self.runtime_resources),
            "logging-rotate-bytes": "536870912",
            "logging-rotate-backup-count": "5",
            "log-dir": str(self.session / "logs"),
            "logging-filename": "",
            "temp-dir": str(self.session.parent),
        }
        return [f"--{name}={value}" for name, value in values.items()]


@dataclass
class AgentProc:
    proc: asyncio.subprocess.Process
    address: str  # "" if it exited before serving
    log: Path
    stub: agent_pb2_grpc.RuntimeEnvAgentStub | None = None
    keeper: bool = False  # ``ray-agent``: the process is the agent's keeper (``ops.keeper``)

    @property
    def killed(self) -> int:
        """The process's exit code once the agent died of SIGKILL (a keeper exits 128 + 9)."""
        return 128 + signal.SIGKILL if self.keeper else -signal.SIGKILL

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self) -> agent_pb2_grpc.RuntimeEnvAgentStub:
        assert self.stub is not None, f"the agent did not serve; log:\n{self.log_text()}"
        return self.stub

    async def create(self, serialized: str) -> agent_pb2.CreateRuntimeEnvReply:
        request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=serialized)
        reply: agent_pb2.CreateRuntimeEnvReply = await self.client().CreateRuntimeEnv(
            request, timeout=30
        )
        return reply

    async def delete(self, env_id: str) -> int:
        request = agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id)
        reply = await self.client().DeleteRuntimeEnv(request, timeout=30)
        remaining: int = reply.remaining_references
        return remaining

    async def info(self) -> agent_pb2.GetRuntimeEnvsInfoReply:
        request = agent_pb2.GetRuntimeEnvsInfoRequest()
        reply: agent_pb2.GetRuntimeEnvsInfoReply = await self.client().GetRuntimeEnvsInfo(
            request, timeout=30
        )
        return reply

    async def died(self) -> int:
        """Wait, bounded, for the process to exit; return its exit code."""
        return await asyncio.wait_for(self.proc.wait(), STOP_S)

    async def sigterm(self) -> None:
        self.proc.terminate()
        assert await self.died() == 0, self.log_text()


@asynccontextmanager
async def agent_process(
    root: Path,
    log: Path,
    *args: str,
    crash_at: str = "",
    ray: RayNode | None = None,
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[AgentProc]:
    """``python -m agent serve --root ROOT ARGS``, or with ``ray`` ``python -m agent ray-agent
    <its flags> ARGS`` on ``RTENV_ROOT=ROOT``; ``environ`` added to this process's environment;
    yielded once it serves or has exited."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(environ or {})
    if crash_at:
        env[ENV_VAR] = crash_at
    if ray is None:
        argv = ["serve", "--root", str(root), *args]
    else:
        ray.session.mkdir(parents=True, exist_ok=True)
        env["RTENV_ROOT"] = str(root)
        argv = ["ray-agent", *ray.flags(), *args]
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", *argv,
            stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO, env=env,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), START_S)).decode().strip()
        address = line.removeprefix(PREFIX) if line.startswith(PREFIX) else ""
        agent = AgentProc(proc, address, log, keeper=ray is not None)
        if not agent.address:
            yield agent
            return
        async with grpc.aio.insecure_channel(
            agent.address, options=[("grpc.enable_http_proxy", 0)]
        ) as channel:
            agent.stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            yield agent
    finally:
        await stop(proc)


@dataclass(frozen=True)
class Index:
    uris: dict[str, tuple[str, str, int]]  # dir -> (kind, uri, last_used_ms), ready packages
    live_envs: int  # the envs live at the agents' last writes, summed over the holders
    claims: int  # packages being installed (claimed by a holder)


def read_index(root: Path) -> Index:
    """Read ``state.db`` through a read-only connection of this process."""
    conn = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT dir, kind, uri, last_used_ms FROM uris WHERE state = 'ready'"
        ).fetchall()
        [(live,)] = conn.execute("SELECT coalesce(sum(live_envs), 0) FROM holders").fetchall()
        [(claims,)] = conn.execute(
            "SELECT count(*) FROM uris WHERE state = 'installing'"
        ).fetchall()
    finally:
        conn.close()
    return Index({d: (k, u, n) for d, k, u, n in rows}, live, claims)


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def leftovers(root: Path) -> list[str]:
    """What is under tmp/ and trash/ besides the live agents' own empty folders there, and the
    lock files of holders that are gone."""
    return [
        *listed(root, "tmp"),
        *listed(root, "trash"),
        *(
            f"{sub}/{name}"
            for sub in ("tmp", "trash")
            for name in listing(root / sub)
            if not is_alive(root, name)
        ),
        *(f"holders/{name}" for name in lock_files(root) if not is_alive(root, name)),
    ]


async def check_recovered(
    agent: AgentProc, root: Path, pkgs: PackageServer, kept: frozenset[str]
) -> agent_pb2.RecoverySummary:
    """Index and disk agree, no env is live, leftovers go; return the recovery summary."""
    assert agent.address, agent.log_text()
    await wait_health_serving(agent.address)
    index = read_index(root)
    assert set(index.uris) == set(listing(root / "uris")), "rows and directories differ"
    urls = {f"{pkgs.base_url}/{name}": name for name in ZIPS}
    assert {urls[u] for _, u, _ in index.uris.values()} == kept
    assert index.live_envs == 0, "envs of the dead agent's clients survived"
    assert index.claims == 0, "the dead agent's install claim survived"

    info = await agent.info()
    assert {urls[u.uri] for u in info.uris} == kept
    assert all(u.references == 0 and u.state == "unused" for u in info.uris), info.uris
    assert info.total_envs == 0
    assert info.recovery.rows_kept == len(kept), info.recovery
    await wait_until(lambda: not leftovers(root), timeout_s=10, what="tmp/, trash/ emptied")
    return info.recovery


async def create_each(
    agent: AgentProc, root: Path, pkgs: PackageServer, names: set[str], refetched: set[str]
) -> None:
    """Create an env of each package: a download only for REFETCHED; its row is committed and
    its directory holds its files when the create returns."""
    before = dict(pkgs.gets)
    for name in sorted(names):
        await agent.create(env_of(pkgs, name))
        fetched = 1 if name in refetched else 0
        assert pkgs.gets[name] == before.get(name, 0) + fetched, (name, pkgs.gets)
        url = f"{pkgs.base_url}/{name}"
        row = [d for d, (_, u, _) in read_index(root).uris.items() if u == url]
        assert len(row) == 1, f"{name}'s row not committed when its create returned"
        assert (root / "uris" / row[0] / FILES[name]).is_file()
    assert sorted(read_index(root).uris) == listing(root / "uris")
