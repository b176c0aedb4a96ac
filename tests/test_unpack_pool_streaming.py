"""The unpack pool's streaming tasks (archives still being downloaded), with real workers: one
waiting on its bytes makes the pool start another process for an ordinary task, and ordinary
tasks still run at most ``size`` at once however many processes the pool holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.install.unpack.plan import ArchiveLimits
from tests.harness.packages import workdir_zip
from tests.harness.polling import wait_until
from tests.harness.unpacking import pool_of, slow_zip, tail_offset_of

LIMITS = ArchiveLimits()


async def test_a_task_waiting_on_a_download_makes_room_for_an_ordinary_one(
    tmp_path: Path,
) -> None:
    data = slow_zip(files=50, text_mb=1)
    offset = tail_offset_of(data)
    growing = tmp_path / "growing.zip"
    growing.write_bytes(data[: len(data) // 3])  # the rest has not arrived yet
    small = tmp_path / "small.zip"
    small.write_bytes(workdir_zip({"main.py": "OK = 1\n"}))
    async with pool_of(1, split_bytes=2**40) as pool:

        def extract(archive: Path, dest: str, **more: Any) -> asyncio.Future[int]:
            size = more.pop("size", archive.stat().st_size)
            job = pool.extract(
                archive, tmp_path / dest, archive_bytes=size, strip_top_level=True,
                limits=LIMITS, label=dest, **more,
            )  # fmt: skip
            return asyncio.ensure_future(job)

        tail_file = tmp_path / "package.tail"
        tail_file.write_bytes(data[offset:])
        tail = (len(data), offset, str(tail_file))
        streaming = extract(growing, "early", size=len(data), growing=tail)
        await wait_until(lambda: pool.busy == 1, what="the streaming task sent")
        written = await asyncio.wait_for(extract(small, "small"), 30)
        assert written == len("OK = 1\n")
        assert len(pool.pids) == 2  # one more process, for the ordinary task
        assert not streaming.done()
        with growing.open("ab") as rest:  # the download completes
            rest.write(data[len(data) // 3 :])
        await asyncio.wait_for(streaming, 30)
        assert (tmp_path / "early" / "bin" / "run").exists()

        # two processes now, but ordinary tasks still one at a time (size 1)
        planned = asyncio.Event()
        go = asyncio.Event()

        async def held(declared: int) -> None:
            planned.set()
            await go.wait()

        first = extract(small, "a", reserve=held)
        await asyncio.wait_for(planned.wait(), 30)
        second = extract(small, "b")
        # it waits in the queue (dispatched at once, it would never be seen there)
        await wait_until(lambda: len(pool._queue) == 1, what="the second task queued")
        assert pool.busy == 1
        assert not (tmp_path / "b").exists()
        go.set()
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        assert (tmp_path / "b" / "main.py").read_text() == "OK = 1\n"


def test_a_worker_imports_no_asyncio() -> None:
    """A worker started for a task queued behind a download starts in a fraction of the agent's
    time: asyncio (half its imports' time) is not among them."""
    code = "import sys, agent.install.unpack.worker; print('asyncio' in sys.modules)"
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": root}, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr
