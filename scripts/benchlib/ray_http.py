"""Ray's runtime env agent protocol as a benchmark transport: POST protobuf bodies (the
``rtenv.ray.v1`` messages, wire-compatible with Ray 2.60's) to ``/get_or_create_runtime_env``,
``/delete_runtime_env_if_possible`` and ``/get_runtime_envs_info``, over one aiohttp session
that keeps its connections alive, as the raylet's client does. The same target measures this
agent's Ray door and Ray's own agent.

Requests are the raylet's: ``source_process="raylet"``, a job id, the default
``setup_timeout_seconds`` (600). A reference is given back by the serialized env itself (Ray's
protocol counts per string as sent).
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import TypeVar

import aiohttp
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


class RayHttpTarget:
    """Ray's protocol at ``http://HOST:PORT``, over one keep-alive session with up to
    ``connections`` connections. Use ``async with``."""

    def __init__(self, address: str, *, connections: int = 100, token: str | None = None) -> None:
        self.base_url = f"http://{address}"
        self._connections = connections
        self._headers = {"Content-Type": "application/octet-stream"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RayHttpTarget:
        connector = aiohttp.TCPConnector(limit=self._connections, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, path: str, body: bytes, timeout_s: float) -> bytes:
        assert self._session is not None, "use RayHttpTarget in `async with`"
        try:
            async with self._session.post(
                f"{self.base_url}/{path}",
                data=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                data = await response.read()
                if response.status != 200:
                    text = data[:_MAX_TEXT].decode(errors="replace")
                    raise CallFailed(f"HTTP {response.status} from /{path}: {text}")
                return data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CallFailed(f"/{path}: {type(exc).__name__}: {exc}"[:_MAX_TEXT]) from exc

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
