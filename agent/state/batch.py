"""The batch a transaction of the index carries: the changes a holder noted behind
(``write_behind``), the latest per row, and how a failed batch is merged with the next."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agent.state.index import RowKey


@dataclass
class Batch:
    """Changes noted behind, the latest per row, written in one transaction. A ready row is
    never deleted from here: only a pass evicts, after checking its references (R2)."""

    used: dict[RowKey, int] = field(default_factory=dict)  # -> last_used_ms
    live_envs: int | None = None  # None: not noted
    refs_dropped: set[RowKey] = field(default_factory=set)  # this holder's count reached 0
    claims_dropped: set[RowKey] = field(default_factory=set)  # its install failed
    # drops to defer (the rows stay, ``temp.released`` says so), and deferred drops cancelled
    defer: set[RowKey] = field(default_factory=set)
    undefer: set[RowKey] = field(default_factory=set)
    deferred: list[RowKey] = field(default_factory=list)  # set by the thread: what it deferred
    committed: bool = False  # set by the thread: its transaction committed
    done: asyncio.Future[None] | None = None  # a batch that defers: done once ``written``

    def use(self, key: RowKey, last_used_ms: int) -> None:
        self.used[key] = last_used_ms

    def __len__(self) -> int:
        return (
            len(self.used)
            + (self.live_envs is not None)
            + len(self.refs_dropped)
            + len(self.claims_dropped)
            + len(self.defer)
            + len(self.undefer)
        )

    def then(self, newer: Batch) -> Batch:
        """This batch followed by a newer one, as one batch: the same as noting this batch's
        changes and then the newer one's into one (the newer note of a row wins). Dropping a
        reference or a claim twice is dropping it once: those are unions. A failed batch is
        carried with nothing to defer (``written_out``), so only the newer one defers."""
        used = {**self.used, **newer.used}
        live = self.live_envs if newer.live_envs is None else newer.live_envs
        return Batch(
            used,
            live,
            self.refs_dropped | newer.refs_dropped,
            self.claims_dropped | newer.claims_dropped,
            self.defer | newer.defer,
            self.undefer | newer.undefer,
        )

    def carried(self) -> Batch:
        """What a failed write carries: this batch but its drops to defer, which the loop notes
        again (``WriteBehind.written``): their rows are still there, rolled back."""
        return Batch(
            self.used,
            self.live_envs,
            self.refs_dropped,
            self.claims_dropped,
            set(),
            self.undefer,
        )
