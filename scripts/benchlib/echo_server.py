"""The hot workload's baseline: a bare grpc.aio server of the agent's service on a unix socket.

It answers each call with a canned reply that the real agent gave to the same request in the
same run (same message sizes, same serialization work), and does nothing else. The benchmark
starts it as a child: ``python -m benchlib.echo_server --address unix:P --replies FILE``.
``--uvloop`` runs it on uvloop's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from rtenv.v1 import agent_pb2, agent_pb2_grpc


class Echo(agent_pb2_grpc.RuntimeEnvAgentServicer):
    def __init__(self, replies: dict[str, str]) -> None:
        self._create = agent_pb2.CreateRuntimeEnvReply.FromString(bytes.fromhex(replies["create"]))
        self._delete = agent_pb2.DeleteRuntimeEnvReply.FromString(bytes.fromhex(replies["delete"]))
        self._info = agent_pb2.GetRuntimeEnvsInfoReply.FromString(bytes.fromhex(replies["info"]))

    async def CreateRuntimeEnv(
        self,
        request: agent_pb2.CreateRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.CreateRuntimeEnvReply:
        return self._create

    async def DeleteRuntimeEnv(
        self,
        request: agent_pb2.DeleteRuntimeEnvRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.DeleteRuntimeEnvReply:
        return self._delete

    async def GetRuntimeEnvsInfo(
        self,
        request: agent_pb2.GetRuntimeEnvsInfoRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.GetRuntimeEnvsInfoReply:
        return self._info


async def serve(address: str, replies: dict[str, str]) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    agent_pb2_grpc.add_RuntimeEnvAgentServicer_to_server(  # type: ignore[no-untyped-call]
        Echo(replies), server
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(address)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--replies", required=True, help="JSON: create, delete, info as hex")
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    with open(args.replies) as f:
        replies = json.load(f)
    if args.uvloop:  # an optional package: imported by name
        importlib.import_module("uvloop").install()
    asyncio.run(serve(args.address, replies))


if __name__ == "__main__":
    main()
