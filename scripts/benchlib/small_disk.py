"""A small file system made for a workload (a sized tmpfs: the machine's /tmp of the seed user of
issue 39), and what is left on it: used bytes, venvs built only in part, log files naming ENOSPC.

``make_small_disk`` mounts a tmpfs (root only: ``mount -t tmpfs``) on a new short folder under
/tmp (Ray's socket paths live under the RAY_TMPDIRs put there); ``remove_small_disk``, called in
a ``finally``, stops the processes whose command line names it, each by its PID, then unmounts
it and removes the folder.
``resize`` sets its size (``mount -o remount,size=``): the workload fills it with what comes
before the clock, then sizes it to hold what it measures, and no more.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchlib.procs import BenchError
from benchlib.uv_full_oracle import saw_no_space

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the tests' harness (tests/harness/), pytest-free
    sys.path.append(str(REPO))
from tests.harness.uv_projects import kill_all, processes_naming  # noqa: E402

_UNMOUNT_S = 30.0  # a busy mount (a process still closing its files) is retried this long
_LOG_READ_BYTES = 4 * 2**20  # of each log file, the start read to find ENOSPC
# the logs a task's worker writes (its output, its core worker's log, its job's env setup)
_WORKER_LOGS = ("worker-", "python-core-worker-", "runtime_env_setup-")


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise BenchError(f"mount {' '.join(args)}: {done.stderr.strip()} (the workload needs root)")


def make_small_disk(size_bytes: int) -> Path:
    """A tmpfs of ``size_bytes`` mounted on a new folder under /tmp; ``remove_small_disk`` after."""
    mount = Path(tempfile.mkdtemp(prefix="uf", dir="/tmp"))
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(mount))
    except BaseException:
        mount.rmdir()
        raise
    return mount


def remove_small_disk(mount: Path) -> None:
    """Stop every process whose command line names ``mount`` (by PID), unmount it (a busy mount
    retried for a while, then detached, said so) and remove its folder."""
    deadline = time.monotonic() + _UNMOUNT_S
    for _ in range(1000):  # bounded by the deadline too
        kill_all(processes_naming(mount))
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if done.returncode != 0:  # detached: its memory comes back once its last users close
        print(f"umount {mount}: {done.stderr.strip()}; detached (umount -l)", file=sys.stderr)
        subprocess.run(["umount", "-l", str(mount)], timeout=60, check=False)
    with contextlib.suppress(OSError):
        mount.rmdir()


def resize(mount: Path, size_bytes: int) -> None:
    _mount("-o", f"remount,size={size_bytes}", str(mount))


def used_bytes(mount: Path) -> tuple[int, int]:
    """(used, size) bytes of the file system at ``mount``."""
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def venvs_in_part(roots: Sequence[Path], module: str, payload_bytes: int) -> list[str]:
    """The venvs (folders holding ``pyvenv.cfg``) under ``roots`` that lack a whole ``module``
    (its ``payload.bin`` of ``payload_bytes``) or Ray (``ray/__init__.py``): built in part."""
    found = []
    for root in roots:
        for folder, dirs, names in os.walk(root):
            if "pyvenv.cfg" not in names:
                continue
            dirs.clear()
            sites = list(Path(folder).glob("lib/python*/site-packages"))
            payload = [s / module / "payload.bin" for s in sites]
            whole = any(p.is_file() and p.stat().st_size == payload_bytes for p in payload)
            if not whole or not any((s / "ray" / "__init__.py").is_file() for s in sites):
                found.append(folder)
    return sorted(found)


def logs_naming_no_space(ray_tmps: Sequence[Path]) -> tuple[list[str], list[str]]:
    """(workers' log files, every other log file) under the Ray sessions of ``ray_tmps`` whose
    text names ENOSPC."""
    workers: list[str] = []
    others: list[str] = []
    for ray_tmp in ray_tmps:
        for path in sorted(ray_tmp.glob("ray/session_*/logs/**/*")):
            if path.is_symlink() or not path.is_file():
                continue
            with contextlib.suppress(OSError), path.open("rb") as f:
                if saw_no_space(f.read(_LOG_READ_BYTES).decode(errors="replace")):
                    named = f"{ray_tmp.name}/{path.name}"
                    (workers if path.name.startswith(_WORKER_LOGS) else others).append(named)
    return workers, others
