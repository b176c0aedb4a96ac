"""What an agent holds, as frozen values the doors only convert.

``AgentService.snapshot`` takes a ``Snapshot`` in one synchronous step on the event loop: the
envs, every package with its state, the cache figures, the totals and what recovery found at
start. ``AgentService.levels`` takes ``Levels``, the figures alone (no lists), for a metrics
scrape. What a package's state is ("installing", "ready" with references, "unused": cached and
evictable) is decided in the app layer, where the reference tables and the store meet; the gRPC
servicer turns a snapshot into protobuf and the metrics collector turns levels into samples,
and neither reads the store or the tables.

Pure values: no I/O, no asyncio; nothing here changes after it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EnvState(Enum):
    CREATING = "creating"  # references taken, installs in flight
    READY = "ready"  # every URI installed; creates of it answer at once
    FAILED = "failed"  # only in the record of recent failures; holds no references


class PackageState(Enum):
    INSTALLING = "installing"  # an install is running or queued
    READY = "ready"  # installed, and some live env references it
    UNUSED = "unused"  # installed, no references: cached, evicted least recently used first


@dataclass(frozen=True)
class EnvView:
    env_id: str
    canonical: str  # the env's canonical JSON (its identity)
    references: int  # 0 for a failed env
    uris: tuple[str, ...]  # "kind:uri"
    state: EnvState
    error: str  # a failed env's error, else ""
    created_ms: int
    job_ids: tuple[str, ...]  # the latest distinct job ids of its creates, newest last
    eager_install: bool  # the latest create asked for it (request or JSON config)


@dataclass(frozen=True)
class UriView:
    kind: str
    uri: str
    state: PackageState
    references: int  # live envs naming it
    size_bytes: int  # unpacked; 0 while installing
    last_used_ms: int
    local_path: str  # where it is installed; "" while installing


@dataclass(frozen=True)
class CacheView:
    used_bytes: int  # installed packages some live env references
    unused_bytes: int  # installed packages nobody references (kept within the budget)
    budget_bytes: int
    downloads: int
    extractions: int
    evictions: int
    hits: int


@dataclass(frozen=True)
class RecoveryView:
    """What the agent found and mended when it started (the app layer's copy of the summary
    recovery returns, so a door needs nothing from the state layer)."""

    rows_kept: int = 0
    rows_dropped: int = 0
    orphans_deleted: int = 0
    bytes_freed: int = 0
    envs_forgotten: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class BuildView:
    """A build in flight: its package, for how long, its bytes so far, who waits on it."""

    uri: str
    kind: str
    elapsed_s: float
    bytes_so_far: int  # in its staging folder, as last measured
    queued: bool  # waiting for an install slot
    kept: bool  # going on past a setup timeout
    env_ids: tuple[str, ...]  # envs whose creates wait on it now (none: kept going alone)
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class Snapshot:
    """Envs capped by count (live first, then recent failures not live); every package."""

    envs: tuple[EnvView, ...]
    uris: tuple[UriView, ...]
    cache: CacheView
    total_envs: int  # live envs, listed or not
    total_uris: int  # packages the store holds, listed or not
    recovery: RecoveryView
    builds: tuple[BuildView, ...] = ()  # in flight


@dataclass(frozen=True)
class Levels:
    """The figures a metrics scrape reads, without building any list."""

    used_bytes: int
    unused_bytes: int
    budget_bytes: int
    installs_in_flight: int  # running or queued
    live_envs: int  # envs with references
    evictions: int
    hits: int
    wheel_cache_bytes: int = 0  # the wheel cache's own bytes, as of its last measure
    wheel_cache_clears: int = 0
