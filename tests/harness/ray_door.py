"""A client of the Ray door: Ray's runtime env agent protocol over HTTP, as the raylet speaks it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from agent.app.config import RaySettings
from tests.harness.in_process import RunningAgent, running_agent


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


@asynccontextmanager
async def ray_agent(**ray: object) -> AsyncIterator[tuple[RunningAgent, RayClient]]:
    """A running agent (in-process) with both doors, and a Ray client for its Ray door;
    ``ray``: its ``RaySettings`` (a ``token`` is the client's too)."""
    async with (
        running_agent(ray=RaySettings(**ray)) as ra,  # type: ignore[arg-type]
        aiohttp.ClientSession() as session,
    ):
        token = ray.get("token")
        yield ra, RayClient(session, ra.agent.ray_address, token=token)  # type: ignore[arg-type]
