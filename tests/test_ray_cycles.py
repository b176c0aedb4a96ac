"""Local clusters end cleanly: one driver process (``tests/harness/ray_cycles.py``, real Ray, this
agent swapped in by ``agent.ray.install()``) starts and ends a local cluster 8 times on one
shared root (RTENV_ROOT); Ray's raylet ends each agent with SIGKILL of the process it started.
Nothing of any of those agents stays: no socket or link in the root, no ``rtenv-*`` socket folder
under Ray's temp dir, no holder (row, lock file or socket note), no staging or trash folder;
only the index and the package folders."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.agent_process import REPO
from tests.harness.ray_nodes import base_environ, poll
from tests.harness.tempdirs import ray_tempdir

pytestmark = pytest.mark.timeout(600)

CYCLES = 8  # each leaked its socket before the fix; 20 took 6 of CI's minutes under load
DRIVER = REPO / "tests" / "harness" / "ray_cycles.py"
DRIVER_S = 480.0
INDEX = {"state.db", "state.db-wal", "state.db-shm", "agent.lock"}  # the root's own files
FOLDERS = {"uris", "tmp", "trash", "holders", "logs", "wheels"}  # what may stay, empty or not


def leftovers(root: Path, temp_dir: Path) -> list[str]:
    """What of an agent is left: sockets and links in the root, any other file there, holder
    files, folders under tmp/ and trash/, the holders table's rows, socket folders under Ray's
    temp dir. Package folders (uris/) and the wheel cache are the root's, not an agent's."""
    found = []
    for name in sorted(os.listdir(root)):
        path = root / name
        if path.is_symlink() or (name not in INDEX and name not in FOLDERS):
            found.append(name)
    for sub in ("holders", "tmp", "trash"):
        if (root / sub).is_dir():
            found += [f"{sub}/{n}" for n in sorted(os.listdir(root / sub))]
    con = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        found += [
            f"holder row {h} (pid {p})" for h, p in con.execute("SELECT id, pid FROM holders")
        ]
    finally:
        con.close()
    found += [f"temp dir: {n}" for n in sorted(os.listdir(temp_dir)) if n.startswith("rtenv-")]
    return found


def test_eight_local_clusters_leave_no_socket_or_holder_in_the_shared_root() -> None:
    base = ray_tempdir()  # Ray's socket paths live under it: short
    root, temp_dir = base / "root", base / "ray"
    temp_dir.mkdir()
    env = base_environ(RTENV_ROOT=str(root), PYTHONPATH=str(REPO))
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(CYCLES), str(temp_dir)], env=env, cwd=base,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=DRIVER_S)
        assert proc.returncode == 0, err[-4000:]
        [line] = [x for x in out.splitlines() if x.startswith("RESULT ")]
        seconds = json.loads(line.removeprefix("RESULT "))["seconds"]
        assert len(seconds) == CYCLES
        last: list[str] = []

        def clean() -> bool | None:
            nonlocal last
            last = leftovers(root, temp_dir)
            return True if not last else None

        try:
            poll(clean, 30, "no agent's file left in the root")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; left: {last}") from None
        print(f"{CYCLES} cycles in {time.monotonic() - started:.1f}s: {seconds}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the driver's session left running
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
