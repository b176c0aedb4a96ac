"""The passes over the root's index that one agent runs, and how its view of the ready packages
follows them.

A pass (``StateDB.sweep``, one transaction: ``index`` R2 and R4) reaps the dead holders, then
evicts the root's unused packages over the budget, least recently used first, each moved into
this agent's trash and deleted after. Passes run after a release and after an install (one at a
time, coalesced: a pass asked for waits ``window_s`` for more changes to carry, unless someone
waits for it), every ``interval_s``, and when the disk room lacks bytes (``evict_for``, at once).
A pass's result is also how this agent's view follows the index: packages other agents
installed appear, packages they evicted go. With a wheel cache, the evicted are deleted before
it is measured, and it is cleared when its own bytes and the root's unused bytes are over the
budget (``agent.install.venvs.wheel_cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent.core.errors import AgentError, echo_label
from agent.core.uris import UriKey, UriKind
from agent.install.disk.root import remove_all
from agent.install.venvs.wheel_cache import WheelCache
from agent.state.entries import UriEntry, UriState
from agent.state.index import KindBudget
from agent.state.state_db import StateDB
from agent.state.sweeping import Swept

log = logging.getLogger(__name__)

# A pass asked for waits this long for more changes to carry (one pass for the releases of a
# busy moment, not one each), unless someone waits for it (``caught_up``, ``settle``): unused
# bytes may stay over the budget for that long, never longer than the pass takes after it
PASS_WINDOW_S = 0.01


class Passes:
    """Invariants: at most one pass runs at a time (``running``), and one asked for while it
    runs runs after it (``_again``); none starts once ``halt`` was called; ``_seen_gen`` is the
    index's last change of the ready packages this view follows (-1: none yet, or the view lost
    one: the next pass reads them all)."""

    def __init__(
        self,
        db: StateDB,
        entries: dict[UriKey, UriEntry],
        *,
        adopt: Callable[[UriKey, int, int], None],
        delete: Callable[[list[Path]], None],
        budget_bytes: int,
        wheel_cache: WheelCache | None,
        sleep: Callable[[float], Awaitable[None]],
        interval_s: float,
        window_s: float = PASS_WINDOW_S,
    ) -> None:
        """``entries``: the store's own table, which a pass's result changes (packages
        adopted, or dropped when evicted); ``adopt`` and ``delete``: the store's."""
        self._db = db
        self._entries = entries
        self._adopt = adopt
        self._delete = delete
        self.budget_bytes = budget_bytes  # the root's unused bytes kept
        self.kind_budgets: tuple[KindBudget, ...] = ()  # and some kinds' own (Ray's per kind)
        self.after_pass: Callable[[], Awaitable[None]] | None = None  # e.g. Ray's folders
        self.wheel_cache = wheel_cache
        self._sleep = sleep
        self._interval_s = interval_s
        self._window_s = window_s
        self.running: asyncio.Task[None] | None = None  # the pass running, if any
        self._again = False  # a pass was asked for while one ran
        self._hurry = asyncio.Event()  # someone waits for the next pass: no window before it
        self.periodic: asyncio.Task[None] | None = None
        self._halted = False  # the store closes: no pass is started any more
        self.root_bytes = (0, 0)  # the root's ready and unused bytes, as of the last pass
        self._seen_gen = -1
        self._resets = 0  # full reads asked for (``lost``): a pass started before the last
        # one may have read the index before the view lost the package, so it cannot answer it
        self.evictions = 0
        self.count = 0  # passes over the index, run by this agent

    def start(self) -> None:
        """Begin the periodic passes (after recovery): a dead agent's references are taken
        back, and the budget kept, even when this agent is idle."""
        if self.periodic is None and self._interval_s > 0:
            self.periodic = asyncio.create_task(self._every_interval(), name="sweeps")

    async def _every_interval(self) -> None:
        while True:
            await self._sleep(self._interval_s)
            self.ask()

    def ask(self) -> None:
        """A pass soon: at once if none runs, else once more after the one running (none once
        halted: an install the store's close cancels must not start one)."""
        if self._halted:
            return
        if self.running is not None:
            self._again = True
            return
        self.running = asyncio.create_task(self._loop(), name="sweep")
        self.running.add_done_callback(retrieve_exception)

    def lost(self) -> None:
        """The view lost a package that may still be ready in the index (a failed obtain of
        one it had): the next pass reads every ready package."""
        self._seen_gen = -1
        self._resets += 1
        self.ask()

    def hurry(self) -> None:
        """Someone waits for the pass running or asked for: it skips its window."""
        self._hurry.set()

    async def _loop(self) -> None:
        try:
            while True:
                await self._window()
                self._again = False
                # with a wheel cache, the evicted are deleted before it is measured (looked at
                # before the sweep: nothing may await between the sweep and its _apply)
                cache = self.wheel_cache is not None and await asyncio.to_thread(
                    self.wheel_cache.path.is_dir
                )
                try:
                    self.count += 1
                    resets = self._resets
                    swept = await self._db.sweep(
                        self.budget_bytes, since=self._seen_gen, kind_budgets=self.kind_budgets
                    )
                except AgentError as exc:  # busy or failing: retried at the next pass
                    log.warning(
                        "a pass over the cache index failed (%s); retried at the next",
                        exc.message,
                        extra={"error": exc.message, "kind": exc.kind.value},
                    )
                    return
                except Exception:  # a bug: logged with its traceback, the next pass runs
                    log.exception("a pass over the cache index failed (a bug)")
                    return
                trashed = self._apply(swept, resets, delete=not cache)
                if cache:
                    await self._keep_cache_in_budget(trashed, swept.unused_bytes)
                if self.after_pass is not None:
                    try:
                        await self.after_pass()
                    except OSError as exc:  # a folder it could not write: the next pass again
                        log.warning("after a pass: %s", exc, extra={"error": str(exc)})
                if not self._again:
                    return
        finally:
            self.running = None

    async def _window(self) -> None:
        """Before a pass: let the changes of the next ``window_s`` join it, unless someone
        waits for the pass; a wait that comes during the window ends it."""
        if self._window_s > 0 and not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), self._window_s)
        self._hurry.clear()

    async def caught_up(self, timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) for the pass running or asked for."""
        task = self.running
        if task is not None:
            self._hurry.set()
            await asyncio.wait([task], timeout=timeout_s)

    async def _keep_cache_in_budget(self, trashed: list[Path], unused: int) -> None:
        """After a pass: the evicted packages deleted first (their files the cache shares become
        its own), then the cache measured, and cleared if the root's unused bytes and its own
        are over the budget."""
        cache = self.wheel_cache
        assert cache is not None
        if trashed:
            await asyncio.to_thread(remove_all, trashed)
        if await cache.measure() and unused + cache.own_bytes > self.budget_bytes:
            log.info(
                "the wheel cache's own %d bytes and %d unused bytes are over the budget of %d",
                cache.own_bytes,
                unused,
                self.budget_bytes,
                extra={
                    "bytes": cache.own_bytes,
                    "unused_bytes": unused,
                    "budget_bytes": self.budget_bytes,
                },
            )
            await cache.clear()

    async def evict_for(self, needed: int) -> list[Path]:
        """The disk room lacks ``needed`` bytes: a pass that frees them (none if all the
        unused bytes of the root would not); return the trashed paths, still to be deleted.
        When the pass can free none, the wheel cache is cleared (its own bytes freed: the room
        measures again)."""
        self.count += 1
        resets = self._resets
        swept = await self._db.sweep(
            self.budget_bytes, needed, since=self._seen_gen, kind_budgets=self.kind_budgets
        )
        trashed = self._apply(swept, resets, delete=False)
        if not trashed and self.wheel_cache is not None and await self.wheel_cache.measure():
            await self.wheel_cache.clear()
        return trashed

    def _apply(self, swept: Swept, resets: int, *, delete: bool) -> list[Path]:
        """A pass's result (``resets``: the count of full reads asked for when it started):
        count and log this agent's evictions, have the dead holders' folders deleted, and make
        this agent's view of the ready packages follow the index's changes. Return the evicted
        packages' trashed paths (deleted here when ``delete``)."""
        trashed = []
        for evicted in swept.evicted:
            row = evicted.row
            label = echo_label(f"{row.kind}:{row.uri}")  # as UriKey.label, any kind
            self.evictions += 1
            if evicted.trashed is None:
                log.warning("evicting %s: its folder was gone already", label, extra={"uri": label})
            else:
                trashed.append(evicted.trashed)
            log.info(
                "evicted %s (%d bytes, unused)",
                label,
                row.size,
                extra={"uri": label, "bytes": row.size},
            )
        if delete and trashed:
            self._delete(trashed)
        self._delete(swept.reaped.aside)
        if swept.gen >= self._seen_gen or swept.full:  # an older pass's result changes nothing
            self._follow(swept, resets)
        self.root_bytes = (swept.ready_bytes, swept.unused_bytes)
        return trashed

    def _follow(self, swept: Swept, resets: int) -> None:
        """This agent's view of the ready packages, made the index's: those another agent
        installed appear (not held), those evicted go. Held entries and installs in flight are
        this agent's own: no other agent evicts or installs them. A full read asked for after
        the pass started stays asked for."""
        changed = {}
        for (kind, uri), row in swept.changes:
            try:
                changed[UriKey(UriKind(kind), uri)] = row
            except ValueError:  # a kind this agent does not know (a newer peer's)
                continue
        if swept.full:
            for key, entry in list(self._entries.items()):
                if key not in changed and entry.state is UriState.READY and not entry.held:
                    del self._entries[key]
        for key, row in changed.items():
            known = self._entries.get(key)
            if row is None:
                if known is not None and known.state is UriState.READY and not known.held:
                    del self._entries[key]
            elif known is None:
                self._adopt(key, row.size, row.last_used_ms)
        self._seen_gen = swept.gen if resets == self._resets else -1

    def halt(self) -> list[asyncio.Task[None]]:
        """No pass starts from now on; the tasks still to cancel (the store's close)."""
        self._halted = True
        tasks = [task for task in (self.periodic, self.running) if task is not None]
        self.periodic = None
        return tasks


def retrieve_exception(task: asyncio.Task[None]) -> None:
    """A background task's end: its exception retrieved (logged at debug), never left to the
    garbage collector's 'never retrieved' warning."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug(
            "%s ended with %s: %s",
            task.get_name(),
            type(exc).__name__,
            exc,
            extra={"task": task.get_name(), "error": type(exc).__name__},
        )
