"""Processes as /proc shows them: gone or alive, agents and raylet-sim workers, found by their
command line or cwd; polling for one; a stand-in parent process; a script run in a session of
its own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def poll(probe: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Call ``probe`` until it returns something other than None, within a deadline."""
    deadline = time.monotonic() + timeout_s
    for _ in range(100_000):
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def run_in_session(command: list[str], cwd: Path, timeout_s: float, what: str) -> tuple[int, str]:
    """``command`` in a session of its own, its output (stderr with stdout); on a timeout its
    whole process group is SIGKILLed and the test fails, quoting its output's end."""
    proc = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not finish in {timeout_s}s:\n{out[-4000:]}") from None
    return proc.returncode, out


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None if it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    stat = proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def live_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and not gone(int(name))]


def rss_bytes(pids: Iterable[int]) -> int:
    """The resident memory of ``pids``, summed (VmRSS; one gone meanwhile counts 0). Pages they
    share count in each: an upper bound of the memory they use together."""
    total = 0
    for pid in pids:
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def is_agent(pid: int) -> bool:
    args = cmdline(pid)
    return "agent" in args and "serve" in args


def is_worker(pid: int) -> bool:
    return any("raylet_sim.worker" in arg for arg in cmdline(pid))  # its bootstrap names it


def workers_in(directory: Path) -> list[int]:
    """Live worker processes whose cwd is under ``directory`` (the demo's packages)."""
    found = []
    for pid in live_pids():
        with suppress(OSError):
            if is_worker(pid) and os.readlink(f"/proc/{pid}/cwd").startswith(str(directory)):
                found.append(pid)
    return found


@contextmanager
def parent() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in parent process (killed and reaped at the end)."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
