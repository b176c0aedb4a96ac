"""Chaos mode, inside a worker: keep re-reading the files of its runtime env while it runs.

The claim under test is that no package is deleted or changed while a worker uses it. A worker
started with ``RAYLET_SIM_WATCH=<seconds>`` hashes every file under its cwd and its PYTHONPATH
entries at start, then re-hashes them every interval in a thread; a file that went missing or
changed is a violation, reported to the pool with the next reply and at exit.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

ENV_VAR = "RAYLET_SIM_WATCH"
_MAX_FILES = 10_000  # a watch is for packages, not for a whole file system


def _hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def snapshot(roots: Iterable[Path]) -> dict[Path, str | None]:
    files: dict[Path, str | None] = {}
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                if len(files) >= _MAX_FILES:
                    return files
                path = Path(dirpath) / name
                if "__pycache__" not in path.parts:
                    files[path] = _hash(path)
    return files


class Watcher:
    def __init__(self, roots: Iterable[Path], interval_s: float) -> None:
        self._baseline = snapshot(roots)
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._new: list[str] = []
        self._seen: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watch", daemon=True)

    @property
    def files(self) -> int:
        return len(self._baseline)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.check()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check()

    def check(self) -> None:
        for path, digest in self._baseline.items():
            if path in self._seen:
                continue
            now = _hash(path)
            if now != digest:
                what = "missing" if now is None else "changed"
                with self._lock:
                    self._seen.add(path)
                    self._new.append(f"pid {os.getpid()}: {path} is {what}")

    def take(self) -> list[str]:
        """Violations found since the last call."""
        with self._lock:
            new, self._new = self._new, []
        return new


def from_environment() -> Watcher | None:
    interval = os.environ.get(ENV_VAR)
    if not interval:
        return None
    roots = [Path.cwd()]
    roots += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return Watcher([r for r in dict.fromkeys(roots) if r.is_dir()], float(interval))
