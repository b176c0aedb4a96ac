"""Real object stores on 127.0.0.1 for the object-store tests, each a process started here and
stopped by its PID: moto's S3 server (with IAM auth on, so a wrong key is refused as S3 refuses
it), gcp-storage-emulator (``tests/harness/gcs_emulator.py``), and azurite (from npm, installed
once into a cache folder when node is there). ``CutProxy`` sits in front of one and drops the first
connections, as a store whose connection breaks."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

import pytest

AZURITE_VERSION = "3.37.0"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Azure's documentation)
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_READY_S = 20.0
_AZURITE_CACHE = (
    Path(os.environ.get("RTENV_TEST_CACHE") or Path.home() / ".cache" / "rtenv-tests")
    / f"azurite-{AZURITE_VERSION}"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before it served")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on 127.0.0.1:{port} within {_READY_S}s")


@contextmanager
def _process(command: list[str], port: int, what: str, **kwargs: object) -> Iterator[None]:
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip
    try:
        _wait_for_port(port, proc, what)
        yield
    finally:
        proc.kill()  # by its PID (Popen's own)
        proc.wait(10)


# -- S3: moto ---------------------------------------------------------------------------------


@dataclass
class S3Server:
    endpoint: str
    key_id: str
    secret: str
    bucket: str = "pkgs"

    def put(self, key: str, body: bytes) -> None:
        import boto3  # type: ignore[import-untyped]

        client = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret, region_name="us-east-1",
        )  # fmt: skip
        client.put_object(Bucket=self.bucket, Key=key, Body=body)


@contextmanager
def moto_s3() -> Iterator[S3Server]:
    """moto's server with a bucket and an IAM user allowed s3:*; IAM auth is switched on once
    they are made, so only that user's key is accepted from then on."""
    import boto3

    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    with _process([str(exe), "-H", "127.0.0.1", "-p", str(port)], port, "moto_server"):
        endpoint = f"http://127.0.0.1:{port}"
        kw = {"endpoint_url": endpoint, "aws_access_key_id": "setup",
              "aws_secret_access_key": "setup", "region_name": "us-east-1"}  # fmt: skip
        boto3.client("s3", **kw).create_bucket(Bucket="pkgs")
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="agent")
        allow = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [allow]}
        iam.put_user_policy(UserName="agent", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="agent")["AccessKey"]
        request = urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
            headers={"Content-Type": "text/plain"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])


# -- GCS: gcp-storage-emulator ----------------------------------------------------------------


@dataclass
class GcsServer:
    host: str  # HOST:PORT, as STORAGE_EMULATOR_HOST names it
    token: str
    bucket: str = "pkgs"

    def put(self, key: str, body: bytes) -> None:
        from urllib.parse import quote

        request = urllib.request.Request(
            f"http://{self.host}/upload/storage/v1/b/{self.bucket}/o?uploadType=media"
            f"&name={quote(key, safe='')}",
            data=body, method="POST", headers={"Content-Type": "application/zip"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


@contextmanager
def gcs_emulator() -> Iterator[GcsServer]:
    port = free_port()
    script = Path(__file__).with_name("gcs_emulator.py")
    token = "good-token"
    command = [sys.executable, str(script), "--port", str(port), "--bucket", "pkgs",
               "--bearer", token]  # fmt: skip
    with _process(command, port, "gcp-storage-emulator"):
        yield GcsServer(f"127.0.0.1:{port}", token)


# -- Azure: azurite ---------------------------------------------------------------------------


def azurite_blob() -> Path | str:
    """azurite-blob, installed from npm into the cache folder the first time; or why not."""
    exe = _AZURITE_CACHE / "node_modules" / ".bin" / "azurite-blob"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        return "azurite (Azure's storage emulator) runs on node.js, and node/npm are not installed"
    _AZURITE_CACHE.mkdir(parents=True, exist_ok=True)
    with open(_AZURITE_CACHE / ".lock", "w") as lock:  # one install at a time, across sessions
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.exists():  # another session installed it meanwhile
            return exe
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix",
             str(_AZURITE_CACHE), f"azurite@{AZURITE_VERSION}"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    if done.returncode != 0 or not exe.exists():
        return f"npm install azurite@{AZURITE_VERSION} failed: {done.stderr.strip()[-300:]}"
    return exe


@dataclass
class AzureServer:
    url: str  # AZURITE_BLOB_STORAGE_URL
    container: str = "pkgs"

    def put(self, name: str, body: bytes) -> None:
        self._call("PUT", f"/{self.container}/{name}", body, {"x-ms-blob-type": "BlockBlob"})

    def create_container(self) -> None:
        self._call("PUT", f"/{self.container}", b"", {}, query={"restype": "container"})

    def _call(
        self, verb: str, path: str, body: bytes, headers: dict[str, str],
        query: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """One Blob service call, signed with the account's key (SharedKey)."""
        query = query or {}
        headers = {**headers, "x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}{path}" + "".join(
            f"\n{k}:{v}" for k, v in sorted(query.items())
        )
        length = str(len(body)) if body else ""
        kind = "application/octet-stream"  # else urllib sends (unsigned) a form's type
        to_sign = f"{verb}\n\n\n{length}\n\n{kind}\n\n\n\n\n\n\n{canonical_headers}{resource}"
        mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256)
        signature = base64.b64encode(mac.digest()).decode()
        headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{signature}"
        headers["Content-Type"] = kind
        suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
        request = urllib.request.Request(
            f"{self.url}/{AZURITE_ACCOUNT}{path}{suffix}", data=body, method=verb, headers=headers
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status in (200, 201)


@contextmanager
def azurite(location: Path) -> Iterator[AzureServer]:
    exe = azurite_blob()
    if isinstance(exe, str):
        pytest.skip(exe)
    port = free_port()
    command = [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
               str(location), "--skipApiVersionCheck", "--silent", "--loose"]  # fmt: skip
    with _process(command, port, "azurite-blob"):
        server = AzureServer(f"http://127.0.0.1:{port}")
        server.create_container()
        yield server


# -- a store whose connections break ----------------------------------------------------------


@dataclass
class CutProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream``: connection N (from 0) is cut after
    ``cuts[N]`` bytes of the store's answer (0: the request is read and the connection closed
    unanswered); the connections after those are forwarded whole."""

    upstream_port: int
    cuts: list[int]
    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        number, self.connections = self.connections, self.connections + 1
        cut = self.cuts[number] if number < len(self.cuts) else None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        try:
            if cut == 0:
                await reader.read(65536)
                return
            both = asyncio.gather(
                self._pipe(reader, up_writer, None), self._pipe(up_reader, writer, cut)
            )
            await asyncio.wait_for(both, timeout=30)
        except (OSError, TimeoutError, _Cut):
            pass
        finally:
            for w in (writer, up_writer):
                w.transport.abort()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: int | None
    ) -> None:
        sent = 0
        while data := await reader.read(65536):
            if cut is not None and sent + len(data) >= cut:
                writer.write(data[: cut - sent])
                await writer.drain()
                raise _Cut
            writer.write(data)
            await writer.drain()
            sent += len(data)
        if writer.can_write_eof():
            writer.write_eof()


class _Cut(Exception):
    """The proxy cuts this connection."""
