"""The store's deletions, each in a thread of its own: the packages evicted into the trash, the
staging an install left, what a transaction set aside. Waited for by ``settle``, ``drain`` and
the store's close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.install.disk.root import remove_all
from agent.state.passes import retrieve_exception


class Deletions:
    """Deletions in flight, in threads."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()  # each removed from here once done

    def delete(self, paths: list[Path], *, trash: bool = True) -> None:
        """Delete ``paths`` in a thread. ``trash``: evicted packages (a crash point for tests);
        otherwise staging left by an install."""
        if not paths:
            return
        task = asyncio.create_task(asyncio.to_thread(remove_all, paths, trash), name="delete")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(retrieve_exception)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The deletions in flight."""
        return list(self._tasks)

    async def wait(self) -> None:
        """Wait for the deletions in flight now (not those they start)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Wait until no deletion is in flight."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
