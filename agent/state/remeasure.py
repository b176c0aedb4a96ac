"""Re-measuring a package when this agent's last reference to it goes: whatever its users wrote
into its folder (a worker's ``.venv`` in a shared working_dir, caches, outputs) counted, so the
budget, the free-disk floor and ``info`` see the bytes on disk, not the bytes installed.

A release (``UriStore.release``) asks for a re-measure of each ready package whose count
reached 0; the folder is walked in a thread (``disk.measure_tree``: no link followed, bounded),
then its size is committed to the index (``index.resize``: only if the row still names that
very folder, so a package evicted, or evicted and installed again, meanwhile is never written
back) and this agent's entry follows; a pass is asked for after, which evicts it if it is now
over the budget. While it is measured, this agent's passes keep it (``StateDB.measuring``):
it is not evicted by its old size. One re-measure per package at a time (a release while one
runs asks for one more after it), at most ``slots`` at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.core.errors import AgentError
from agent.core.uris import UriKey
from agent.install.disk.root import Measured, measure_tree
from agent.state.entries import UriEntry, UriState
from agent.state.passes import retrieve_exception
from agent.state.state_db import StateDB

log = logging.getLogger(__name__)

SLOTS = 2  # re-measures at once (each a thread walking a folder)


class Remeasure:
    """Invariant: a key is in ``_running`` while, and only while, its re-measure task runs, and
    this holder's ``StateDB.measuring`` names it exactly then."""

    def __init__(
        self,
        db: StateDB,
        entry: Callable[[UriKey], UriEntry | None],
        *,
        after: Callable[[], None],
        slots: int = SLOTS,
        measure: Callable[..., Measured | None] = measure_tree,
    ) -> None:
        """``entry``: the store's entry of a key now; ``after``: asks for a pass (the store's)."""
        self._db = db
        self._entry = entry
        self._after = after
        self._slots = asyncio.Semaphore(slots)
        self.measure = measure  # the folder measured (injected: blocking, run in a thread)
        self._running: dict[UriKey, asyncio.Task[None]] = {}
        self._again: set[UriKey] = set()  # released again while measured: once more after
        self._closed = False
        self.count = 0  # re-measures done (whatever they found)

    def ask(self, key: UriKey) -> None:
        """Re-measure ``key``'s folder soon (it was released); none once closed."""
        if self._closed:
            return
        if key in self._running:
            self._again.add(key)
            return
        self._db.measuring((key.kind.value, key.uri), True)
        task = asyncio.create_task(self._run(key), name=f"remeasure {key.label}")
        self._running[key] = task
        task.add_done_callback(retrieve_exception)
        task.add_done_callback(lambda _: self._done(key))

    def _done(self, key: UriKey) -> None:
        self._running.pop(key, None)
        self._db.measuring((key.kind.value, key.uri), False)
        again = key in self._again
        self._again.discard(key)
        self._after()  # its size counted, or it is no longer measured: a pass may evict it
        if again:
            self.ask(key)

    async def _run(self, key: UriKey) -> None:
        async with self._slots:
            entry = self._entry(key)
            if entry is None or entry.state is not UriState.READY:
                return  # evicted, or taken again and being obtained: nothing to measure
            path, before = entry.path, entry.size
            measured = await asyncio.to_thread(self.measure, path)
            self.count += 1
            if measured is None:  # gone (evicted by a peer): nothing to count
                return
            size = measured.size if measured.complete else max(measured.size, before)
            if not measured.complete:
                log.warning(
                    "re-measuring %s: its folder %s is too big to walk whole; counted as at "
                    "least %d bytes",
                    key.label,
                    path,
                    size,
                    extra={"uri": key.label, "path": str(path), "bytes": size},
                )
            try:
                changed = await self._db.resize(
                    (key.kind.value, key.uri), path.name, measured.ident, size
                )
            except AgentError as exc:  # busy or failing: the next release measures again
                log.warning(
                    "re-measuring %s: %s",
                    key.label,
                    exc.message,
                    extra={"uri": key.label, "error": exc.message},
                )
                return
        if not changed:
            return
        now = self._entry(key)
        if now is entry:  # the same package still (not evicted and installed again)
            entry.size = size
        log.info(
            "re-measured %s: %d bytes (was %d): its users wrote to its folder",
            key.label,
            size,
            before,
            extra={"uri": key.label, "bytes": size, "was_bytes": before},
        )

    def tasks(self) -> list[asyncio.Task[None]]:
        """The re-measures running (``UriStore.settle`` waits for them)."""
        return list(self._running.values())

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop: the re-measures running may finish within ``grace_s`` (a stopping agent's
        references go with it: what its envs' workers wrote is counted then or never), then
        those left are cancelled (a walk in its thread ends on its own)."""
        self._again.clear()  # a re-measure once more: not on the way out
        tasks = list(self._running.values())
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=grace_s)
        self._closed = True
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
