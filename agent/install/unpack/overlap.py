"""Extraction that runs while its download does: ``EarlyExtraction``.

A zip's central directory comes last, so an extraction that waits for it waits for the whole
download. Over http(s), a large package's tail (its central directory and end record) is read
first with a ranged GET while the whole download goes on; the unpack pool's workers then plan
the archive from that tail, with every check the central directory allows, the disk reserved
for what it declares, before a byte is written, and write each entry as soon as its bytes are
in the file (``growing.GrowingZip``). A large entry is inflated as it arrives.

What makes it safe: once the download is complete (and its ``#sha256=`` checked, when the URI
pins one), the file's own bytes at the tail's place are compared with the tail the workers
planned from; only if they are the same is the extraction kept. Every entry was checked against
its CRC-32 as it was written, and its place and size are the directory's. Otherwise (another
object answered the ranged GET), or when the download was retried (a retry writes the file anew
from its start), the early extraction is stopped, waited for and thrown away, and the package
is extracted from the complete file as it would have been without this.

When it is not tried: a package under ``OVERLAP_MIN_BYTES`` (a ranged GET costs a round trip
and the saving is small), a server whose answer does not say ``Accept-Ranges: bytes`` (one that
ignores ranges would send the whole package a second time), or one that answers the
ranged GET with anything but exactly the bytes asked for, of an object of the same size (and
the same ETag or Last-Modified, sent as ``If-Range``), or a central directory of more than
``MAX_DIRECTORY_BYTES`` (the tail is held in memory, by the agent and by each worker of the
job: at most 1 MiB read first, then the rest of the directory). Then the download is as before.

The tail the workers plan from is cut to the central directory and the end record and written
beside the download (``package.tail``, in a thread hop); their tasks name that file, so a task's
message stays small on the event loop (sent in it, the 1 MiB tail was the install's longest
loop step, 5.1 ms of CPU).

Pure helpers (``directory_start``, ``if_range``, ``tail_span``) and a thin async shell, used
from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.install.disk.root import unpack_reservation
from agent.install.disk.staging import through
from agent.install.fetch.base import Space
from agent.install.fetch.fetcher import Fetcher
from agent.install.unpack.plan import ArchiveLimits
from agent.install.unpack.pool import UnpackPool

log = logging.getLogger(__name__)

OVERLAP_MIN_BYTES = 4 * 1024 * 1024  # smaller packages are downloaded, then extracted
MAX_DIRECTORY_BYTES = 8 * 1024 * 1024  # a larger directory (~80,000 entries) waits for the file
_MIN_TAIL = 22 + 0xFFFF  # the end record with the longest comment it may carry
_MAX_TAIL = 1024 * 1024  # the first ranged GET: the directory of ~10,000 entries fits
_TAIL_FILE = "package.tail"  # beside the download: the directory the workers plan from
_END = struct.Struct("<4s4H2LH")  # the end of central directory record
_END_MAGIC = b"PK\x05\x06"
_LOCATOR = struct.Struct("<4sLQL")  # the zip64 end record's locator, just before the end
_LOCATOR_MAGIC = b"PK\x06\x07"
_END64 = struct.Struct("<4sQ2H2L4Q")  # the zip64 end of central directory record
_END64_MAGIC = b"PK\x06\x06"


def tail_span(size: int) -> int:
    """Where the first ranged GET of a ``size``-byte archive starts: a sixteenth of it, at
    least the longest end record, at most ``_MAX_TAIL``. Pure."""
    return max(size - max(min(size // 16, _MAX_TAIL), _MIN_TAIL), 0)


def directory_start(tail: bytes, tail_offset: int) -> int | None:
    """Where the archive's central directory begins, from its ``tail`` (the archive's bytes
    from ``tail_offset`` to its end): the place ``zipfile`` reads it from, found as it finds
    it (the last end record; a zip64 one through its locator). None if the tail holds no end
    record, or its figures make no sense. Pure."""
    at = tail.rfind(_END_MAGIC, max(len(tail) - _MIN_TAIL, 0))
    if at < 0 or at + _END.size > len(tail):
        return None
    directory_size = _END.unpack_from(tail, at)[5]
    start = tail_offset + at - directory_size
    locator = at - _LOCATOR.size
    if locator < 0 and tail_offset > 0:
        return None  # a zip64 locator may lie before the tail: the record's figures are unsure
    if locator >= 0 and tail[locator : locator + 4] == _LOCATOR_MAGIC:  # zip64
        record = locator - _END64.size
        if record < 0 or tail[record : record + 4] != _END64_MAGIC:
            return None  # its record lies before the tail: not worth a third GET
        directory_size = _END64.unpack_from(tail, record)[8]
        start = tail_offset + record - directory_size
    return start if start >= 0 else None


def if_range(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``If-Range`` validator of the whole's answer (a strong ETag, else Last-Modified),
    so that a ranged GET of a changed object answers 200 and is not used. Pure."""
    etag = headers.get("ETag", "")
    if etag and not etag.startswith("W/"):
        return {"If-Range": etag}
    modified = headers.get("Last-Modified", "")
    return {"If-Range": modified} if modified else {}


class EarlyExtraction:
    """One install's extraction that may start before its download ends: the fetcher's
    ``DownloadWatch``. ``outcome`` says, once the download is complete, whether it was made
    and kept (its bytes written) or not (None: extract the complete file)."""

    def __init__(
        self,
        fetcher: Fetcher,
        pool: UnpackPool,
        url: str,
        archive: Path,
        dest: Path,
        *,
        strip_top_level: bool,
        limits: ArchiveLimits,
        label: str,
        space: Space,
    ) -> None:
        self._fetcher = fetcher
        self._pool = pool
        self._url = url
        self._archive = archive
        self.dest = dest
        self._strip = strip_top_level
        self._limits = limits
        self._label = label
        self._space = space
        self._attempts = 0
        self._task: asyncio.Task[int | None] | None = None
        self._tail: tuple[int, bytes] | None = None  # where the workers' tail starts, and it
        self._decided: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.started = False  # workers were given the archive: ``dest`` may hold a tree

    # -- the fetcher's watch -----------------------------------------------------------------
    def opened(self, size: int | None, headers: Mapping[str, str]) -> None:
        self._attempts += 1
        if self._attempts > 1:  # a retry: the file is written anew, the early bytes are gone
            if self._task is not None:
                self._task.cancel()
            return
        if size is None or size < OVERLAP_MIN_BYTES:
            return
        if headers.get("Accept-Ranges", "").strip().lower() != "bytes":
            return  # a server that does not say it serves ranges would send the whole again
        self._task = asyncio.ensure_future(self._run(size, if_range(headers)))

    # -- the install's side ------------------------------------------------------------------
    async def outcome(self) -> int | None:
        """After the download is complete: the early extraction's bytes written, if it ran and
        the file's tail is the one it planned from; None if it did not run or is thrown away
        (stopped and waited for first). Its error, if it failed on the same bytes, is raised:
        the extraction of the complete file would fail alike. Cancelled, the extraction is
        stopped and waited for before the cancellation goes on."""
        task = self._task
        if task is None:
            return None
        try:
            if self._attempts > 1:  # retried: what the workers read may be another attempt's
                await self.abandon()
                return None
            either: list[asyncio.Future[Any]] = [task, self._decided]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if self._tail is not None:
                offset, tail = self._tail
                same = asyncio.to_thread(_holds, self._archive, offset, tail)
                if not await through(asyncio.ensure_future(same)):
                    log.warning(
                        "%s: the ranged GET's tail differs from the downloaded file's; "
                        "extracting the file again",
                        self._label,
                        extra={"uri": self._label},
                    )
                    await self.abandon()
                    return None
            return await through(task, on_cancel=lambda: _stop(task))
        except BaseException:
            await self.abandon()
            raise

    async def abandon(self) -> None:
        """Stop the early extraction, if any, and wait for its workers (a cancellation of the
        caller meanwhile waits on: the staging folder is removed after them)."""
        task = self._task
        if task is None:
            return
        task.cancel()
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the download's failure is what goes on

    async def _run(self, size: int, validator: dict[str, str]) -> int | None:
        try:
            return await self._extract(size, validator)
        finally:
            if not self._decided.done():
                self._decided.set_result(None)

    async def _extract(self, size: int, validator: dict[str, str]) -> int | None:
        offset = tail_span(size)
        tail = await self._fetcher.read_range(self._url, offset, size, size, validator)
        if tail is None:
            return None
        start = directory_start(tail, offset)
        if start is None:
            return None
        if start < offset:  # the directory begins before the tail: one more ranged GET
            if offset - start > MAX_DIRECTORY_BYTES:
                return None
            head = await self._fetcher.read_range(self._url, start, offset, size, validator)
            if head is None:
                return None
            offset, tail = start, head + tail
        if start > offset:  # only the directory and the end: the entries' bytes come with the file
            tail, offset = tail[start - offset :], start
        tail_file = self._archive.with_name(_TAIL_FILE)
        write = asyncio.ensure_future(asyncio.to_thread(_write_private, tail_file, tail))
        await through(write)  # a hop: the tasks' messages name it, and stay small on the loop
        self._tail = (offset, tail)
        self.started = True
        self._decided.set_result(None)  # the tail the workers plan from is known
        limits = self._limits

        async def reserve(declared: int) -> None:  # besides what the download declared
            await self._space.add(unpack_reservation(declared, size, limits))

        return await self._pool.extract(
            self._archive,
            self.dest,
            archive_bytes=size,
            strip_top_level=self._strip,
            limits=limits,
            label=self._label,
            reserve=reserve,
            growing=(size, offset, str(tail_file)),
        )


def _stop(task: asyncio.Task[int | None]) -> None:
    task.cancel()


def _write_private(path: Path, data: bytes) -> None:
    """``data`` in a new file at ``path``, 0600 (in the install's 0700 staging folder). Blocking."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _holds(path: Path, offset: int, expected: bytes) -> bool:
    """Whether the file holds ``expected`` at ``offset`` and ends there. Blocking."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != offset + len(expected):
            return False
        return os.pread(f.fileno(), len(expected), offset) == expected
