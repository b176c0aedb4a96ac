"""CPU seconds of the processes of many local Ray clusters, by role, sampled from /proc.

A ``CpuSampler`` walks /proc every ``period_s`` in a thread of its own and, for each process
whose command line names one of its places (an experiment's ``RAY_TMPDIR``: its GCS, raylet,
agent and workers carry their session's paths; the agent's root: the agent's own builds),
keeps the last user + system seconds it read (its own, not its children's: a raylet's waited-
for children are counted once, as themselves), under the role its command line last showed (a
worker's setup that execs ``uv run``: its CPU before the exec goes to ``worker-uv`` too). A
process that ends between two samples loses what it ran since the last one (at most
``period_s`` of CPU). ``role`` names what a process is from its command line: pure.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")
ROLES = ("gcs", "raylet", "worker", "worker-uv", "agent", "other")


def role(argv: Sequence[str]) -> str:
    """What a Ray cluster's process is, from its command line."""
    if not argv:
        return "other"
    program = os.path.basename(argv[0])
    if program == "gcs_server":
        return "gcs"
    if program == "raylet":
        return "raylet"
    worker = any(a.endswith("default_worker.py") for a in argv)
    if program == "uv":
        return "worker-uv" if worker else "agent"  # a worker's uv run; the agent's own build
    if program == "ray::RuntimeEnvAgent":  # Ray's agent, titled
        return "agent"
    if program.startswith("ray::") and not program.endswith("Agent"):  # ray::IDLE, ray::task
        return "worker"
    if worker:
        return "worker"
    if "ray-agent" in argv or any(a.endswith("runtime_env/agent/main.py") for a in argv):
        return "agent"
    return "other"  # the dashboard and its agent (ray::DashboardAgent), monitors


@dataclass(frozen=True)
class Proc:
    pid: int
    place: str  # the place's label its command line names
    role: str
    cpu_s: float  # user + system, its own, at its last sample


class CpuSampler:
    """The processes naming ``places`` (label -> folder), sampled until ``stop()``."""

    def __init__(self, places: Mapping[str, Path], period_s: float = 0.5) -> None:
        self._needles = [(label, os.fsencode(str(p)) + b"/") for label, p in places.items()]
        self._needles += [(label, os.fsencode(str(p)) + b"\0") for label, p in places.items()]
        self._period_s = period_s
        self._stop = threading.Event()
        self._seen: dict[tuple[int, int], Proc] = {}  # (pid, start time) -> its last sample
        self._argv: dict[tuple[int, int], tuple[str, str] | None] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                self._one(int(entry.name))

    def _one(self, pid: int, depth: int = 0) -> tuple[str, str] | None:
        """Sample ``pid``; its (place, role), None when it is no cluster's."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        ident = (pid, int(fields[19]))  # starttime: a reused pid is another process
        if ident not in self._argv:
            parent = self._one(int(fields[1]), depth + 1) if depth < 32 else None
            self._argv[ident] = self._classify(pid, parent)
        known = self._argv[ident]
        if known is not None and depth == 0:
            # its role as its command line says now: a worker's setup (``setup_worker.py``)
            # execs ``uv run`` under Ray's uv-run hook, the same process
            now = self._classify(pid, known) or known
            cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
            self._seen[ident] = Proc(pid, known[0], now[1], cpu)
        return known

    def _classify(self, pid: int, parent: tuple[str, str] | None) -> tuple[str, str] | None:
        """Its place: the one its command line names, else its parent's (a worker renames
        itself ``ray::...``, its raylet names the place)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read() + b"\0"
        except OSError:
            return None
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if not argv:  # a zombie, or one exiting: no command line to tell (its last role stays)
            return None
        for label, needle in self._needles:
            if needle in raw:
                return label, role(argv)
        return None if parent is None else (parent[0], role(argv))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self._period_s)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> list[Proc]:
        """Stop, sample once more, and return every process seen."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the CPU sampler failed: {self.error!r}") from self.error
        self.sample()
        return list(self._seen.values())


def by_role(procs: Sequence[Proc]) -> dict[str, float]:
    """CPU seconds summed per role (every role present, 0 when none)."""
    out = dict.fromkeys(ROLES, 0.0)
    for p in procs:
        out[p.role] += p.cpu_s
    return out
