"""s3://, gs://, azure:// and abfss:// packages installed through a real agent's gRPC door from
real stores on 127.0.0.1 (``tests/object_stores.py``: moto's S3 server, a GCS emulator,
azurite), with the credentials each cloud's tools take from the environment and files."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.install.fetch.object_source import INSTALL_HINT
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import NO_PROXY, STOP_S, serving
from tests.harness.in_process import FAST_FETCH, running_agent
from tests.harness.object_stores import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    AzureServer,
    CutProxy,
    GcsServer,
    S3Server,
    azurite,
    free_port,
    gcs_emulator,
    moto_s3,
)
from tests.harness.packages import env_json, make_zip
from tests.harness.rpc import rpc_refused

# the clouds' variables, and the proxies obstore's client would send loopback requests to
_CLOUD_VARS = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_", "STORAGE_EMULATOR_HOST", "HTTP_PROXY",
               "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")  # fmt: skip
SetEnv = Callable[[dict[str, str]], None]
BULK = random.Random(18).randbytes(64 * 1024)  # incompressible: a body the proxy can cut


@dataclass
class Store:
    """One store under test: how a URI names an object in it, and the agent's environment
    with good or bad credentials, direct or through a proxy on ``port``."""

    name: str
    server: S3Server | GcsServer | AzureServer
    port: int

    def uri(self, key: str, *, abfss: bool = False) -> str:
        if self.name == "s3":
            return f"s3://pkgs/{key}"
        if self.name == "gs":
            return f"gs://pkgs/{key}"
        if abfss:
            return f"abfss://pkgs@{AZURITE_ACCOUNT}.dfs.core.windows.net/{key}"
        return f"azure://pkgs@{AZURITE_ACCOUNT}.blob.core.windows.net/{key}"

    def put(self, key: str, body: bytes) -> None:
        self.server.put(key, body)

    def environment(
        self, home: Path, *, good: bool = True, port: int | None = None
    ) -> dict[str, str]:
        at = f"127.0.0.1:{port or self.port}"
        if isinstance(self.server, S3Server):
            # the keys from a profile in ~/.aws (an AWS_PROFILE of the AWS files), the endpoint
            # from AWS_ENDPOINT_URL_S3, which wins over AWS_ENDPOINT_URL as in boto3
            secret = self.server.secret if good else "not-the-secret"
            (home / ".aws").mkdir(exist_ok=True)
            (home / ".aws" / "credentials").write_text(
                f"[pkgs]\naws_access_key_id = {self.server.key_id}\n"
                f"aws_secret_access_key = {secret}\n"
            )
            (home / ".aws" / "config").write_text("[profile pkgs]\nregion = us-east-1\n")
            return {"HOME": str(home), "AWS_PROFILE": "pkgs",
                    "AWS_ENDPOINT_URL_S3": f"http://{at}",
                    "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # fmt: skip
        if isinstance(self.server, GcsServer):
            token = self.server.token if good else "expired-token"
            return {"STORAGE_EMULATOR_HOST": at, "GOOGLE_BEARER_TOKEN": token}
        env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://{at}"}
        if not good:  # a key of the right form that is not the account's
            env["AZURE_STORAGE_ACCOUNT_KEY"] = "d3Jvbmcta2V5" * 8
        return env


@pytest.fixture(scope="module", params=["s3", "gs", "azure"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    name: str = request.param
    if name == "s3":
        with moto_s3() as s3:
            yield Store(name, s3, int(s3.endpoint.rsplit(":", 1)[1]))
    elif name == "gs":
        with gcs_emulator() as gcs:
            yield Store(name, gcs, int(gcs.host.rsplit(":", 1)[1]))
    else:
        with azurite(tmp_path_factory.mktemp("azurite")) as az:
            yield Store(name, az, int(az.url.rsplit(":", 1)[1]))


@pytest.fixture
def cloud_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SetEnv:
    """The agent's environment, without any cloud variable of the machine's; ``set(env)``."""
    for var in list(os.environ):
        if var.startswith(_CLOUD_VARS):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path))

    def put(env: dict[str, str]) -> None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)

    return put


def _wd_zip(tag: str) -> bytes:
    return make_zip({"proj/main.py": f"print({tag!r})\n", "proj/bulk.bin": BULK})


async def _refused(serialized: str, code: grpc.StatusCode, **overrides: Any) -> str:
    """Create on a new agent, expecting a refusal with ``code``: its details."""
    async with running_agent(**overrides) as a:
        return await rpc_refused(a.create(serialized), code)


async def test_a_working_dir_and_py_modules_from_the_store_arrive_in_the_env(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    store.put("jobs/wd.zip", _wd_zip("hello"))
    store.put("mods/mod.zip", make_zip({"objmod/__init__.py": "VALUE = 'from the store'\n"}))
    cloud_env(store.environment(tmp_path))
    mod = store.uri("mods/mod.zip", abfss=True)  # azure: the abfss spelling of the same store
    async with running_agent() as a:
        reply = await a.create(env_json(store.uri("jobs/wd.zip"), [mod]))
        cwd = Path(reply.context.cwd)
        assert (cwd / "main.py").read_text() == "print('hello')\n"  # the top folder stripped
        assert (cwd / "bulk.bin").read_bytes() == BULK
        paths = reply.context.env_vars["PYTHONPATH"].split(os.pathsep)
        assert (Path(paths[1]) / "objmod" / "__init__.py").is_file()


async def test_a_wrong_sha256_fragment_is_failed_precondition_naming_both_digests(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    store.put("jobs/pinned.zip", _wd_zip("pinned"))
    cloud_env(store.environment(tmp_path))
    wrong = "0" * 64
    details = await _refused(
        env_json(store.uri(f"jobs/pinned.zip#sha256={wrong}")), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "jobs/pinned.zip" in details
    assert f"the URI expects {wrong}" in details


async def test_a_missing_object_is_not_found_naming_the_key_and_bucket(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    cloud_env(store.environment(tmp_path))
    details = await _refused(
        env_json(store.uri("jobs/never-uploaded.zip")), grpc.StatusCode.NOT_FOUND
    )
    assert "has no object 'jobs/never-uploaded.zip'" in details
    assert "'pkgs'" in details


async def test_credentials_the_store_refuses_are_permission_denied_saying_where_they_come_from(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    store.put("jobs/guarded.zip", _wd_zip("guarded"))
    cloud_env(store.environment(tmp_path, good=False))
    details = await _refused(
        env_json(store.uri("jobs/guarded.zip")), grpc.StatusCode.PERMISSION_DENIED
    )
    assert "refused the agent's credentials" in details
    assert "jobs/guarded.zip" in details
    assert "agent's environment" in details


async def test_connections_the_store_drops_are_retried_and_the_package_arrives(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    """The first connection is closed unanswered, the second cut inside the body; the third
    attempt (FAST_FETCH's last) brings the package."""
    store.put("jobs/flaky.zip", _wd_zip("flaky"))
    proxy = CutProxy(store.port, cuts=[0, 2000])
    await proxy.start()
    try:
        cloud_env(store.environment(tmp_path, port=proxy.port))
        async with running_agent() as a:
            reply = await a.create(env_json(store.uri("jobs/flaky.zip")))
            assert (Path(reply.context.cwd) / "bulk.bin").read_bytes() == BULK
        assert proxy.connections >= 3
    finally:
        await proxy.stop()


async def test_an_object_over_the_size_limit_is_refused_by_the_bytes_read(
    store: Store, cloud_env: SetEnv, tmp_path: Path
) -> None:
    store.put("jobs/big.zip", _wd_zip("big"))
    cloud_env(store.environment(tmp_path))
    limit = 4096
    details = await _refused(
        env_json(store.uri("jobs/big.zip")),
        grpc.StatusCode.FAILED_PRECONDITION,
        fetch=replace(FAST_FETCH, max_download_bytes=limit),
    )
    assert f"the limit is {limit} (max_download_bytes)" in details


@pytest.mark.parametrize("store", ["azure"], indirect=True)
async def test_azure_in_rays_short_form_with_the_account_and_key_of_a_connection_string(
    store: Store, cloud_env: SetEnv
) -> None:
    """``azure://container/blob``, as Ray's runtime env reads it: the account from Ray's
    AZURE_STORAGE_ACCOUNT, the key and endpoint from AZURE_STORAGE_CONNECTION_STRING (azurite's
    own, as its documentation gives it), no emulator switch."""
    assert isinstance(store.server, AzureServer)
    store.put("jobs/short.zip", _wd_zip("short"))
    cloud_env({
        "AZURE_STORAGE_ACCOUNT": AZURITE_ACCOUNT,
        "AZURE_STORAGE_CONNECTION_STRING": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={store.server.url}/{AZURITE_ACCOUNT};"
        ),
    })  # fmt: skip
    async with running_agent() as a:
        reply = await a.create(env_json("azure://pkgs/jobs/short.zip"))
        assert (Path(reply.context.cwd) / "main.py").read_text() == "print('short')\n"


async def test_no_s3_credentials_anywhere_is_failed_precondition_saying_what_to_set(
    cloud_env: SetEnv,
) -> None:
    """No keys in the environment nor in ~/.aws, and an instance metadata service that does
    not answer (AWS_METADATA_ENDPOINT: a closed port on 127.0.0.1, so nothing leaves this
    machine): refused at once, not retried as a store that is down."""
    closed = f"http://127.0.0.1:{free_port()}"
    cloud_env({"AWS_METADATA_ENDPOINT": closed, "AWS_ENDPOINT_URL": closed})
    details = await _refused(env_json("s3://pkgs/jobs/wd.zip"), grpc.StatusCode.FAILED_PRECONDITION)
    assert "s3://pkgs/jobs/wd.zip: no S3 credentials" in details
    assert "AWS_ACCESS_KEY_ID" in details
    assert "AWS_SKIP_SIGNATURE=true" in details


async def test_an_aws_profile_no_file_holds_is_failed_precondition_naming_the_package(
    cloud_env: SetEnv, tmp_path: Path
) -> None:
    cloud_env({"AWS_PROFILE": "nope"})
    details = await _refused(env_json("s3://pkgs/jobs/wd.zip"), grpc.StatusCode.FAILED_PRECONDITION)
    assert details.startswith("working_dir:s3://pkgs/jobs/wd.zip: AWS_PROFILE names the profile")
    assert f"{tmp_path}/.aws/credentials" in details


async def test_without_obstore_an_object_uri_is_failed_precondition_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore: ImportError
    details = await _refused(env_json("s3://pkgs/jobs/wd.zip"), grpc.StatusCode.FAILED_PRECONDITION)
    assert "s3://pkgs/jobs/wd.zip" in details
    assert INSTALL_HINT in details


async def test_an_agent_process_reads_the_package_with_its_environment_and_exits_cleanly(
    store: Store, cloud_env: SetEnv, tmp_path: Path, base: Path
) -> None:
    """``python -m agent serve`` as a child, the store's settings in its environment only:
    the package arrives, and SIGTERM ends it with 0 (obstore's runtime lets it exit)."""
    store.put("jobs/proc.zip", _wd_zip("proc"))
    cloud_env(store.environment(tmp_path))
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        channel = grpc.aio.insecure_channel(agent.address, options=NO_PROXY)
        try:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            request = agent_pb2.CreateRuntimeEnvRequest(
                serialized_runtime_env=env_json(store.uri("jobs/proc.zip"))
            )
            reply = await stub.CreateRuntimeEnv(request, timeout=30)
            assert (Path(reply.context.cwd) / "main.py").read_text() == "print('proc')\n"
        finally:
            await channel.close()
        agent.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
        assert code == 0, agent.log_text()
