"""Disk in use under a set of folders, hardlink-aware, sampled while a workload runs.

``disk_bytes`` walks the folders (symlinks not followed) and sums the allocated bytes
(``st_blocks * 512``) of each inode once, wherever else it is linked from within the set: a venv
whose files are hard links into uv's cache costs nothing beyond the cache. Files that vanish
mid-walk are skipped. ``Sampler`` walks in a thread of its own every ``period_s`` and keeps the
peak; a walk of the set takes a fraction of a second (tens of thousands of entries), which is
CPU the measured processes share, the same for both agents.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path


def disk_bytes(roots: Iterable[Path]) -> int:
    """Allocated bytes of every file and folder under ``roots``, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(r) for r in roots]
    for _ in range(10_000_000):  # bounded: ten million entries is far beyond any set here
        if not stack:
            break
        top = stack.pop()
        try:
            st = os.lstat(top)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            total += st.st_blocks * 512
        try:
            entries = os.scandir(top)
        except (NotADirectoryError, OSError):
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    est = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = (est.st_dev, est.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += est.st_blocks * 512
    return total


def file_bytes(root: Path) -> tuple[int, int]:
    """(regular files, their allocated bytes, each inode once) under ``root``: what is left."""
    seen: set[tuple[int, int]] = set()
    files = total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return files, total


class Sampler:
    """``disk_bytes(roots())`` every ``period_s`` in a thread until ``stop()``: its peak, the
    number of samples and the longest walk. ``roots`` is called each time (folders appear)."""

    def __init__(self, roots: Iterable[Path], period_s: float = 0.5) -> None:
        self._roots = list(roots)
        self._period_s = period_s
        self._stop = threading.Event()
        self.peak = 0
        self.samples = 0
        self.longest_walk_s = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="disk-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def sample(self) -> int:
        t0 = time.monotonic()
        value = disk_bytes(self._roots)
        self.longest_walk_s = max(self.longest_walk_s, time.monotonic() - t0)
        self.peak = max(self.peak, value)
        self.samples += 1
        return value

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self._period_s)
        except BaseException as exc:  # reported by stop(): a sampler that died measured nothing
            self.error = exc

    def stop(self) -> int:
        """Stop, take one last sample, and return the peak."""
        self._stop.set()
        self._thread.join(timeout=120)
        if self.error is not None:
            raise RuntimeError(f"the disk sampler failed: {self.error!r}") from self.error
        self.sample()
        return self.peak
