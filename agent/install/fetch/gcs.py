"""Fetching ``gcs://`` packages: read from the Ray node's GCS in one call (``gcs_source``:
``GcsKvClient``, one channel, made at the first such fetch and closed by ``close``), retried as a
download is, then written chunk by chunk in threads as a file is copied. Without a GCS (an agent
with no Ray node) a gcs:// package is refused by ``check_origin``, before anything is fetched.
Ray's ``RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING``, set in the agent's environment, fails every
gcs:// fetch as a missing package, in Ray's words, as Ray's agent does.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.core.errors import DownloadFailed, PackageNotFound, PackageRejected
from agent.core.uris import ParsedUri
from agent.install.fetch.base import DownloadWatch, Fetched, FetchTools, Space, Transient
from agent.install.fetch.gcs_source import GcsKvClient, GcsUnavailable, missing_package
from agent.install.fetch.landing import Digest, create_landing, hop, opening, write_all

# Ray's switch that makes every gcs:// download fail, for tests of that failure
# (``packaging.RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING_ENV_VAR``): set in the node's environment
FAIL_DOWNLOAD_VAR = "RAY_RUNTIME_ENV_FAIL_DOWNLOAD_FOR_TESTING"


class GcsFetcher:
    """The ``gcs`` scheme's fetcher; ``client`` is None when the agent has no GCS."""

    def __init__(self, tools: FetchTools) -> None:
        limits = tools.limits
        self._limits = limits
        self._retrying = tools.retrying
        self.client = (
            None
            if tools.gcs is None
            else GcsKvClient(
                tools.gcs,
                max_value_bytes=limits.max_download_bytes,
                # no deadline of its own: one reply is the whole package (GBs may take
                # minutes); the create's setup timeout bounds the install and cancels the call
                timeout_s=None,
                reconnect_s=(limits.backoff_initial_s, limits.backoff_max_s),  # as its retries
            )
        )

    def check_origin(self, uri: ParsedUri, label: str) -> None:
        """A gcs:// package needs the Ray node's GCS."""
        if self.client is None:
            raise PackageRejected(
                f"{label}: a gcs:// package is read from a Ray node's GCS, and this agent has "
                "none: run it as the node's runtime env agent (`rtenv-agent ray-agent`, which "
                "Ray's raylet starts with the GCS address), or give it a Ray door with a GCS "
                "address"
            )

    async def fetch(
        self,
        uri: ParsedUri,
        dest: Path,
        label: str,
        space: Space,
        hashed: bool,
        watch: DownloadWatch | None,
    ) -> Fetched:
        client = self.client
        if client is None:  # check_origin refuses it first
            raise AssertionError(f"{label}: a gcs:// fetch with no GCS configured")
        if os.environ.get(FAIL_DOWNLOAD_VAR):  # Ray's fault switch, read as Ray reads it
            raise PackageNotFound(
                missing_package(label, client.config.address) + f" ({FAIL_DOWNLOAD_VAR} is set)"
            )

        async def once() -> bytes:
            try:
                return await client.get(uri.url, label)
            except GcsUnavailable as exc:
                raise Transient(str(exc)) from exc

        value = await self._retrying(
            once,
            lambda attempts, exc: DownloadFailed(_gcs_failed(label, client, attempts, exc)),
            label,
        )
        out = await opening(lambda: create_landing(dest), fd=int)
        digest = Digest(hashed)
        try:
            await space.expect(len(value))
            view = memoryview(value)
            for start in range(0, len(view), self._limits.chunk_bytes):
                chunk = view[start : start + self._limits.chunk_bytes]
                await space.take(start, len(chunk))
                await hop(write_all, out, chunk, digest)
        finally:
            os.close(out)
        return len(value), digest.hex()

    async def close(self) -> None:
        """Close the GCS channel, if one was opened."""
        if self.client is not None:
            await self.client.close()


def _gcs_failed(label: str, client: GcsKvClient, attempts: int, exc: Transient) -> str:
    """The last of a gcs:// fetch's failures: a call's deadline says so, not that the GCS is
    down; anything else is a GCS that did not answer."""
    cause = exc.__cause__
    if isinstance(cause, GcsUnavailable) and cause.deadline_s is not None:
        return (
            f"{label}: the GCS at {client.config.address} did not send the package within the "
            f"call's deadline of {cause.deadline_s:g}s, {attempts} times"
        )
    return (
        f"{label}: the GCS at {client.config.address} is unavailable: no answer after "
        f"{attempts} attempts ({exc}); is the Ray node's GCS running?"
    )
