"""The agent's service as the agent builds it, in this process, over the store rig's mock
packages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.app.config import Settings
from agent.app.created import Created
from agent.app.service import AgentService
from agent.core.refs import RefTables
from agent.state.entries import UriState
from agent.state.state_db import MEMORY, StateDB
from tests.harness.in_process import listed
from tests.harness.store_rig import LIMITS, Clock, MockPackages, RecordingSleep, key_of, make_store


@dataclass
class ServiceRig:
    service: AgentService
    packages: MockPackages
    clock: Clock
    db: StateDB

    async def create(self, serialized: str, *, timeout_s: int = 0) -> Created:
        created = await self.service.create(serialized, timeout_s, "")
        self.check()
        return created

    async def delete(self, env_id: str) -> int:
        remaining = await self.service.delete(env_id, "", "")
        self.check()
        return remaining

    def references(self, url: str) -> int:
        return self.service.tables.uri_count(key_of(url))

    def installed(self, url: str) -> bool:
        entry = self.service.store.entry(key_of(url))
        return entry is not None and entry.state is UriState.READY and entry.path.is_dir()

    def unused(self, url: str) -> bool:
        return self.service.store.is_unused(key_of(url))

    def listing(self, sub: str) -> list[str]:
        """For tmp/ and trash/: what is in the agents' own folders there."""
        return listed(self.service.store.root, sub)

    def check(self) -> None:
        self.service.check_invariants()


@asynccontextmanager
async def service_rig(
    tmp_path: Path, *, persist: bool = False, **overrides: Any
) -> AsyncIterator[ServiceRig]:
    """The service as the agent builds it, over ``MockPackages``; ``persist``: with a real
    state.db in the root (else the index in memory)."""
    root = tmp_path / "root"
    settings = replace(Settings(root=root), fetch=LIMITS, persist=persist, **overrides)
    packages, clock = MockPackages(), Clock()
    root.mkdir()
    db = StateDB(root / "state.db") if persist else StateDB(MEMORY, root=root)
    await db.open()  # this process a holder of the root
    tables = RefTables()
    store = make_store(
        root, packages.transport, refcount=tables.uri_count,
        budget_bytes=settings.cache_budget_bytes, limits=settings.fetch, sleep=RecordingSleep(),
        clock=clock, db=db,
    )  # fmt: skip
    rig = ServiceRig(AgentService(settings, store, tables, db=db, clock=clock), packages, clock, db)
    try:
        yield rig
    finally:
        packages.open_all()
        await store.close()
        await db.close()
    assert packages.transport.open_streams == 0, "an answer's stream was left open"
    assert rig.listing("tmp") == [], "staging left behind"
