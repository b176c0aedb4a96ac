"""Object-store packages (``s3://``, ``gs://``, ``azure://``, ``abfss://``), streamed through one
async client for all of them: obstore (the Python face of the Rust ``object_store`` crate), an
optional extra (``pip install 'runtime-env-agent[objectstore]'``) so the core install stays
small. Without it, such a URI is refused at once by ``Fetcher.check_origin``
(``ObjectStoreSetup``, FAILED_PRECONDITION, saying what to install).

``ObjectStores.open`` starts one GET and gives the object's declared size and its body as an
async stream of chunks (obstore's ``get_async`` and ``GetResult.stream``); the fetcher writes
them as it writes an http(s) body: bounded by the bytes read, hashed as written, retried with
the http policy. obstore's own retries are off (``max_retries=0``): one policy, the fetcher's.
A client per bucket and settings is kept (a few, most recently used), so a connection is
reused; the settings are read again at each fetch (``object_config``: the environment and the
AWS files, read in a thread), so a rotated key is used from the next fetch on.

Outcomes of one GET, mapped from obstore's errors: an object or bucket the store does not
have is ``PackageNotFound``; credentials the store refuses (401, 403: a wrong key, a bad
signature, no access) are ``PermissionDenied``; another 4xx is ``PackageRejected``; a dropped
or refused connection, a timeout, 408, 429 and 5xx are ``ObjectUnavailable`` (transient, for
the fetcher to retry); a client that cannot be made from the settings, and no credentials at
all (the instance's metadata service, asked when none are configured, does not answer), are
``ObjectStoreSetup``.
Messages name the package's label and the store's error code (``NoSuchKey``,
``SignatureDoesNotMatch``...), never the store's whole answer.

There are no allowed roots for object stores (``allow-file-root`` bounds ``file://``): as for
http(s), what the agent's credentials may read is the bound. Unlike the agent's http(s) client,
obstore's follows ``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY``, as each cloud's SDK does.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agent.core.errors import (
    ObjectStoreSetup,
    PackageNotFound,
    PackageRejected,
    PermissionDenied,
    echo,
)
from agent.core.object_uris import ObjectLocation, locate
from agent.install.fetch.object_config import (
    StoreSettings,
    aws_files,
    azure_settings,
    gcs_settings,
    s3_settings,
)

if TYPE_CHECKING:
    from obstore.store import AzureStore, GCSStore, S3Store

    Store = S3Store | GCSStore | AzureStore

INSTALL_HINT = "pip install 'runtime-env-agent[objectstore]'"
MAX_STORES = 16  # clients kept, most recently used
_WHOLE_REQUEST = timedelta(days=7)  # obstore's default bounds a whole GET to 30 s; the
# create's setup timeout bounds an install (and cancels the GET), not this
_CLOUD_VARS = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")
_FAILED_REQUEST = re.compile(r"Error performing [A-Z]+ (\S+)")
# where a client asks for credentials when none are configured: EC2's and ECS's metadata
# (IMDSv2's token first), GCE's metadata server, Azure's managed identity
_CREDENTIAL_PATHS = (
    "/latest/api/token",
    "/latest/meta-data/",
    "/v2/credentials",
    "/computeMetadata/",
    "/metadata/identity/",
)
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(  # S3's and Azure's <Code>, GCS's JSON "reason"
    r"<Code>([A-Za-z]+)</Code>|\"reason\":\s*\"([A-Za-z]+)\""
)
_NETWORK = (
    "error sending request",
    "HTTP error",
    "connection",
    "Connection",
    "timed out",
    "Timeout",
    "error decoding response body",
    "operation timed out",
)
_HINTS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or AWS_PROFILE "
    "in ~/.aws/credentials",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (a service account's JSON key)",
    "azure": "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or "
    "AZURE_STORAGE_CONNECTION_STRING",
}


def load_obstore() -> ModuleType | None:
    """obstore, or None when the optional extra is not installed."""
    try:
        return importlib.import_module("obstore")
    except ImportError:
        return None


class ObjectUnavailable(Exception):
    """One GET failed in a way worth another try."""


@dataclass
class ObjectRead:
    """One GET's answer: the size the store declares and the body, as it arrives."""

    size: int
    chunks: AsyncGenerator[memoryview, None]  # closed by its reader (contextlib.aclosing)


class ObjectStores:
    """The clients of the object stores packages are read from, one per bucket and settings."""

    def __init__(
        self,
        obstore: ModuleType | None,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        environ: Callable[[], Mapping[str, str]] = lambda: os.environ,
    ) -> None:
        self.obstore = obstore
        self._client = {
            "connect_timeout": timedelta(seconds=connect_timeout_s),
            "read_timeout": timedelta(seconds=read_timeout_s),
            "timeout": _WHOLE_REQUEST,
        }
        self._environ = environ
        self._stores: OrderedDict[tuple[object, ...], Store] = OrderedDict()
        self._lock = threading.Lock()  # the clients are looked up and made in threads

    def missing(self, label: str, scheme: str) -> ObjectStoreSetup | None:
        """Why this agent cannot fetch from an object store, or None."""
        if self.obstore is not None:
            return None
        return ObjectStoreSetup(
            f"{label}: an {scheme}:// package is read with obstore, an optional dependency "
            f"of this agent that is not installed: {INSTALL_HINT} on the agent's host"
        )

    async def open(self, url: str, label: str, chunk_bytes: int) -> ObjectRead:
        """Start the GET of the object at ``url`` (a URI ``parse_uri`` accepted)."""
        obstore = self.obstore
        if obstore is None:  # check_origin refuses it first
            raise AssertionError(f"{label}: an object-store fetch without obstore")
        where = locate(url)
        store = await asyncio.to_thread(self._store, where, label)
        try:
            result = await obstore.get_async(store, where.key)
        except Exception as exc:
            raise _outcome(exc, where, label) from exc
        return ObjectRead(int(result.meta["size"]), _chunks(result, chunk_bytes, where, label))

    def _store(self, where: ObjectLocation, label: str) -> Store:
        """The client for this bucket as today's settings make it. Blocking (a thread): it reads
        the environment and, for S3, the AWS files."""
        env = self._environ()
        try:
            settings = self._settings(where, env)
        except ObjectStoreSetup as exc:
            raise ObjectStoreSetup(f"{label}: {exc.message}") from exc
        # obstore reads the clouds' variables itself when it makes a client: they are part of
        # what makes it, and a client made under other values is not reused
        read_by_obstore = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_CLOUD_VARS)))
        key = (where.scheme, where.bucket, where.account, settings, read_by_obstore)
        with self._lock:
            store = self._stores.get(key)
            if store is not None:
                self._stores.move_to_end(key)
                return store
            store = self._make(where, settings, label)
            self._stores[key] = store
            while len(self._stores) > MAX_STORES:
                self._stores.popitem(last=False)
            return store

    def _settings(self, where: ObjectLocation, env: Mapping[str, str]) -> StoreSettings:
        if where.scheme == "s3":
            credentials, config = aws_files(env)
            return s3_settings(env, _read(credentials), _read(config))
        if where.scheme == "gs":
            return gcs_settings(env)
        return azure_settings(env, where.account)

    def _make(self, where: ObjectLocation, settings: StoreSettings, label: str) -> Store:
        from obstore.store import AzureStore, GCSStore, S3Store

        options: Any = {**self._client, "allow_http": settings.allow_http}
        config: Any = settings.as_dict()
        retry: Any = {"max_retries": 0}  # the fetcher's retries, not obstore's
        try:
            if where.scheme == "s3":
                return S3Store(
                    where.bucket, config=config, client_options=options, retry_config=retry
                )
            if where.scheme == "gs":
                return GCSStore(
                    where.bucket, config=config, client_options=options, retry_config=retry
                )
            return AzureStore(
                where.bucket, config=config, client_options=options, retry_config=retry
            )
        except Exception as exc:  # obstore's errors, and ValueError for a bad setting
            raise ObjectStoreSetup(
                f"{label}: the {where.cloud} client cannot be made from the agent's settings: "
                f"{echo(_first_line(exc))}"
            ) from exc


async def _chunks(
    result: Any, chunk_bytes: int, where: ObjectLocation, label: str
) -> AsyncGenerator[memoryview, None]:
    try:
        async for chunk in result.stream(min_chunk_size=chunk_bytes):
            yield memoryview(chunk)
    except Exception as exc:
        raise _outcome(exc, where, label) from exc


def _read(path: str) -> str | None:
    """A credentials file's text, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1024 * 1024)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ObjectStoreSetup(f"{path} cannot be read: {echo(str(exc))}") from exc


def _outcome(exc: Exception, where: ObjectLocation, label: str) -> Exception:
    """One of obstore's errors as the fetcher words it: final, or ``ObjectUnavailable``."""
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    text = str(exc)
    code = _store_code(text)
    said = f" ({code})" if code else ""
    noun = "bucket" if where.scheme in ("s3", "gs") else "container"
    in_bucket = f"{noun} {where.bucket!r}" + (
        f" of account {where.account!r}" if where.account else ""
    )
    if isinstance(exc, FileNotFoundError):
        return PackageNotFound(
            f"{label}: {where.cloud} has no object {echo(where.key)} in {in_bucket}{said}"
        )
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        return PermissionDenied(
            f"{label}: {where.cloud} refused the agent's credentials for {in_bucket}{said}; "
            f"they come from the agent's environment: {_HINTS.get(where.scheme, _HINTS['azure'])}"
        )
    if (asked := _FAILED_REQUEST.search(text)) is not None and any(
        marker in asked.group(1) for marker in _CREDENTIAL_PATHS
    ):
        return ObjectStoreSetup(
            f"{label}: no {where.cloud} credentials: none in the agent's environment or files, "
            f"and the instance's metadata service did not give any ({echo(_first_line(exc))}); "
            f"set {_HINTS.get(where.scheme, _HINTS['azure'])}"
            + (", or AWS_SKIP_SIGNATURE=true for a public bucket" if where.scheme == "s3" else "")
        )
    status = _STATUS.search(text)
    if status is not None:
        number = int(status.group(1))
        if number in (408, 429) or number >= 500:
            return ObjectUnavailable(f"{where.cloud} answered {number}{said}")
        return PackageRejected(f"{label}: {where.cloud} answered {number}{said}")
    if any(word in text for word in _NETWORK):
        return ObjectUnavailable(f"{where.cloud}: {echo(_first_line(exc))}")
    return PackageRejected(f"{label}: {where.cloud} failed: {echo(_first_line(exc))}")


def _store_code(text: str) -> str | None:
    """The store's error code in its answer (S3's and Azure's <Code>, GCS's reason)."""
    match = _CODE.search(text)
    if match is None:
        return None
    return next(group for group in match.groups() if group)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
