"""Ray's runtime env agent protocol as a benchmark transport: POST protobuf bodies (the
``rtenv.ray.v1`` messages, wire-compatible with Ray 2.60's) to ``/get_or_create_runtime_env``,
``/delete_runtime_env_if_possible`` and ``/get_runtime_envs_info``, over keep-alive
connections, as the raylet's client does. The same target measures this agent's Ray door and
Ray's own agent.

The client is a minimal HTTP/1.1 one (``_Connections``: asyncio streams, a request written in
one piece, a reply read by its Content-Length), not aiohttp's: the raylet's client is C++
(Boost.Beast), and aiohttp's client spent more CPU per request than this agent's Ray door
serving it, so on two cores the benchmark's client, not the agent, set the pairs/s. A reply
that is not ``HTTP/1.x 200`` with a Content-Length is a ``CallFailed``.

Requests are the raylet's: ``source_process="raylet"``, a job id, the default
``setup_timeout_seconds`` (600). A reference is given back by the serialized env itself (Ray's
protocol counts per string as sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from benchlib.rpc import CallFailed
from rtenv.ray.v1 import runtime_env_agent_pb2 as pb

_OK = pb.AGENT_RPC_STATUS_OK
_JOB_ID = b"01000000"  # what a first job's id looks like in hex
_SETUP_TIMEOUT_S = 600  # RuntimeEnvConfig's default in Ray
_MAX_TEXT = 300
_M = TypeVar("_M", bound=Message)


def _parse(message: _M, data: bytes, path: str) -> _M:
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise CallFailed(f"/{path}: the reply is not a {type(message).__name__}") from exc
    return message


_HEAD_LIMIT = 64 * 1024  # a reply's status line and headers: more is not a reply of these


class _Connections:
    """Up to ``limit`` keep-alive HTTP/1.1 connections to ``host:port``, each used by one
    request at a time; a connection that fails or is cut is dropped, not reused."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self._host, self._port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._free = asyncio.Semaphore(limit)
        self._open: set[asyncio.StreamWriter] = set()

    async def post(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        """Send one request (``head`` ends with the blank line); its status and body."""
        async with self._free:
            if self._idle:
                reader, writer = self._idle.pop()
            else:
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, limit=_HEAD_LIMIT
                )
                self._open.add(writer)
            try:
                writer.write(head + body)
                status, data = await _read_reply(reader)
            except BaseException:
                self._open.discard(writer)
                writer.close()
                raise
            self._idle.append((reader, writer))
            return status, data

    async def close(self) -> None:
        for writer in self._open:
            writer.close()
        for writer in self._open:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._open.clear()
        self._idle.clear()


async def _read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise CallFailed(f"not an HTTP/1.x reply: {lines[0][:_MAX_TEXT]!r}")
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        elif name.strip().lower() == b"transfer-encoding":
            raise CallFailed(f"a reply with Transfer-Encoding {value.strip()[:40]!r}: not read")
    if length is None:
        raise CallFailed("a reply without a Content-Length")
    return int(parts[1]), await reader.readexactly(length)


class RayHttpTarget:
    """Ray's protocol at ``http://HOST:PORT``, over up to ``connections`` keep-alive
    connections. Use ``async with``."""

    def __init__(self, address: str, *, connections: int = 100, token: str | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.base_url = f"http://{address}"
        self._host, self._port = host.strip("[]"), int(port)
        self._connections = connections
        auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        self._head = (
            f"Host: {address}\r\nContent-Type: application/octet-stream\r\n{auth}"
        ).encode()
        self._pool: _Connections | None = None

    async def __aenter__(self) -> RayHttpTarget:
        self._pool = _Connections(self._host, self._port, self._connections)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _post(self, path: str, body: bytes, timeout_s: float) -> bytes:
        assert self._pool is not None, "use RayHttpTarget in `async with`"
        head = b"POST /%s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % (
            path.encode(), self._head, len(body),
        )  # fmt: skip
        try:
            async with asyncio.timeout(timeout_s):
                status, data = await self._pool.post(head, body)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as exc:  # fmt: skip
            raise CallFailed(f"/{path}: {type(exc).__name__}: {exc}"[:_MAX_TEXT]) from exc
        if status != 200:
            text = data[:_MAX_TEXT].decode(errors="replace")
            raise CallFailed(f"HTTP {status} from /{path}: {text}")
        return data

    async def create_reply(self, env: str, timeout_s: float) -> pb.GetOrCreateRuntimeEnvReply:
        """GetOrCreateRuntimeEnv as the raylet sends it; the reply, whatever its status."""
        request = pb.GetOrCreateRuntimeEnvRequest(
            serialized_runtime_env=env,
            runtime_env_config=pb.RuntimeEnvConfig(setup_timeout_seconds=_SETUP_TIMEOUT_S),
            job_id=_JOB_ID,
            source_process="raylet",
        )
        path = "get_or_create_runtime_env"
        data = await self._post(path, request.SerializeToString(), timeout_s)
        return _parse(pb.GetOrCreateRuntimeEnvReply(), data, path)

    async def create(self, env: str, timeout_s: float) -> str:
        reply = await self.create_reply(env, timeout_s)
        if reply.status != _OK:
            raise CallFailed(f"create FAILED: {reply.error_message[:_MAX_TEXT]}")
        return env

    async def delete(self, handle: str, timeout_s: float) -> None:
        request = pb.DeleteRuntimeEnvIfPossibleRequest(
            serialized_runtime_env=handle, source_process="raylet"
        )
        path = "delete_runtime_env_if_possible"
        data = await self._post(path, request.SerializeToString(), timeout_s)
        reply = _parse(pb.DeleteRuntimeEnvIfPossibleReply(), data, path)
        if reply.status != _OK:
            raise CallFailed(f"delete FAILED: {reply.error_message[:_MAX_TEXT]}")

    async def info(self, timeout_s: float, limit: int | None = 1) -> pb.GetRuntimeEnvsInfoReply:
        request = pb.GetRuntimeEnvsInfoRequest()
        if limit is not None:
            request.limit = limit
        path = "get_runtime_envs_info"
        data = await self._post(path, request.SerializeToString(), timeout_s)
        return _parse(pb.GetRuntimeEnvsInfoReply(), data, path)


async def wait_serving(address: str, timeout_s: float, *, token: str | None = None) -> None:
    """Poll GetRuntimeEnvsInfo at ``address`` until it answers (bounded): an agent may write
    its port file before it serves."""
    deadline = time.monotonic() + timeout_s
    last = ""
    async with RayHttpTarget(address, connections=1, token=token) as target:
        for _ in range(int(timeout_s / 0.05) + 1):  # bounded in count and time
            if time.monotonic() >= deadline:
                break
            try:
                await target.info(2)
                return
            except CallFailed as exc:
                last = str(exc)
            await asyncio.sleep(0.05)
    raise CallFailed(f"{address} did not serve Ray's protocol within {timeout_s:g} s: {last}")
