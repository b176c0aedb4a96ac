"""Test parts shared by the tiers: zip builders, a real package server, a real agent and client."""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from agent.app.config import Settings
from agent.install.fetch_base import FetchLimits
from agent.ops.server import Agent
from rtenv.v1 import agent_pb2, agent_pb2_grpc

# -- zips ------------------------------------------------------------------------------------


def make_zip(
    files: Mapping[str, bytes | str],
    *,
    symlinks: Mapping[str, str] | None = None,
    compression: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A zip in memory: ``files`` maps entry names to contents, ``symlinks`` names to targets."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def zip_with_infos(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A zip of (name, unix mode incl. file type, data) entries."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, mode, data in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return buf.getvalue()


def module_zip(module: str, value: str, *, top: str | None = None) -> bytes:
    """A py_modules-style zip holding ``<module>/__init__.py`` that defines VALUE."""
    prefix = f"{top}/" if top else ""
    return make_zip({f"{prefix}{module}/__init__.py": f"VALUE = {value!r}\n"})


def workdir_zip(files: Mapping[str, str], *, top: str | None = "proj") -> bytes:
    prefix = f"{top}/" if top else ""
    return make_zip({f"{prefix}{name}": data for name, data in files.items()})


def env_json(
    working_dir: str | None = None,
    py_modules: list[str] | None = None,
    env_vars: dict[str, str] | None = None,
    **extra: Any,
) -> str:
    env: dict[str, Any] = dict(extra)
    if working_dir is not None:
        env["working_dir"] = working_dir
    if py_modules is not None:
        env["py_modules"] = py_modules
    if env_vars is not None:
        env["env_vars"] = env_vars
    return json.dumps(env)


# -- the package server ----------------------------------------------------------------------


@dataclass
class _Package:
    body: bytes
    statuses: list[int] = field(default_factory=list)  # answered first, one per request
    gate: asyncio.Event | None = None  # when set: hold the body until the event is set
    chunk_delay_s: float = 0.0
    # say Accept-Ranges and answer a Range request 206 with those bytes (else 200, whole)
    ranges: bool = True
    range_body: bytes | None = None  # what ranges are cut from, if not ``body``
    cuts: list[int] = field(default_factory=list)  # whole GETs that end after so many bytes
    last_gate: tuple[int, asyncio.Event] | None = None  # the last N bytes wait for the event


class PackageServer:
    """A real aiohttp server on 127.0.0.1 that serves packages and counts every GET of a whole
    package (``gets``: downloads at the source) and every ranged GET (``ranged``: a part, such
    as the tail an extraction that overlaps its download reads first)."""

    def __init__(self) -> None:
        self._packages: dict[str, _Package] = {}
        self.gets: Counter[str] = Counter()
        self.ranged: Counter[str] = Counter()
        self._requested: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name:.+}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def add(self, name: str, body: bytes, *, statuses: list[int] | None = None) -> str:
        """Serve ``body`` at /name; return its URL."""
        self._packages[name] = _Package(body, list(statuses or []))
        return f"{self.base_url}/{name}"

    def hold(self, name: str) -> asyncio.Event:
        """Hold /name's responses until the returned event is set."""
        gate = asyncio.Event()
        self._packages[name].gate = gate
        return gate

    def slow(self, name: str, chunk_delay_s: float) -> None:
        self._packages[name].chunk_delay_s = chunk_delay_s

    def package(self, name: str) -> _Package:
        """/name's settings, to change how it is served."""
        return self._packages[name]

    def hold_last(self, name: str, size: int) -> asyncio.Event:
        """Send /name's body but its last ``size`` bytes, then hold them until the returned
        event is set (whole GETs only)."""
        gate = asyncio.Event()
        self._packages[name].last_gate = (size, gate)
        return gate

    def requested(self, name: str) -> asyncio.Event:
        """An event set once /name has been requested."""
        return self._requested.setdefault(name, asyncio.Event())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        package = self._packages.get(name)
        span = _range(request.headers.get("Range", ""))
        if package is not None and package.ranges and span is not None:
            self.ranged[name] += 1
            return _part(package.range_body or package.body, span)
        self.gets[name] += 1
        self.requested(name).set()
        if package is None:
            return web.Response(status=404, text="no such package")
        if package.statuses:
            return web.Response(status=package.statuses.pop(0), text="injected failure")
        if package.gate is not None:
            await package.gate.wait()
        cut = package.cuts.pop(0) if package.cuts else None
        ranges = {"Accept-Ranges": "bytes"} if package.ranges else {}
        if not package.chunk_delay_s and cut is None and package.last_gate is None:
            return web.Response(body=package.body, content_type="application/zip", headers=ranges)
        body = package.body
        response = web.StreamResponse(headers={"Content-Length": str(len(body)), **ranges})
        await response.prepare(request)
        held = len(body) - package.last_gate[0] if package.last_gate is not None else len(body)
        for start in range(0, held if cut is None else cut, 64 * 1024):
            end = min(start + 64 * 1024, held if cut is None else cut)
            await response.write(body[start:end])
            await asyncio.sleep(package.chunk_delay_s)
        if cut is not None:  # the connection drops mid-body
            assert request.transport is not None
            request.transport.close()
            return response
        if package.last_gate is not None:
            await package.last_gate[1].wait()
            await response.write(body[held:])
        await response.write_eof()
        return response


def _range(header: str) -> tuple[int, int] | None:
    """``bytes=FIRST-LAST`` as numbers (the only form the agent sends), or None."""
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", header)
    return (int(match[1]), int(match[2])) if match else None


def _part(body: bytes, span: tuple[int, int]) -> web.Response:
    first, last = span[0], min(span[1], len(body) - 1)
    if first > last:
        return web.Response(status=416, headers={"Content-Range": f"bytes */{len(body)}"})
    return web.Response(
        status=206,
        body=body[first : last + 1],
        headers={"Content-Range": f"bytes {first}-{last}/{len(body)}"},
        content_type="application/zip",
    )


@asynccontextmanager
async def package_server() -> AsyncIterator[PackageServer]:
    server = PackageServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# -- the agent -------------------------------------------------------------------------------

FAST_FETCH = FetchLimits(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.05)


def short_tempdir() -> Path:
    """A new directory in the temp dir (under test, the session's private one, whose path is
    kept short enough for a unix socket inside it); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix="rtenv-"))


class AgentCalls:
    """The three RPCs as a test calls them, on ``self.stub``."""

    stub: agent_pb2_grpc.RuntimeEnvAgentStub

    async def create(
        self, serialized: str, *, request_id: str = "", timeout_s: int = 0
    ) -> agent_pb2.CreateRuntimeEnvReply:
        request = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=serialized,
            request_id=request_id,
            config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=timeout_s),
        )
        reply: agent_pb2.CreateRuntimeEnvReply = await self.stub.CreateRuntimeEnv(
            request, timeout=30
        )
        return reply

    async def delete(self, env_id: str, *, request_id: str = "") -> int:
        reply = await self.stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id, request_id=request_id),
            timeout=30,
        )
        remaining: int = reply.remaining_references
        return remaining

    async def info(self) -> agent_pb2.GetRuntimeEnvsInfoReply:
        reply: agent_pb2.GetRuntimeEnvsInfoReply = await self.stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30
        )
        return reply


@dataclass
class RunningAgent(AgentCalls):
    agent: Agent
    stub: agent_pb2_grpc.RuntimeEnvAgentStub
    root: Path

    @property
    def service(self) -> Any:
        assert self.agent.service is not None
        return self.agent.service

    def uri_dirs(self) -> list[str]:
        return sorted(p.name for p in (self.root / "uris").iterdir())

    async def settle(self) -> None:
        """Wait for the store's passes and background deletions; then the disk matches the
        maps."""
        await self.service.store.settle()


@asynccontextmanager
async def running_agent(**overrides: Any) -> AsyncIterator[RunningAgent]:
    """A real agent on a real unix socket, in this process, and a client stub for it."""
    base = short_tempdir()
    root = base / "root"
    settings = replace(Settings(root=root), **{"fetch": FAST_FETCH, **overrides})
    agent = Agent(settings)
    await agent.start()
    channel = grpc.aio.insecure_channel(agent.address)
    try:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        yield RunningAgent(agent, stub, root)
    finally:
        await channel.close()
        await agent.stop(grace=0.5)
        shutil.rmtree(base, ignore_errors=True)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], *, timeout_s: float = 10.0, what: str = ""
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def served(
    stub: agent_pb2_grpc.RuntimeEnvAgentServicer, base: Path
) -> AsyncIterator[grpc.aio.Channel]:
    """A stub agent (a servicer) served on a unix socket in ``base``, and a channel to it;
    both stopped after."""
    server = grpc.aio.server()
    agent_pb2_grpc.add_RuntimeEnvAgentServicer_to_server(stub, server)  # type: ignore[no-untyped-call]
    address = f"unix:{base}/stub.sock"
    server.add_insecure_port(address)
    await server.start()
    channel = grpc.aio.insecure_channel(address)
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(0)


def assert_refused_in_one_line(command: list[str], args: list[str], prefix: str) -> None:
    """Run ``command ARGS`` (each ``FILE`` in them a path to a regular file): it must exit 2
    with one line, ``PREFIX...``, on stderr, nothing on stdout, and leave the file as it was."""
    base = short_tempdir()
    try:
        (base / "FILE").write_text("not a folder")
        argv = [a.replace("FILE", str(base / "FILE")) for a in args]
        proc = subprocess.run(
            [*command, *argv], capture_output=True, text=True, timeout=60,
            cwd=Path(__file__).resolve().parent.parent, check=False,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert re.fullmatch(f"{prefix}.*\n", proc.stderr), proc.stderr
        assert (base / "FILE").read_text() == "not a folder"
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the Ray door ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RayResponse:
    status: int
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


class RayClient:
    """Ray 2.60's runtime env agent protocol over HTTP, as the raylet speaks it: protobuf bodies
    (``rtenv.ray.v1``) POSTed to a Ray door at ``address`` (HOST:PORT)."""

    def __init__(self, session: Any, address: str, *, token: str | None = None) -> None:
        self.session = session  # an aiohttp.ClientSession
        self.base = f"http://{address}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> RayResponse:
        """The response, read; ``headers`` replace the token's."""
        async with self.session.post(
            self.base + path, data=body, headers=self.headers if headers is None else headers
        ) as response:
            data = await response.read()
            return RayResponse(response.status, response.content_type, data)

    async def call(self, path: str, request: Any, reply: Any) -> Any:
        response = await self.post(path, request.SerializeToString())
        assert response.status == 200, (response.status, response.text)
        assert response.content_type == "application/octet-stream"
        reply.ParseFromString(response.body)
        return reply

    async def create(self, serialized: str, *, timeout_s: int = 0, source_process: str = "") -> Any:
        from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2

        request = ray_pb2.GetOrCreateRuntimeEnvRequest(
            serialized_runtime_env=serialized, job_id=b"01000000",  # ASCII hex, as the raylet
            source_process=source_process,
            runtime_env_config=ray_pb2.RuntimeEnvConfig(setup_timeout_seconds=timeout_s),
        )  # fmt: skip
        return await self.call(
            "/get_or_create_runtime_env", request, ray_pb2.GetOrCreateRuntimeEnvReply()
        )

    async def delete(self, serialized: str, *, source_process: str = "") -> Any:
        from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2

        request = ray_pb2.DeleteRuntimeEnvIfPossibleRequest(
            serialized_runtime_env=serialized, source_process=source_process
        )
        return await self.call(
            "/delete_runtime_env_if_possible", request, ray_pb2.DeleteRuntimeEnvIfPossibleReply()
        )

    async def info(self, limit: int | None = None) -> Any:
        from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2

        request = ray_pb2.GetRuntimeEnvsInfoRequest()
        if limit is not None:
            request.limit = limit
        return await self.call("/get_runtime_envs_info", request, ray_pb2.GetRuntimeEnvsInfoReply())


def listed(root: Path, sub: str) -> list[str]:
    """The names under ``root/sub``; for tmp/ and trash/ (one folder per agent serving the
    root, named by its holder id), the names inside those folders."""
    folder = root / sub
    if sub not in ("tmp", "trash"):
        return sorted(p.name for p in folder.iterdir())
    return sorted(p.name for own in folder.iterdir() if own.is_dir() for p in own.iterdir())


def slow_passes(a: RunningAgent, seconds: float = 0.1) -> Callable[..., Awaitable[object]]:
    """A replacement for the agent's index ``sweep`` that waits ``seconds`` first (an index
    busy with other agents); set it with ``monkeypatch.setattr(a.service.store._db, "sweep",
    ...)``."""
    sweep = a.service.store._db.sweep

    async def slow_sweep(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(seconds)
        return await sweep(*args, **kwargs)

    return slow_sweep


async def stray_cancellation(*args: object, **kwargs: object) -> object:
    """A stand-in for a service call that meets a cancellation nobody asked for (a cancelled
    future it awaits): a bug below the doors."""
    cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cancelled.cancel()
    await cancelled
    raise AssertionError("unreachable: awaiting a cancelled future raises")
