"""How the service's state reads as info's frozen values (``agent.app.snapshot``): a live env
from its record and its references, a recent failure, a package from its store entry and its
count, the cache figures and what recovery found.

Pure functions of what they are given (no I/O, no await): ``AgentService.snapshot`` calls them
in its one synchronous step, so nothing changes under them.
"""

from __future__ import annotations

from agent.app.created import uris_of
from agent.app.records import EnvRecord, FailedEnv
from agent.app.snapshot import CacheView, EnvState, EnvView, PackageState, RecoveryView, UriView
from agent.core.refs import RefTables
from agent.state.entries import StoreStats, UriEntry, UriState
from agent.state.recovery import RecoverySummary
from agent.state.store import UriStore


def env_view(env_id: str, record: EnvRecord, tables: RefTables) -> EnvView:
    """A live env as info shows it: its record and its references."""
    refs = tables.env(env_id)
    assert refs is not None, f"record of env {env_id} without references"
    return EnvView(
        env_id=env_id,
        canonical=record.canonical,
        references=refs.count,
        uris=uris_of(refs.keys),
        state=record.state,
        error="",
        created_ms=record.created_ms,
        job_ids=record.job_ids,
        eager_install=record.eager_install,
    )


def failed_view(failed: FailedEnv) -> EnvView:
    """A recent failure as info shows it: no references, its error."""
    env = failed.env
    return EnvView(
        env_id=env.env_id,
        canonical=env.canonical,
        references=0,
        uris=uris_of(env.uri_keys),
        state=EnvState.FAILED,
        error=failed.error,
        created_ms=failed.failed_ms,
        job_ids=failed.job_ids,
        eager_install=failed.eager_install,
    )


def uri_view(entry: UriEntry, store: UriStore, tables: RefTables) -> UriView:
    """A package as info shows it: installing; ready (referenced); or unused (in the store's
    LRU: no live env references it, so it may be evicted)."""
    key = entry.key
    ready = entry.state is UriState.READY
    if not ready:
        state = PackageState.INSTALLING
    elif store.is_unused(key):
        state = PackageState.UNUSED
    else:
        state = PackageState.READY
    return UriView(
        kind=key.kind.value,
        uri=key.uri,
        state=state,
        references=tables.uri_count(key),
        size_bytes=entry.size,
        last_used_ms=entry.last_used_ms,
        local_path=str(entry.path) if ready else "",
    )


def cache_view(stats: StoreStats) -> CacheView:
    """The store's figures as info shows them."""
    return CacheView(
        used_bytes=stats.used_bytes,
        unused_bytes=stats.unused_bytes,
        budget_bytes=stats.budget_bytes,
        downloads=stats.downloads,
        extractions=stats.extractions,
        evictions=stats.evictions,
        hits=stats.hits,
    )


def recovery_view(summary: RecoverySummary) -> RecoveryView:
    """What recovery found at start, as info shows it."""
    return RecoveryView(
        rows_kept=summary.rows_kept,
        rows_dropped=summary.rows_dropped,
        orphans_deleted=summary.orphans_deleted,
        bytes_freed=summary.bytes_freed,
        envs_forgotten=summary.envs_forgotten,
        seconds=summary.seconds,
    )
