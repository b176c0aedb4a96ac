"""Where a fetched package lands: its file, the thread hops that write it, and its digest.

Every blocking step of a download (opening its file, writing a chunk or a batch of pieces,
reading a chunk of a ``file://`` source) is one short hop to a thread, so the event loop never
waits on the disk; a hop the caller's cancellation interrupts still ends before the
cancellation goes on (``staging.through``), so a descriptor is closed only after the last
write to it, and nothing is written once the install is gone. The SHA-256 a URI pins is taken
in the same hops, on the bytes written: the file is never read back to be checked.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.core.errors import PackageRejected, echo
from agent.install.disk.staging import through

_T = TypeVar("_T")

# a download's pieces written by one writev at most (the kernel's IOV_MAX is 1024 on Linux):
# a server that sends its body a few bytes at a time makes many small pieces, not a long list
MAX_PIECES = 1024


async def hop(fn: Callable[..., _T], *args: object) -> _T:
    """Run one short blocking step in a thread. If the caller is cancelled meanwhile, the step
    still ends (it is one chunk) before the cancellation goes on (``through``): the descriptors
    it uses are closed only after it, and nothing is written once the install is gone."""
    return await through(asyncio.ensure_future(asyncio.to_thread(fn, *args)))


async def opening(open_: Callable[[], _T], *, fd: Callable[[_T], int]) -> _T:
    """``hop`` for a step that opens a descriptor (``fd`` finds it in the result): if the
    caller is cancelled meanwhile, the step ends and what it opened is closed, not leaked."""
    step = asyncio.ensure_future(asyncio.to_thread(open_))
    try:
        return await through(step)
    except asyncio.CancelledError:
        if not step.cancelled() and step.exception() is None:
            os.close(fd(step.result()))
        raise


def create_landing(dest: Path) -> int:
    """The download's file, empty, open for writing. Blocking (one hop). Truncated only if it
    holds bytes (a retry): ext4 forces out the blocks of a file truncated and rewritten when it
    is closed (``auto_da_alloc``), and that close, on the event loop, took 2-21 ms for 61 MB;
    the file the installer made empty is opened as it is, and its close is 0.01 ms."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_size:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Digest:
    """The SHA-256 of what was written so far, when the URI pins one: updated in the thread
    hop that writes each chunk (hashlib lets the GIL go on large buffers), so the file is
    never read back to be checked."""

    def __init__(self, wanted: bool) -> None:
        self._sha = hashlib.sha256() if wanted else None

    def update(self, data: bytes | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(data)

    def hex(self) -> str | None:
        return None if self._sha is None else self._sha.hexdigest()


def copy_chunk(src: int, out: int, size: int, label: str, digest: Digest) -> int:
    try:
        data = os.read(src, size)
    except OSError as exc:
        raise PackageRejected(
            f"{label}: reading it failed: {exc.strerror or echo(str(exc))}"
        ) from exc
    write_all(out, data, digest)
    return len(data)


def write_pieces(out: int, pieces: list[bytes], digest: Digest) -> None:
    """``pieces`` written in order with as few ``writev`` calls as the kernel allows."""
    for piece in pieces:
        digest.update(piece)
    views = [memoryview(p) for p in pieces]
    while views:
        done = os.writev(out, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def write_all(out: int, data: bytes | memoryview, digest: Digest) -> None:
    digest.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]
