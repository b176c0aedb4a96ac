"""The unpack pool under test: a pool of a given size, a zip slow enough to unpack that work can
overlap it, a snapshot of an unpacked tree, where a download's read-ahead tail begins."""

from __future__ import annotations

import io
import os
import random
import stat
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from agent.install.unpack.overlap import directory_start, tail_span
from agent.install.unpack.pool import UnpackPool


def slow_zip(files: int = 3000, text_mb: int = 8) -> bytes:
    """A zip that takes a worker a good fraction of a second: many small files and a large
    compressible one, under one top folder."""
    rng = random.Random(7)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for n in range(files):
            zf.writestr(f"proj/p{n // 100}/m{n}.py", f"X = {n}\n".encode() * 40)
        zf.writestr("proj/data/table.txt", rng.randbytes(text_mb * 2**20).hex().encode())
        run = zipfile.ZipInfo("proj/bin/run")
        run.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(run, "#!/bin/sh\n")
        zf.writestr("proj/empty/", "")
    return buf.getvalue()


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every path under ``root``: its mode and its content (a link: its target)."""
    found: dict[str, tuple[int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            found[str(path.relative_to(root))] = (0, os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            found[str(path.relative_to(root))] = (stat.S_IMODE(st.st_mode), b"")
        else:
            found[str(path.relative_to(root))] = (stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


@asynccontextmanager
async def pool_of(size: int, split_bytes: int = 1) -> AsyncIterator[UnpackPool]:
    pool = UnpackPool(size, split_bytes=split_bytes)
    pool.start()
    try:
        yield pool
    finally:
        await pool.close()


def tail_offset_of(data: bytes) -> int:
    """Where the tail the agent reads ahead of a download of ``data`` begins: its first ranged
    GET, or the central directory's start if that lies before it."""
    offset = tail_span(len(data))
    start = directory_start(data[offset:], offset)
    assert start is not None
    return min(offset, start)
