"""Object-store package URIs: ``s3://``, ``gs://``, ``azure://`` and ``abfss://``, spelled as Ray
spells them, checked and located. Pure: no I/O.

- ``s3://<bucket>/<key>``: an S3 bucket, or one of an S3-compatible store (``AWS_ENDPOINT_URL``).
- ``gs://<bucket>/<key>``: a Google Cloud Storage bucket (not ``gcs://``, which names a package
  a Ray driver uploaded to its cluster's GCS).
- ``azure://<container>@<account>.blob.core.windows.net/<blob>``, as Ray's cloud helpers spell an
  Azure blob (``.dfs.core.windows.net`` is taken too), or ``azure://<container>/<blob>``, as
  Ray's runtime env reads it (through smart_open), with the account from the environment
  (``AZURE_STORAGE_ACCOUNT_NAME``, or Ray's ``AZURE_STORAGE_ACCOUNT``).
- ``abfss://<container>@<account>.dfs.core.windows.net/<path>``: a file of an Azure Data Lake
  Storage Gen2 account, as Ray requires it spelled (the account is always named).

Each takes an optional ``#sha256=<hex>`` fragment (checked by ``parse_uri``), no query, no port
and no user info. A key is taken as written (no percent-decoding, as the clouds' own command-line
tools take it): at most 1024 bytes, no empty, ``.`` or ``..`` segment, no NUL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from agent.core.errors import InvalidRuntimeEnv, echo

MAX_KEY_BYTES = 1024  # S3's and GCS's limit on an object's name, Azure's on a blob's
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_GS_PART = re.compile(r"[a-z0-9_-]([a-z0-9_-]{0,61}[a-z0-9_-])?")
_GS_EDGE = re.compile(r"[a-z0-9](.*[a-z0-9])?", re.DOTALL)
_CONTAINER = re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]")
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_IPV4 = re.compile(r"\d+\.\d+\.\d+\.\d+")
_BLOB_HOSTS = (".blob.core.windows.net", ".dfs.core.windows.net")
_DFS_HOSTS = (".dfs.core.windows.net",)


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    """Where an object-store package is: its scheme, bucket (or container), key, and for Azure
    the storage account the URI names (None: the environment's)."""

    scheme: str
    bucket: str
    key: str
    account: str | None = None

    @property
    def cloud(self) -> str:
        """The store, as messages name it."""
        return {"s3": "S3", "gs": "Google Cloud Storage"}.get(self.scheme, "Azure Blob Storage")


def locate(url: str) -> ObjectLocation:
    """The location of a URI ``parse_uri`` accepted (a bug if it was not one)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    container, _, host = parts.netloc.partition("@")
    account = host.partition(".")[0] if host else None
    return ObjectLocation(scheme, container, parts.path[1:], account)


def check_s3(parts: SplitResult, where: str) -> str:
    """``s3://<bucket>/<key>``; the key is the path."""
    bucket = _authority(parts, where, "s3://<bucket>/<key>")
    if _S3_BUCKET.fullmatch(bucket) is None or ".." in bucket or _IPV4.fullmatch(bucket):
        raise InvalidRuntimeEnv(
            f"{where}: {echo(bucket)} is not an S3 bucket name: 3 to 63 lowercase letters, "
            "digits, '.' and '-', beginning and ending with a letter or digit, not an IP address"
        )
    return _key(parts, where, "s3://<bucket>/<key>")


def check_gs(parts: SplitResult, where: str) -> str:
    """``gs://<bucket>/<key>``; the key is the path."""
    bucket = _authority(parts, where, "gs://<bucket>/<key>")
    dotted = bucket.split(".")
    if (
        not 3 <= len(bucket) <= 222
        or (len(dotted) == 1 and len(bucket) > 63)
        or _GS_EDGE.fullmatch(bucket) is None
        or not all(_GS_PART.fullmatch(part) for part in dotted)
        or _IPV4.fullmatch(bucket)
    ):
        raise InvalidRuntimeEnv(
            f"{where}: {echo(bucket)} is not a Google Cloud Storage bucket name: 3 to 63 "
            "lowercase letters, digits, '-' and '_' (up to 222 with '.' between parts of at "
            "most 63), beginning and ending with a letter or digit, not an IP address"
        )
    return _key(parts, where, "gs://<bucket>/<key>")


def check_azure(parts: SplitResult, where: str) -> str:
    """``azure://<container>@<account>.blob.core.windows.net/<blob>`` or
    ``azure://<container>/<blob>``; ``abfss://<container>@<account>.dfs.core.windows.net/<path>``.
    The blob's name is the path."""
    scheme = parts.scheme.lower()
    form = (
        "abfss://<container>@<account>.dfs.core.windows.net/<path>"
        if scheme == "abfss"
        else "azure://<container>@<account>.blob.core.windows.net/<blob> or "
        "azure://<container>/<blob>"
    )
    netloc = parts.netloc
    if not netloc:
        raise InvalidRuntimeEnv(f"{where}: an {scheme} URI names its container ({form})")
    container, at, host = netloc.partition("@")
    if not at and scheme == "abfss":
        raise InvalidRuntimeEnv(f"{where}: an abfss URI names its container and account ({form})")
    if _CONTAINER.fullmatch(container) is None:
        raise InvalidRuntimeEnv(
            f"{where}: {echo(container)} is not an Azure container name: 3 to 63 lowercase "
            "letters, digits and '-', beginning and ending with a letter or digit, no '--'"
        )
    if at:
        hosts = _DFS_HOSTS if scheme == "abfss" else _BLOB_HOSTS
        lowered = host.lower()
        suffix = next((s for s in hosts if lowered.endswith(s)), None)
        if suffix is None:
            raise InvalidRuntimeEnv(
                f"{where}: the host {echo(host)} is not an Azure storage account's "
                f"({' or '.join('<account>' + s for s in hosts)}): {form}"
            )
        account = host[: -len(suffix)]
        if _ACCOUNT.fullmatch(account) is None:
            raise InvalidRuntimeEnv(
                f"{where}: {echo(account)} is not an Azure storage account name: 3 to 24 "
                "lowercase letters and digits"
            )
    return _key(parts, where, form)


def _authority(parts: SplitResult, where: str, form: str) -> str:
    """The bucket: the whole authority, with no user info nor port."""
    scheme = parts.scheme.lower()
    if not parts.netloc:
        raise InvalidRuntimeEnv(f"{where}: an {scheme} URI names its bucket ({form})")
    if "@" in parts.netloc:
        raise InvalidRuntimeEnv(f"{where}: an {scheme} URI takes no user info ({form})")
    if ":" in parts.netloc:
        raise InvalidRuntimeEnv(
            f"{where}: an {scheme} URI takes no port ({form}); an S3-compatible store's "
            "address is the agent's AWS_ENDPOINT_URL"
            if scheme == "s3"
            else f"{where}: an {scheme} URI takes no port ({form})"
        )
    return parts.netloc


def _key(parts: SplitResult, where: str, form: str) -> str:
    """The object's key: the path after the authority's '/', as written."""
    scheme = parts.scheme.lower()
    if parts.query:
        raise InvalidRuntimeEnv(f"{where}: an {scheme} URI takes no query ({form})")
    key = parts.path[1:]
    if not key:
        raise InvalidRuntimeEnv(f"{where}: an {scheme} URI names an object's key ({form})")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidRuntimeEnv(
            f"{where}: the key is {len(key.encode('utf-8', 'surrogatepass'))} bytes long; "
            f"the limit is {MAX_KEY_BYTES}"
        )
    if "\x00" in key:
        raise InvalidRuntimeEnv(f"{where}: the key contains a NUL byte")
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise InvalidRuntimeEnv(
            f"{where}: the key {echo(key)} has an empty, '.' or '..' segment (a leading, "
            "trailing or doubled '/'); name the object as it is stored"
        )
    return key
