"""A zip still being downloaded, as the unpack workers read it: ``GrowingZip``.

An extraction that overlaps its download (``overlap.py``) has the archive's tail, the central
directory and the end record, in hand before the body has arrived: the agent read it with a
ranged GET. A worker opens ``zipfile.ZipFile`` on a ``GrowingZip``, a read-only file of the
archive's full ``size`` whose bytes come from two places:

- ``[tail_offset, size)``: the tail, from memory (the agent checks, once the download is
  complete, that the file holds the same bytes there; if not, the extraction is thrown away);
- ``[0, tail_offset)``: the download's file, which grows as the body arrives (written in order,
  from its start). A read waits until the file holds every byte it asks for, polling its size
  (``fstat``) with a short backoff, and ends with ``Stopped`` as soon as ``halted()`` says the
  extraction must stop (the download failed or was cancelled, the install is gone, the agent
  died): a read never returns fewer bytes than asked for but at the archive's end.

Synchronous, one reader at a time (``zipfile`` reads through its own lock); no thread, no
asyncio. The worker plans, checks and writes exactly as it does on a complete file: every
check is made on the central directory (the tail) before a byte is written.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable

from agent.install.unpack.stop import Stopped

# what a task names: the archive's size, where its known tail starts, the file holding the tail
# (written by the agent beside the download: a task's message stays small on the event loop)
Growing = tuple[int, int, str]

_FIRST_WAIT_S = 0.0005  # the first pause when bytes are missing; doubled up to the next
_MAX_WAIT_S = 0.004  # a chunk of the download lands every few ms on a fast link


class GrowingZip(io.RawIOBase):
    """The archive ``path`` of ``size`` bytes, of which ``tail`` (from ``tail_offset`` on) is
    known and the rest arrives in the file from its start."""

    def __init__(
        self, path: str, size: int, tail_offset: int, tail: bytes, halted: Callable[[], bool]
    ) -> None:
        super().__init__()
        if not 0 <= tail_offset <= size or len(tail) != size - tail_offset:
            raise ValueError(
                f"a tail of {len(tail)} bytes at {tail_offset} does not end a {size}-byte archive"
            )
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        self._size = size
        self._tail_offset = tail_offset
        self._tail = tail
        self._halted = halted
        self._pos = 0
        self._have = 0  # bytes of the file known to be there (the file only grows)
        self.waits = 0  # pauses taken for bytes not there yet (a figure for tests)

    # -- the file's interface, as zipfile uses it --------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            pos = offset
        elif whence == os.SEEK_CUR:
            pos = self._pos + offset
        elif whence == os.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"whence {whence} is not a seek mode")
        if pos < 0:
            raise OSError(22, "seek before the archive's start")  # as a real file says
        self._pos = pos
        return pos

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._pos + size, self._size)
        data = self.pread(max(end - self._pos, 0), self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a growing archive is read through pread, not its fd")

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()

    # -- reading -----------------------------------------------------------------------------
    def pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer only past the archive's end), once they are
        there."""
        end = min(offset + size, self._size)
        if end <= offset:
            return b""
        split = min(max(offset, self._tail_offset), end)  # [offset, split) from the file
        head = self._from_file(offset, split) if split > offset else b""
        if split == end:
            return head
        return head + self._tail[split - self._tail_offset : end - self._tail_offset]

    def _from_file(self, start: int, end: int) -> bytes:
        self._wait_for(end)
        parts: list[bytes] = []
        while start < end:
            got = os.pread(self._fd, end - start, start)
            if not got:  # the file was cut short (a retried download starts anew): wait again
                self._have = 0
                self._wait_for(end)
                continue
            parts.append(got)
            start += len(got)
        return b"".join(parts)

    def _wait_for(self, end: int) -> None:
        pause = _FIRST_WAIT_S
        while self._have < end:
            self._have = os.fstat(self._fd).st_size
            if self._have >= end:
                return
            if self._halted():
                raise Stopped
            self.waits += 1
            time.sleep(pause)
            pause = min(pause * 2, _MAX_WAIT_S)
