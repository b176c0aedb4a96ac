"""The physical limits the agent is measured against, each run next to its measurement:
curl + unzip and a sequential aiohttp download + zipfile of the same package, python processes
spawned with no env machinery, and an exact LRU simulation of a trace."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import time
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from benchlib.figures import Measure
from benchlib.procs import SCRIPTS, BenchError

UNZIP = shutil.which("unzip")
CURL = shutil.which("curl")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def _run(argv: Sequence[str], timeout_s: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        code = await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise BenchError(f"{argv[0]} did not finish within {timeout_s}s") from None
    if code != 0:
        raise BenchError(f"{' '.join(argv)} exited with {code}")


async def aiohttp_zipfile(url: str, dest: Path, timeout_s: float) -> tuple[Measure, str]:
    """A sequential aiohttp download then ``zipfile.extractall``, in a child process (its own
    timing, interpreter start-up left out); return its measure and its split."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    argv = [sys.executable, "-m", "benchlib.fetch_baseline", "--url", url, "--dest", str(dest)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise BenchError(f"the aiohttp+zipfile baseline did not finish in {timeout_s}s") from None
    if proc.returncode != 0:
        raise BenchError(f"the aiohttp+zipfile baseline exited with {proc.returncode}")
    report = json.loads(out)
    m = Measure("aiohttp + zipfile", report["total_s"], 1, [report["total_s"]])
    m.cpu_s = report["cpu_s"]
    m.peak_rss_bytes = report["peak_rss_bytes"]
    m.extractions = 1
    split = f"download {report['download_s']:.2f}s + extract {report['extract_s']:.2f}s"
    return m, split


async def curl_unzip(url: str, dest: Path, timeout_s: float) -> tuple[Measure, str]:
    """``curl -o`` then ``unzip -q`` (or zipfile in a thread when unzip is absent, said so).
    Only called when curl is installed (``CURL``)."""
    assert CURL is not None
    await asyncio.to_thread(dest.mkdir, parents=True)
    archive = dest / "package.zip"
    cpu0 = _children_cpu()
    started = time.perf_counter()
    await _run([CURL, "-sS", "-o", str(archive), url], timeout_s)
    if UNZIP is not None:
        await _run([UNZIP, "-q", str(archive), "-d", str(dest / "unpacked")], timeout_s)
        name, note = "curl + unzip", ""
    else:
        await asyncio.to_thread(_extractall, archive, dest / "unpacked")
        name, note = "curl + zipfile", "unzip is not installed: zipfile.extractall used instead"
    wall = time.perf_counter() - started
    m = Measure(name, wall, 1, [wall])
    m.cpu_s = _children_cpu() - cpu0  # the two children, waited for; nothing else ended meanwhile
    m.extractions = 1
    return m, note


def _extractall(archive: Path, dest: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(dest)


async def bare_workers(
    count: int,
    concurrency: int,
    timeout_s: float,
    contexts: Sequence[tuple[dict[str, str], str]] = (),
    name: str = "bare python workers",
) -> Measure:
    """Start ``count`` worker processes (``python -m raylet_sim.worker``), ``concurrency`` at a
    time, with no env machinery: spawn, wait for its ready line, close its stdin, reap it.
    ``contexts``, if given: start i gets ``contexts[i]``'s variables and cwd (an env's context,
    as the agent gave it, but no agent and no pool)."""
    latencies: list[float] = []
    errors = 0
    issued = 0
    deadline = time.monotonic() + timeout_s

    async def one(i: int) -> None:
        nonlocal errors
        env, cwd = ({**os.environ, **contexts[i][0]}, contexts[i][1]) if contexts else (None, None)
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "raylet_sim.worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, env=env, cwd=cwd or None,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdin is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if json.loads(line).get("ready"):
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
        except (TimeoutError, ValueError):
            errors += 1
        finally:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def runner() -> None:
        nonlocal issued
        while issued < count and time.monotonic() < deadline:
            issued += 1
            await one(issued - 1)

    started = time.perf_counter()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    m = Measure(name, time.perf_counter() - started, len(latencies))
    m.latencies_s = latencies
    m.errors = errors
    return m


def lru_simulation(trace: Sequence[int], sizes: dict[int, int], budget: int) -> tuple[int, int]:
    """An exact LRU cache of ``budget`` bytes over ``trace``: (hits, evictions). A key is
    inserted on a miss; least recently used keys are evicted while the bytes exceed the budget."""
    cache: OrderedDict[int, None] = OrderedDict()
    held = hits = evictions = 0
    for key in trace:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        cache[key] = None
        held += sizes[key]
        while held > budget and cache:
            old, _ = cache.popitem(last=False)
            held -= sizes[old]
            evictions += 1
    return hits, evictions
