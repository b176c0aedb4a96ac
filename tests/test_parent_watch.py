"""``serve``'s parent watch (``agent.ops.server._watch_parent``), on real child processes: it
sets the stop event when the parent exits, and once ended (``_end``, as ``serve`` ends it) it
leaves no pidfd open and no reader on the loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from agent.ops.server import _end, _watch_parent
from tests.helpers import wait_until


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


@contextmanager
def parent() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in parent process (killed and reaped at the end)."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


async def test_an_ended_watch_closes_its_pidfd_and_leaves_no_reader() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    with parent() as proc:
        before = pidfds()
        watch = asyncio.create_task(_watch_parent(proc.pid, stop))
        await wait_until(lambda: bool(pidfds() - before), what="the watch's pidfd opened")
        (fd,) = pidfds() - before
        await _end(watch)
        assert watch.cancelled()
        assert pidfds() == before, "the watch's pidfd is still open after serve ended it"
        assert not loop.remove_reader(fd), "a reader was left on the loop"
        assert not stop.is_set()


async def test_the_parent_exiting_sets_stop_and_the_watch_cleans_up() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    with parent() as proc:
        before = pidfds()
        watch = asyncio.create_task(_watch_parent(proc.pid, stop))
        await wait_until(lambda: bool(pidfds() - before), what="the watch's pidfd opened")
        (fd,) = pidfds() - before
        proc.kill()
        await asyncio.wait_for(stop.wait(), 10)
        await _end(watch)
        assert pidfds() == before
        assert not loop.remove_reader(fd)
