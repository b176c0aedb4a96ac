"""gcs:// packages fetched from a GCS: a real grpc.aio server on 127.0.0.1 serves
``/ray.rpc.InternalKVGcsService/InternalKVGet`` (a generic handler, this project's messages) and
records what each call carried; a real agent in this process installs from it over its gRPC door.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import pytest

from agent.app.config import RaySettings, Settings
from agent.core.errors import ConfigError, PackageNotFound
from agent.install.fetch.gcs import GcsFetcher
from agent.install.fetch.gcs_source import GcsConfig, GcsKvClient, GcsUnavailable
from agent.ops.server import Agent, AgentState
from rtenv.ray.v1 import gcs_kv_pb2
from tests.harness.in_process import FAST_FETCH, running_agent
from tests.harness.packages import env_json, make_zip, module_zip
from tests.harness.polling import wait_until
from tests.harness.rpc import rpc_refused

CLUSTER = "5c1e7d4a" * 7  # 56 hex digits, as Ray's --cluster-id-hex
WD = "gcs://_ray_pkg_0ff939fec1755cf2.zip"
MOD = "gcs://_ray_pkg_1a2b3c4d5e6f7081.zip"


@dataclass(frozen=True)
class Call:
    key: bytes
    namespace: bytes
    metadata: dict[str, str]
    peer: str


@dataclass
class KvGcs:
    """A GCS's InternalKVGet, answering as a Ray 2.60 GCS was seen to: ``values`` by key, a
    missing key as GcsStatus 17 with no value; a call naming another cluster than ``cluster_id``
    (compared as sent) refused UNAUTHENTICATED "WrongClusterID", one naming none served.
    ``fail_next`` statuses are answered first."""

    cluster_id: str = CLUSTER
    values: dict[bytes, bytes] = field(default_factory=dict)
    fail_next: list[grpc.StatusCode] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    address: str = ""
    delay_s: float = 0.0  # before each answer: a large package, slow to arrive

    def gets(self, uri: str) -> int:
        return sum(1 for c in self.calls if c.key == uri.encode())

    async def _get(
        self,
        request: gcs_kv_pb2.InternalKVGetRequest,
        context: grpc.aio.ServicerContext[
            gcs_kv_pb2.InternalKVGetRequest, gcs_kv_pb2.InternalKVGetReply
        ],
    ) -> gcs_kv_pb2.InternalKVGetReply:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        self.calls.append(Call(request.key, request.namespace, metadata, context.peer()))
        if self.fail_next:
            await context.abort(self.fail_next.pop(0), "injected")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        sent = metadata.get("ray_cluster_id")
        if sent is not None and sent != self.cluster_id:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "WrongClusterID")
        value = self.values.get(request.key)
        if value is None:
            return gcs_kv_pb2.InternalKVGetReply(
                status=gcs_kv_pb2.GcsStatus(code=17, message="Failed to find the key")
            )
        return gcs_kv_pb2.InternalKVGetReply(status=gcs_kv_pb2.GcsStatus(code=0), value=value)


@asynccontextmanager
async def kv_gcs(port: int = 0, **kwargs: object) -> AsyncIterator[KvGcs]:
    gcs = KvGcs(**kwargs)  # type: ignore[arg-type]
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    handler = grpc.method_handlers_generic_handler(
        "ray.rpc.InternalKVGcsService",
        {
            "InternalKVGet": grpc.unary_unary_rpc_method_handler(
                gcs._get,
                request_deserializer=gcs_kv_pb2.InternalKVGetRequest.FromString,
                response_serializer=gcs_kv_pb2.InternalKVGetReply.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    gcs.address = f"127.0.0.1:{port}"
    try:
        yield gcs
    finally:
        await server.stop(None)


def ray_settings(
    gcs: KvGcs | str, *, cluster: str = CLUSTER, token: str | None = None
) -> RaySettings:
    address = gcs if isinstance(gcs, str) else gcs.address
    return RaySettings(gcs_address=address, cluster_id_hex=cluster, token=token)


def closed_port() -> int:
    """A port nothing listens on (bound, read back, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- installs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "s3cret-token"])
async def test_gcs_packages_install_once_for_two_envs_with_ray_s_metadata(
    token: str | None,
) -> None:
    """A working dir and a py_modules folder as Ray uploads them: each fetched once for two
    envs, with key = the URI, the empty namespace, ray_cluster_id, and the bearer token when one
    is set; the working dir's single top folder is kept (Ray does not strip GCS packages)."""
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs, token=token)) as a:
        gcs.values[WD.encode()] = make_zip({"src/main.py": "print('hi')\n"})
        gcs.values[MOD.encode()] = module_zip("mymod", "one")
        first = await a.create(env_json(WD, [MOD]))
        second = await a.create(env_json(WD, [MOD], {"A": "1"}))
        assert first.runtime_env_id != second.runtime_env_id
        for reply in (first, second):
            ctx = reply.context
            assert os.path.isfile(os.path.join(ctx.cwd, "src", "main.py"))
            modules = ctx.env_vars["PYTHONPATH"].split(os.pathsep)[1]
            assert os.path.isfile(os.path.join(modules, "mymod", "__init__.py"))
        assert (gcs.gets(WD), gcs.gets(MOD)) == (1, 1)
        assert {(c.namespace, c.metadata.get("ray_cluster_id")) for c in gcs.calls} == {
            (b"", CLUSTER)
        }
        expected = None if token is None else f"Bearer {token}"
        assert {c.metadata.get("authorization") for c in gcs.calls} == {expected}
        info = await a.info()
        assert {u.uri: u.references for u in info.uris} == {WD: 2, MOD: 2}


async def test_a_gcs_package_is_evicted_and_fetched_again_like_any_other() -> None:
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs), cache_budget_bytes=0) as a:
        gcs.values[WD.encode()] = make_zip({"main.py": "x = 1\n"})
        reply = await a.create(env_json(WD))
        assert await a.delete(reply.runtime_env_id) == 0
        await a.settle()
        assert a.uri_dirs() == []
        await a.create(env_json(WD))
        assert gcs.gets(WD) == 2


async def test_one_channel_per_gcs_is_reused_and_closed_at_stop() -> None:
    async with kv_gcs() as gcs:
        async with running_agent(ray=ray_settings(gcs)) as a:
            gcs.values[WD.encode()] = make_zip({"main.py": "x = 1\n"})
            gcs.values[MOD.encode()] = module_zip("mymod", "one")
            await a.create(env_json(WD))
            await a.create(env_json(py_modules=[MOD]))
            assert len({c.peer for c in gcs.calls}) == 1, gcs.calls  # one connection
            fetcher = a.agent._fetcher
            assert fetcher is not None
            part = fetcher._fetchers["gcs"]
            assert isinstance(part, GcsFetcher)
            client = part.client
            assert client is not None
            assert client._channel is not None
            assert client._reconnect_ms == (10, 50)  # FAST_FETCH's backoff: 0.01 s to 0.05 s
        assert client._channel is None


# -- refusals ----------------------------------------------------------------------------------


async def test_a_missing_package_is_not_found_naming_it_and_the_expired_upload() -> None:
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs)) as a:
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.NOT_FOUND)
        assert WD in details
        assert gcs.address in details
        assert "upload may have expired" in details
        assert gcs.gets(WD) == 1  # not retried


async def test_rays_fail_download_switch_fails_a_package_the_gcs_holds_in_rays_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING, Ray's fault switch, makes a gcs:// download
    fail as Ray's agent makes it fail: "Failed to download ... the default is 600"."""
    monkeypatch.setenv("RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING", "1")
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs)) as a:
        gcs.values[WD.encode()] = make_zip({"a.txt": b"a"})
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.NOT_FOUND)
        assert "Failed to download" in details
        assert "the default is 600" in details
        assert "RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING is set" in details
        assert gcs.gets(WD) == 0  # nothing read
        monkeypatch.delenv("RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING")
        reply = await a.create(env_json(WD))  # the same package, the switch off
        assert reply.context.cwd


async def test_an_empty_value_is_a_missing_package() -> None:
    async with kv_gcs() as gcs:
        gcs.values[WD.encode()] = b""
        client = GcsKvClient(GcsConfig(gcs.address, CLUSTER), max_value_bytes=100, timeout_s=10)
        try:
            with pytest.raises(PackageNotFound, match="upload may have expired"):
                await client.get(WD, WD)
        finally:
            await client.close()


async def test_a_transient_gcs_failure_is_retried() -> None:
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs)) as a:
        gcs.values[WD.encode()] = make_zip({"main.py": "x = 1\n"})
        gcs.fail_next = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL]
        await a.create(env_json(WD))
        assert gcs.gets(WD) == 3


async def test_a_package_slower_than_the_http_timeouts_is_not_cut_by_a_deadline() -> None:
    """One reply is the whole package: the setup timeout bounds it, not connect + read."""
    fetch = replace(FAST_FETCH, connect_timeout_s=0.1, read_timeout_s=0.1)
    async with kv_gcs(delay_s=0.6) as gcs, running_agent(ray=ray_settings(gcs), fetch=fetch) as a:
        gcs.values[WD.encode()] = make_zip({"main.py": "x = 1\n"})
        await a.create(env_json(WD))
        assert gcs.gets(WD) == 1


async def test_a_call_past_its_own_deadline_says_so_not_that_the_gcs_is_down() -> None:
    async with kv_gcs(delay_s=2.0) as gcs:
        gcs.values[WD.encode()] = b"PK"
        client = GcsKvClient(GcsConfig(gcs.address), max_value_bytes=100, timeout_s=0.1)
        try:
            with pytest.raises(
                GcsUnavailable, match=r"within the call's deadline of 0\.1s"
            ) as info:
                await client.get(WD, WD)
            assert info.value.deadline_s == 0.1
        finally:
            await client.close()


async def test_an_unreachable_gcs_is_unavailable_naming_its_address() -> None:
    address = f"127.0.0.1:{closed_port()}"
    async with running_agent(ray=ray_settings(address)) as a:
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.UNAVAILABLE)
        assert f"the GCS at {address} is unavailable" in details
        assert f"after {FAST_FETCH.attempts} attempts" in details


async def test_a_gcs_that_comes_back_is_reached_at_the_fetcher_s_pace() -> None:
    """The channel reconnects as often as the fetcher retries (here every 50-100 ms), not after
    gRPC's default backoff (1 s and more, during which every call fails at once)."""
    port = closed_port()
    config = GcsConfig(f"127.0.0.1:{port}")
    client = GcsKvClient(config, max_value_bytes=1000, timeout_s=5, reconnect_s=(0.05, 0.1))
    try:
        with pytest.raises(GcsUnavailable):
            await client.get(WD, WD)
        async with kv_gcs(port=port) as gcs:
            gcs.values[WD.encode()] = b"PK"

            async def reached() -> bool:
                try:
                    return await client.get(WD, WD) == b"PK"
                except GcsUnavailable:
                    return False

            await wait_until(reached, timeout_s=0.6, what="the GCS, back on its port")
    finally:
        await client.close()


@pytest.mark.parametrize(
    "size",
    [
        150_000,  # within the room gRPC leaves for the reply: refused once received
        1_000_000,  # past it: refused by gRPC's receive limit, before it is held
    ],
)
async def test_a_package_over_the_size_limit_is_refused_naming_the_limit(size: int) -> None:
    fetch = replace(FAST_FETCH, max_download_bytes=100_000)
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs), fetch=fetch) as a:
        gcs.values[WD.encode()] = os.urandom(size)
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.FAILED_PRECONDITION)
        assert "the limit is 100000 (max_download_bytes)" in details
        assert gcs.gets(WD) == 1  # not retried
        assert a.uri_dirs() == []


async def test_a_package_of_exactly_the_limit_is_received_past_grpc_s_default() -> None:
    """gRPC's receive limit is set from the download limit (here past gRPC's default 4 MiB),
    with room for the reply around the value."""
    limit = 6 * 1024 * 1024
    async with kv_gcs() as gcs:
        gcs.values[WD.encode()] = os.urandom(limit)
        client = GcsKvClient(GcsConfig(gcs.address), max_value_bytes=limit, timeout_s=10)
        try:
            assert len(await client.get(WD, WD)) == limit
        finally:
            await client.close()


@pytest.mark.parametrize(
    "status", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED]
)
async def test_a_gcs_that_refuses_the_agent_is_denied_without_retries(
    status: grpc.StatusCode,
) -> None:
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs)) as a:
        gcs.fail_next = [status]
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.PERMISSION_DENIED)
        assert f"the GCS at {gcs.address} refused the agent ({status.name}" in details
        assert "cluster id" in details
        assert gcs.gets(WD) == 1


async def test_another_cluster_s_id_is_denied() -> None:
    async with kv_gcs() as gcs, running_agent(ray=ray_settings(gcs, cluster="ab" * 28)) as a:
        gcs.values[WD.encode()] = make_zip({"main.py": "x = 1\n"})
        details = await rpc_refused(a.create(env_json(WD)), grpc.StatusCode.PERMISSION_DENIED)
        assert "WrongClusterID" in details


async def test_gcs_without_a_ray_node_is_refused_before_anything_is_fetched() -> None:
    async with running_agent() as a:
        details = await rpc_refused(
            a.create(env_json(WD, [MOD])), grpc.StatusCode.FAILED_PRECONDITION
        )
        assert details.startswith(f"working_dir:{WD}: a gcs:// package is read from a Ray node")
        assert "`rtenv-agent ray-agent`" in details
        assert a.service.store.stats().downloads == 0
        assert (await a.info()).total_envs == 0


async def test_an_agent_given_a_gcs_address_that_is_not_host_port_refuses_to_start(
    base: Path,
) -> None:
    settings = Settings(root=base / "root", ray=RaySettings(gcs_address="gcs-host"))
    agent = Agent(settings)
    with pytest.raises(ConfigError, match="the GCS address 'gcs-host' must be HOST:PORT"):
        await agent.start()
    assert agent.state is AgentState.STOPPED
