"""The hot workload's baseline: a bare gRPC server of the agent's service on a unix socket.

It answers each call with a canned reply that the real agent gave to the same request in the
same run (same message sizes), and does nothing else. The benchmark starts it as a child:
``python -m benchlib.echo_server --address unix:P --replies FILE``. ``--uvloop`` runs it on
uvloop's event loop.

``--route`` picks how Python gRPC serves it (the ``grpc-routes`` workload compares them):

- ``servicer`` (the default, the hot baseline): grpc.aio with the generated servicer; grpc
  parses each request into its message and serialises each reply message.
- ``generic``: grpc.aio with a generic handler and no (de)serializers: the handler gets the
  request's bytes, parses them itself (as a server that reads the request must) and answers
  bytes prepared once.
- ``registered``: the same handlers (bytes in, prepared bytes out), registered by method as the
  generated code registers the servicer's (``add_registered_method_handlers``: grpc finds the
  handler in C, not through the generic handler's Python lookup on every call).
- ``sync``: the synchronous ``grpc.server`` with the generated servicer in a thread pool.
- ``sync-loop``: the same, each call handed to an asyncio event loop in a thread of its own and
  waited for: what the agent would pay on that route, its state living on its event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from rtenv.v1 import agent_pb2, agent_pb2_grpc

ROUTES = ("servicer", "generic", "registered", "sync", "sync-loop")
SERVICE = "rtenv.v1.RuntimeEnvAgent"
SYNC_THREADS = 16


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


class _SyncEcho(agent_pb2_grpc.RuntimeEnvAgentServicer):
    """The same answers, from the synchronous server's threads; with ``loop``, each answer is
    given by a coroutine run on that event loop (another thread) and waited for."""

    def __init__(self, replies: dict[str, str], loop: asyncio.AbstractEventLoop | None) -> None:
        self._echo = Echo(replies)
        self._loop = loop

    def _on_loop(self, reply: Any) -> Any:
        if self._loop is None:
            return reply

        async def give() -> Any:
            return reply

        return asyncio.run_coroutine_threadsafe(give(), self._loop).result()

    def CreateRuntimeEnv(self, request: Any, context: Any) -> Any:
        return self._on_loop(self._echo._create)

    def DeleteRuntimeEnv(self, request: Any, context: Any) -> Any:
        return self._on_loop(self._echo._delete)

    def GetRuntimeEnvsInfo(self, request: Any, context: Any) -> Any:
        return self._on_loop(self._echo._info)


def _raw_handlers(replies: dict[str, str]) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Raw bytes in, prepared bytes out: each handler parses its request (the work a server
    that reads it cannot skip) and answers the canned reply's bytes."""
    answers = {name: bytes.fromhex(replies[key]) for name, key in
               (("CreateRuntimeEnv", "create"), ("DeleteRuntimeEnv", "delete"),
                ("GetRuntimeEnvsInfo", "info"))}  # fmt: skip
    parsers = {
        "CreateRuntimeEnv": agent_pb2.CreateRuntimeEnvRequest.FromString,
        "DeleteRuntimeEnv": agent_pb2.DeleteRuntimeEnvRequest.FromString,
        "GetRuntimeEnvsInfo": agent_pb2.GetRuntimeEnvsInfoRequest.FromString,
    }

    def handler(name: str) -> grpc.RpcMethodHandler[Any, Any]:
        answer, parse = answers[name], parsers[name]

        async def unary(request: bytes, context: Any) -> bytes:
            parse(request)
            return answer

        return grpc.unary_unary_rpc_method_handler(unary)

    return {n: handler(n) for n in answers}


async def serve(address: str, replies: dict[str, str], route: str) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    if route == "generic":
        handlers = _raw_handlers(replies)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    elif route == "registered":
        server.add_registered_method_handlers(SERVICE, _raw_handlers(replies))
    else:
        agent_pb2_grpc.add_RuntimeEnvAgentServicer_to_server(  # type: ignore[no-untyped-call]
            Echo(replies), server
        )
    checks = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(address)
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def serve_sync(address: str, replies: dict[str, str], route: str) -> None:
    loop: asyncio.AbstractEventLoop | None = None
    if route == "sync-loop":
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    with ThreadPoolExecutor(SYNC_THREADS) as pool:
        server = grpc.server(pool, options=[("grpc.so_reuseport", 0)])
        agent_pb2_grpc.add_RuntimeEnvAgentServicer_to_server(  # type: ignore[no-untyped-call]
            _SyncEcho(replies, loop), server
        )
        checks = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        server.add_insecure_port(address)
        server.start()
        checks.set("", health_pb2.HealthCheckResponse.SERVING)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
        server.stop(1).wait(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True)
    parser.add_argument("--replies", required=True, help="JSON: create, delete, info as hex")
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--route", choices=ROUTES, default="servicer")
    args = parser.parse_args()
    with open(args.replies) as f:
        replies = json.load(f)
    if args.route.startswith("sync"):
        serve_sync(args.address, replies, args.route)
        return
    if args.uvloop:  # an optional package: imported by name
        importlib.import_module("uvloop").install()
    asyncio.run(serve(args.address, replies, args.route))


if __name__ == "__main__":
    main()
