"""``gcs://`` packages: what a Ray driver uploads to its cluster's GCS, read back over gRPC.

``ray.init(runtime_env={"working_dir": "./dir"})`` (and ``py_modules=[dir]``) zips the folder
and stores it in the GCS's key-value store under its URI, ``gcs://_ray_pkg_<hash>.zip``, in the
default (empty) namespace. A node's agent reads it back with one call,
``/ray.rpc.InternalKVGcsService/InternalKVGet`` (messages of ``rtenv.ray.v1.gcs_kv_pb2``: this
project's own copy of Ray's field names and numbers), carrying the metadata Ray's own clients
send: ``ray_cluster_id`` (the cluster id in lowercase hex, as the raylet passes it in
``--cluster-id-hex``) and, when Ray's token auth is on, ``authorization: Bearer <token>``.
Checked against a Ray 2.60 GCS: a call with no cluster id is served; another id, or the right
one in uppercase, is UNAUTHENTICATED ("WrongClusterID"); with token auth on, a missing or wrong
token is UNAUTHENTICATED ("InvalidAuthToken"); a missing key is answered OK with GcsStatus code
17 ("Failed to find the key") and an empty value.

The whole package arrives in one gRPC message. ``GcsKvClient`` bounds it by the fetch size limit
through the channel's ``max_receive_message_length`` (a larger reply is refused by gRPC before
it is held in memory) and checks the value's length again; the reply is parsed in a thread (it
may be hundreds of MB). One channel per client (the fetcher keeps one client per GCS address),
opened at the first call and reused, closed with ``close``.

Outcomes of one call (the fetcher retries what is transient, within its attempts and backoff):
the value; ``PackageNotFound`` for a key the GCS does not hold (Ray's NotFound, code 17, or an
empty value); ``PermissionDenied`` when the GCS refuses the caller (UNAUTHENTICATED,
PERMISSION_DENIED: the wrong cluster id or token); ``PackageRejected`` for a reply over the
limit; ``GcsUnavailable`` (transient) for the rest: no connection, a deadline, another status.

A call has no deadline of its own by default (as Ray's agent reads a package): a package of GBs
may take minutes, and the create's setup timeout already bounds the whole install (it cancels
the call). A call made while the channel cannot connect fails at once (no wait for ready), so an
unreachable GCS is still found out at the fetcher's pace.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from agent.core.errors import (
    ConfigError,
    PackageNotFound,
    PackageRejected,
    PermissionDenied,
    echo,
)
from rtenv.ray.v1 import gcs_kv_pb2

METHOD = "/ray.rpc.InternalKVGcsService/InternalKVGet"
CLUSTER_ID_KEY = "ray_cluster_id"  # the metadata key of Ray's clients (kClusterIdKey)
# Ray's variable for how long an upload outlives its job, and its default (``ray_constants``)
PIN_EXPIRATION_VAR = "RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S"
PIN_EXPIRATION_DEFAULT_S = 600
RAY_NOT_FOUND = 17  # Ray's StatusCode::NotFound, in the reply's GcsStatus
MAX_GRPC_MESSAGE = 2**31 - 1  # gRPC's own bound on a message (a C int)
REPLY_OVERHEAD = 64 * 1024  # the reply's status and field tags around the value
_DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}")
_HEX = re.compile(r"[0-9A-Fa-f]*")
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII: a gRPC metadata value


@dataclass(frozen=True)
class GcsConfig:
    """Where a node's GCS is and how to present ourselves to it (Ray's --gcs-address,
    --cluster-id-hex, and its auth token when token auth is on)."""

    address: str  # HOST:PORT
    cluster_id_hex: str = ""  # "" = sent without (a GCS accepts a call that names no cluster)
    token: str | None = None

    def __post_init__(self) -> None:
        if _HOST_PORT.fullmatch(self.address) is None:
            raise ConfigError(f"the GCS address {echo(self.address)} must be HOST:PORT")
        if _HEX.fullmatch(self.cluster_id_hex) is None:
            raise ConfigError(
                f"the cluster id {echo(self.cluster_id_hex)} must be hex (Ray's --cluster-id-hex)"
            )
        if self.token is not None and _TOKEN.fullmatch(self.token) is None:
            raise ConfigError(
                "the Ray auth token must be printable ASCII without spaces (it is sent as "
                "gRPC metadata)"
            )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries, as Ray's own GCS clients send it."""
        pairs: list[tuple[str, str]] = []
        if self.cluster_id_hex:  # lowercase: the GCS compares it with its own ClusterID::Hex()
            pairs.append((CLUSTER_ID_KEY, self.cluster_id_hex.lower()))
        if self.token is not None:
            pairs.append(("authorization", f"Bearer {self.token}"))
        return tuple(pairs)


class GcsUnavailable(Exception):
    """One call failed in a way worth another try (no connection, a deadline, an error status
    other than those with a meaning here). ``deadline_s``: the call's deadline, when it was what
    ended the call."""

    def __init__(self, message: str, *, deadline_s: float | None = None) -> None:
        super().__init__(message)
        self.deadline_s = deadline_s


class GcsKvClient:
    """``InternalKVGet`` on one GCS over one grpc.aio channel, opened at the first call."""

    def __init__(
        self,
        config: GcsConfig,
        *,
        max_value_bytes: int,
        timeout_s: float | None = None,
        reconnect_s: tuple[float, float] = (1.0, 120.0),
    ) -> None:
        """``timeout_s`` bounds one call (None: no deadline of its own; the caller's timeout,
        the create's setup timeout, bounds it); ``reconnect_s`` is the channel's reconnect backoff
        (first, most): a call made while the channel waits to reconnect fails at once, so the
        fetcher's retries only see a GCS that came back if the channel tries again as often."""
        self.config = config
        self._reconnect_ms = (max(1, int(reconnect_s[0] * 1000)), int(reconnect_s[1] * 1000))
        # what one gRPC message can carry bounds a package too: the value and the reply around it
        self._capped = max_value_bytes > MAX_GRPC_MESSAGE - REPLY_OVERHEAD
        self.max_value_bytes = min(max_value_bytes, MAX_GRPC_MESSAGE - REPLY_OVERHEAD)
        self.max_receive_bytes = self.max_value_bytes + REPLY_OVERHEAD
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._call: (
            grpc.aio.UnaryUnaryMultiCallable[gcs_kv_pb2.InternalKVGetRequest, bytes] | None
        ) = None

    def _callable(
        self,
    ) -> grpc.aio.UnaryUnaryMultiCallable[gcs_kv_pb2.InternalKVGetRequest, bytes]:
        if self._call is None:
            self._channel = grpc.aio.insecure_channel(
                self.config.address,
                options=[
                    ("grpc.max_receive_message_length", self.max_receive_bytes),
                    ("grpc.enable_http_proxy", 0),  # as the agent's HTTP client: no proxy
                    ("grpc.initial_reconnect_backoff_ms", self._reconnect_ms[0]),
                    ("grpc.max_reconnect_backoff_ms", max(self._reconnect_ms)),
                ],
            )
            # no response deserializer: the reply's bytes are parsed in a thread
            self._call = self._channel.unary_unary(
                METHOD, request_serializer=gcs_kv_pb2.InternalKVGetRequest.SerializeToString
            )
        return self._call

    async def get(self, key: str, label: str) -> bytes:
        """The value stored under ``key`` (a package's URI) in the default namespace."""
        request = gcs_kv_pb2.InternalKVGetRequest(key=key.encode(), namespace=b"")
        try:
            raw = await self._callable()(
                request, metadata=self.config.metadata(), timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise self._outcome(exc, label) from exc
        if not isinstance(raw, bytes):  # an identity deserializer hands the bytes through
            raise GcsUnavailable(f"the GCS's reply is {type(raw).__name__}, not bytes")
        reply = await asyncio.to_thread(_parse_reply, raw)
        del raw  # the value is held once, in the reply, from here on
        if reply is None:
            raise GcsUnavailable("the GCS's reply is not an InternalKVGetReply")
        status = reply.status
        if status.code == RAY_NOT_FOUND or (status.code == 0 and not reply.value):
            raise self._not_found(label)
        if status.code != 0:
            raise GcsUnavailable(f"the GCS answered status {status.code}: {echo(status.message)}")
        if len(reply.value) > self.max_value_bytes:
            raise self._too_large(label)
        return reply.value

    async def close(self) -> None:
        channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            await channel.close()

    # -- outcomes ------------------------------------------------------------------------------
    def _outcome(self, exc: grpc.aio.AioRpcError, label: str) -> Exception:
        code, details = exc.code(), exc.details() or ""
        if code in _DENIED:
            return PermissionDenied(
                f"{label}: the GCS at {self.config.address} refused the agent "
                f"({code.name}: {echo(details)}); check the cluster id (Ray's --cluster-id-hex) "
                "and, with Ray's token auth on, the token"
            )
        if code is grpc.StatusCode.NOT_FOUND:
            return self._not_found(label)
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            return self._too_large(label)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and self._timeout_s is not None:
            return GcsUnavailable(
                f"the package was not received within the call's deadline of "
                f"{self._timeout_s:g}s ({echo(details)})",
                deadline_s=self._timeout_s,
            )
        return GcsUnavailable(f"{code.name}: {echo(details)}")

    def _not_found(self, label: str) -> PackageNotFound:
        return PackageNotFound(missing_package(label, self.config.address))

    def _too_large(self, label: str) -> PackageRejected:
        return PackageRejected(
            f"{label} is larger than {self.max_value_bytes} bytes; the limit is "
            f"{self.max_value_bytes} (max_download_bytes"
            + (", capped at what one gRPC message carries)" if self._capped else ")")
        )


def _parse_reply(raw: bytes) -> gcs_kv_pb2.InternalKVGetReply | None:
    try:
        return gcs_kv_pb2.InternalKVGetReply.FromString(raw)
    except DecodeError:  # a reply that is not the message
        return None


def missing_package(label: str, address: str) -> str:
    """Why a gcs:// package could not be read, in Ray's agent's words ("Failed to download ...
    the default is 600"), which Ray's tests and users look for. Pure."""
    return (
        f"{label}: Failed to download runtime_env file package from the GCS at {address} to "
        "this node: the GCS holds no such package. The driver's upload may have expired (Ray "
        f"keeps an upload for a while after its job ends: {PIN_EXPIRATION_VAR}, the default is "
        f"{PIN_EXPIRATION_DEFAULT_S}) or its cluster is another: run the driver again to "
        "upload it"
    )
