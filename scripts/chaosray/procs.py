"""A local Ray cluster's processes, found by its ``RAY_TMPDIR``, and what the runner kills.

Each cluster of the run has a short ``RAY_TMPDIR`` of its own; every process of its nodes names
it on its command line (its GCS and raylets by their session folder, the agents by their
``--session-dir``, ``--log-dir``), and its workers descend from its raylets. ``Roles`` is one
look at them, by role: the raylets, the GCS, each raylet's keeper (the process the raylet
starts, ``rtenv-agent ray-agent``) and the agent (the keeper's child), and the workers
(``ray::`` processes under a raylet). Reading /proc is blocking: call it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

AGENT_ARGS = (b"-m", b"agent", b"ray-agent")  # a keeper's and its agent's command line
WORKER_PREFIX = b"ray::"  # a worker's title (``ray::IDLE``, ``ray::<task>``, ``ray::<Actor>``)
# titles of the same form that are no worker but a node's own agent (its death ends the node)
NOT_WORKERS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[bytes, ...]

    @property
    def name(self) -> str:
        return os.path.basename(self.argv[0]).decode(errors="replace") if self.argv else ""

    @property
    def title(self) -> str:
        return b" ".join(self.argv)[:120].decode(errors="replace")


@dataclass
class Roles:
    """One look at a cluster's processes, by role."""

    raylets: list[Proc] = field(default_factory=list)
    gcs: list[Proc] = field(default_factory=list)
    keepers: list[Proc] = field(default_factory=list)  # each raylet's ``ray-agent`` process
    agents: list[Proc] = field(default_factory=list)  # each keeper's child: the agent
    workers: list[Proc] = field(default_factory=list)  # ``ray::`` processes under a raylet

    def busy_workers(self) -> list[Proc]:
        """Workers running something (not ``ray::IDLE``)."""
        return [w for w in self.workers if not w.argv[0].startswith(b"ray::IDLE")]

    def head(self) -> Proc | None:
        """The head node's raylet (``--head``; the only one of a one-node cluster)."""
        heads = [r for r in self.raylets if b"--head" in r.argv]
        return heads[0] if heads else (self.raylets[0] if len(self.raylets) == 1 else None)

    def keeper_of(self, raylet: int) -> Proc | None:
        return next((k for k in self.keepers if k.ppid == raylet), None)

    def agent_of(self, keeper: int) -> Proc | None:
        return next((a for a in self.agents if a.ppid == keeper), None)


def _read(pid: int) -> Proc | None:
    """The process ``pid`` (None if gone, or a zombie)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid, int(fields[1]), tuple(a for a in argv.split(b"\0") if a))


def all_procs() -> dict[int, Proc]:
    """Every live process but this one. Blocking."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            proc = _read(int(entry))
            if proc is not None:
                out[proc.pid] = proc
    return out


def _descends(proc: Proc, ancestors: set[int], procs: dict[int, Proc]) -> bool:
    seen = 0
    pid = proc.ppid
    while pid > 1 and seen < 64:  # bounded: a process tree is never that deep here
        if pid in ancestors:
            return True
        parent = procs.get(pid)
        if parent is None:
            return False
        pid = parent.ppid
        seen += 1
    return False


def roles(ray_tmp: Path, procs: dict[int, Proc] | None = None) -> Roles:
    """The processes of the cluster whose ``RAY_TMPDIR`` is ``ray_tmp``. Blocking."""
    procs = all_procs() if procs is None else procs
    needle = os.fsencode(str(ray_tmp))
    out = Roles()
    naming = [p for p in procs.values() if any(needle in a for a in p.argv)]
    out.raylets = [p for p in naming if p.name == "raylet"]
    out.gcs = [p for p in naming if p.name == "gcs_server"]
    raylets = {p.pid for p in out.raylets}
    ours = [p for p in naming if _has(p.argv, AGENT_ARGS)]
    out.keepers = [p for p in ours if p.ppid in raylets]
    keepers = {p.pid for p in out.keepers}
    out.agents = [p for p in ours if p.ppid in keepers]
    out.workers = [
        p
        for p in procs.values()
        if p.argv
        and p.argv[0].startswith(WORKER_PREFIX)
        and not p.argv[0].startswith(NOT_WORKERS)
        and _descends(p, raylets, procs)
    ]
    return out


def _has(argv: tuple[bytes, ...], run: tuple[bytes, ...]) -> bool:
    return any(argv[i : i + len(run)] == run for i in range(len(argv)))


def naming(path: Path) -> list[int]:
    """Live processes whose command line names ``path``. Blocking."""
    needle = os.fsencode(str(path))
    return sorted(p.pid for p in all_procs().values() if any(needle in a for a in p.argv))


def signal_pid(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid``; False if it was gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def alive(pid: int) -> bool:
    return _read(pid) is not None


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
