"""``serve``'s parent watch (``agent.ops.entry._watch_parent``), on real child processes: it
sets the stop event when the parent exits, and once ended (``_end``, as ``serve`` ends it) it
leaves no pidfd open and no reader on the loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from agent.ops.entry import _end, _watch_parent
from tests.harness.polling import wait_until
from tests.harness.processes import parent


def pidfds() -> set[int]:
    """This process's open pidfds."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[pidfd]":
                found.add(int(name))
        except FileNotFoundError:  # the listing's own fd, closed since
            continue
    return found


@dataclass
class Watch:
    proc: subprocess.Popen[bytes]  # the parent watched
    task: asyncio.Task[None]  # the watch
    stop: asyncio.Event  # what the watch sets when the parent exits
    fd: int  # the watch's pidfd
    before: set[int]  # the pidfds open before the watch began


@asynccontextmanager
async def watching() -> AsyncIterator[Watch]:
    """A parent, and a watch on it whose pidfd is open."""
    with parent() as proc:
        before = pidfds()
        stop = asyncio.Event()
        task = asyncio.create_task(_watch_parent(proc.pid, stop))
        await wait_until(lambda: bool(pidfds() - before), what="the watch's pidfd opened")
        (fd,) = pidfds() - before
        yield Watch(proc, task, stop, fd, before)


async def test_an_ended_watch_closes_its_pidfd_and_leaves_no_reader() -> None:
    async with watching() as w:
        await _end(w.task)
        assert w.task.cancelled()
        assert pidfds() == w.before, "the watch's pidfd is still open after serve ended it"
        assert not asyncio.get_running_loop().remove_reader(w.fd), "a reader was left on the loop"
        assert not w.stop.is_set()


async def test_the_parent_exiting_sets_stop_and_the_watch_cleans_up() -> None:
    async with watching() as w:
        w.proc.kill()
        await asyncio.wait_for(w.stop.wait(), 10)
        await _end(w.task)
        assert pidfds() == w.before
        assert not asyncio.get_running_loop().remove_reader(w.fd)
