"""``rtenv-agent ray stop [--temp-dir DIR | --address HOST:PORT]``: stop the Ray nodes of one temp
dir (default: the one ``ray start`` uses, ``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray``, else
``/tmp/ray``) or of one GCS address on this machine, and no other. Ray's own ``ray stop`` stops
every Ray process of the machine, found by name.

The node's processes are chosen from ``/proc`` by the sessions their command lines name
(``agent.launcher.node_procs``), each held by a pidfd opened at once (its start time checked, so a
PID reused meanwhile is never signalled). They are stopped in Ray's order (raylets, the rest,
GCS servers), each step SIGTERM, a wait of a third of ``--grace-period`` (Ray's default, 16 s,
and Ray's split), then SIGKILL for what is left (Ray's monitor.py was seen ignoring SIGTERM for
over 20 s), then a wait until each is gone (a zombie is gone). ``/proc`` is read again
afterwards, at most ``ROUNDS`` times, for processes the node started meanwhile. The report is a
line per process and a count; ``ray_current_cluster`` in the temp dir (Ray's note of the last
cluster started there, read by ``ray.init()``) is removed when it names a stopped cluster.

Exit codes: 0 every process stopped; 1 some could not be (another user's, or still alive after
SIGKILL); 2 a command-line mistake (one line); 3 no process of such a node runs.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import os
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.errors import echo
from agent.core.units import human_duration, parse_duration, plural
from agent.launcher import node_procs
from agent.launcher.node_procs import Chosen, Proc, Scope
from agent.ops.ray_swap import ray_temp_dir
from agent.ops.usage import OneLineParser, WrapAtSpaces

PROG = "rtenv-agent ray stop"
GRACE_S = 16.0  # Ray's ray stop --grace-period default, split between the three steps as Ray's
MAX_GRACE_S = 3600.0
KILL_WAIT_S = 10.0  # for a SIGKILLed process to be gone (one in a disk wait may take a while)
ROUNDS = 3  # reads of /proc: processes the node started while it was being stopped go too
CMDLINE_BYTES = 2 * 1024 * 1024  # of a /proc/PID/cmdline read (the kernel's ARG_MAX)
ADDRESS_CHARS = 300  # a GCS address is HOST:PORT; longer is a mistake
STOPPED, FAILED, NOTHING = 0, 1, 3  # exit codes (2: a command-line mistake, argparse's)
CURRENT_CLUSTER = "ray_current_cluster"  # Ray's note, in the temp dir, of its last cluster


class Outcome(enum.Enum):
    """How one process ended."""

    GONE = "ended before its turn"
    TERMINATED = "stopped (SIGTERM)"
    KILLED = "killed (SIGKILL after the grace period)"
    FORCED = "killed (SIGKILL, --force)"
    REFUSED = "NOT stopped: not permitted to signal it (another user's?)"
    ALIVE = "NOT stopped: still alive after SIGKILL"


NOT_STOPPED = (Outcome.REFUSED, Outcome.ALIVE)


@dataclass(eq=False)
class Held:
    """A chosen process, held by a pidfd (None: it was gone before one could be opened)."""

    proc: Proc
    fd: int | None
    outcome: Outcome | None = None

    def signal(self, sig: int) -> bool:
        """Send ``sig``; False when it is gone or may not be signalled (outcome then set)."""
        if self.fd is None:
            self.outcome = Outcome.GONE
            return False
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            self.outcome = Outcome.GONE
            return False
        except PermissionError:
            self.outcome = Outcome.REFUSED
            return False
        return True


@dataclass
class Report:
    """What a stop did, for its lines and exit code."""

    scope_said: str
    chosen: list[Chosen] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)

    def failed(self) -> list[Held]:
        return [h for h in self.held if h.outcome in NOT_STOPPED]

    def lines(self) -> list[str]:
        sessions = sorted({s for c in self.chosen for s in c.sessions})
        named = ", ".join(os.path.basename(s) for s in sessions) or "no session"
        out = [f"{PROG}: {self.scope_said} ({named}): {_processes(len(self.held))}"]
        out += [f"  {h.proc.pid} {node_procs.label(h.proc.argv)}: {_said(h)}" for h in self.held]
        killed = sum(h.outcome in (Outcome.KILLED, Outcome.FORCED) for h in self.held)
        done = f"stopped {_processes(len(self.held) - len(self.failed()))}"
        done += f" ({killed} with SIGKILL)" if killed else ""
        done += f"; {len(self.failed())} NOT stopped" if self.failed() else ""
        return [*out, f"{PROG}: {done}"]

    def code(self) -> int:
        return FAILED if self.failed() else STOPPED


def _processes(count: int) -> str:
    return plural(count, "process", "processes")


def _said(held: Held) -> str:
    return held.outcome.value if held.outcome is not None else "?"


# -- /proc ---------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time, state) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def read_proc(pid: int) -> Proc | None:
    """One process from ``/proc``; None when it is gone, a zombie, or has no command line (a
    kernel thread)."""
    stat = _stat(pid)
    if stat is None or stat[2] in ("Z", "X"):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(CMDLINE_BYTES)
    except OSError:
        return None
    if not raw:
        return None
    argv = tuple(os.fsdecode(w) for w in raw.rstrip(b"\0").split(b"\0"))
    return Proc(pid, stat[0], stat[1], argv)


def snapshot() -> dict[int, Proc]:
    """Every process of the machine this user can see."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None:
            found[proc.pid] = proc
    return found


def _hold(proc: Proc) -> Held:
    """A pidfd on ``proc``, kept only when the PID is still that process (same start time)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return Held(proc, None)
    stat = _stat(proc.pid)
    if stat is None or stat[1] != proc.start or stat[2] in ("Z", "X"):
        os.close(fd)
        return Held(proc, None)
    return Held(proc, fd)


def _wait_gone(held: Sequence[Held], seconds: float) -> list[Held]:
    """Wait up to ``seconds`` for each to exit (its pidfd readable); those left."""
    left = {h.fd: h for h in held if h.fd is not None}
    deadline = time.monotonic() + seconds
    while left and (remaining := deadline - time.monotonic()) > 0:
        poller = select.poll()
        for fd in left:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(remaining * 1000):
            left.pop(fd, None)
    return list(left.values())


# -- stopping --------------------------------------------------------------------------------


def stop_step(step: Sequence[Held], grace_s: float, force: bool) -> None:
    """One of Ray's steps: SIGTERM, up to ``grace_s`` for them to go, SIGKILL for the rest
    (with ``force``, SIGKILL at once), up to ``KILL_WAIT_S`` for those; each outcome set."""
    if force:
        killed, end = [h for h in step if h.signal(signal.SIGKILL)], Outcome.FORCED
    else:
        sent = [h for h in step if h.signal(signal.SIGTERM)]
        stubborn = _wait_gone(sent, grace_s)
        for h in sent:
            h.outcome = None if h in stubborn else Outcome.TERMINATED
        killed, end = [h for h in stubborn if h.signal(signal.SIGKILL)], Outcome.KILLED
        for h in stubborn:
            if h.outcome is Outcome.GONE:  # it went between the wait and SIGKILL
                h.outcome = Outcome.TERMINATED
    alive = _wait_gone(killed, KILL_WAIT_S)
    for h in killed:
        h.outcome = Outcome.ALIVE if h in alive else end


def stop_scope(scope: Scope, scope_said: str, grace_s: float, force: bool) -> Report:
    """Stop the scope's nodes, reading ``/proc`` again after each round for processes they
    started meanwhile, ``ROUNDS`` at most."""
    report = Report(scope_said)
    seen: set[tuple[int, int]] = set()
    for _ in range(ROUNDS):
        chosen = node_procs.choose(snapshot(), scope, exclude=[os.getpid()])
        new = [p for p in chosen.procs if (p.pid, p.start) not in seen]
        if not new:
            break
        report.chosen.append(chosen)
        seen |= {(p.pid, p.start) for p in new}
        held = {p.pid: _hold(p) for p in new}
        try:
            for step in node_procs.steps(new):
                if step:
                    stop_step([held[p.pid] for p in step], grace_s / node_procs.STEPS, force)
        finally:
            for h in held.values():
                if h.fd is not None:
                    os.close(h.fd)
        report.held += held.values()
    return report


def forget_cluster(temp_dirs: Sequence[str], addresses: Sequence[str]) -> list[str]:
    """Remove each temp dir's ``ray_current_cluster`` that names one of ``addresses`` (as Ray's
    ``ray stop`` removes its default temp dir's); the files removed."""
    removed = []
    for temp_dir in dict.fromkeys(temp_dirs):
        path = Path(temp_dir) / CURRENT_CLUSTER
        with contextlib.suppress(OSError):
            with path.open("rb") as f:
                noted = f.read(ADDRESS_CHARS + 1).decode(errors="replace").strip()
            if noted in addresses:
                path.unlink()
                removed.append(str(path))
    return removed


# -- the command line ------------------------------------------------------------------------


def _grace(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds > MAX_GRACE_S:
        raise argparse.ArgumentTypeError(
            f"{echo(text, 40)} is over the limit of {human_duration(MAX_GRACE_S)}"
        )
    return seconds


def _folder(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the folder is empty (leave --temp-dir out for Ray's)")
    return text


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if text == "auto":
        problem = "'auto' names no node: give the GCS address (HOST:PORT), or --temp-dir"
    elif len(text) > ADDRESS_CHARS or not sep or not host or any(c.isspace() for c in text):
        problem = f"{echo(text, 80)} is not HOST:PORT (a GCS address, as ray start printed it)"
    elif not port.isdigit() or not 0 < int(port) < 65536:
        problem = f"the port of {echo(text, 80)} is not a number from 1 to 65535"
    else:
        return text
    raise argparse.ArgumentTypeError(problem)


DESCRIPTION = (
    "Stop the Ray nodes of one temp dir, or of one GCS address, on this machine, by their PIDs; "
    "every other Ray node runs on. (Ray's own ray stop stops every Ray process on the machine.) "
    "Exit 0 stopped, 1 some could not be, 3 none found."
)
HELP = {
    "temp-dir": "the nodes whose sessions are in DIR, the --temp-dir they were started with "
    "(default: as ray start's, $RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray)",
    "address": "the nodes on this machine of the cluster whose GCS is at HOST:PORT (the address "
    "ray start printed): its head and the nodes that joined it",
    "grace": "time for the processes to end after SIGTERM, as Ray's (16, 16s, 1m; default "
    f"{GRACE_S:g}s, at most {human_duration(MAX_GRACE_S)}); then SIGKILL",
}


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=DESCRIPTION, formatter_class=WrapAtSpaces)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--temp-dir", type=_folder, metavar="DIR", help=HELP["temp-dir"])
    where.add_argument("--address", type=_address, metavar="HOST:PORT", help=HELP["address"])
    p.add_argument(
        "-g", "--grace-period", type=_grace, default=GRACE_S, metavar="DURATION", help=HELP["grace"]
    )
    p.add_argument("-f", "--force", action="store_true", help="SIGKILL at once, as Ray's")
    return p


def scope_of(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Scope, str]:
    """The scope the arguments name, and how the report says it."""
    if args.address is not None:
        return Scope(address=args.address), f"the nodes of GCS address {args.address}"
    temp_dir = _temp_dir(args, environ)
    spellings = frozenset({os.path.normpath(temp_dir), os.path.realpath(temp_dir)})
    return Scope(temp_dirs=spellings), f"the nodes of temp dir {echo(temp_dir)}"


def _temp_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    return os.path.abspath(ray_temp_dir(args.temp_dir, environ))


def nothing_found(args: argparse.Namespace, environ: Mapping[str, str], scope_said: str) -> str:
    """The line that says no node of the scope runs, and what there is instead."""
    if args.address is not None:
        why = "no process on this machine names it (as --gcs-address=)"
    else:
        try:
            with os.scandir(_temp_dir(args, environ)) as entries:
                names = [e.name for e in entries]
        except OSError:
            names = []
            why = "no such folder"
        else:
            count = sum(node_procs.session_of(f"/{n}") is not None for n in names)
            why = (
                f"none of its {plural(count, 'session')} has a running process"
                if count
                else "it holds no session of Ray's"
            )
    return f"{PROG}: no Ray node to stop: {scope_said}: {why}"


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = _parser().parse_args(list(argv))
    scope, scope_said = scope_of(args, environ)
    try:
        report = stop_scope(scope, scope_said, args.grace_period, args.force)
    except OSError as exc:  # no pidfd (Linux before 5.3), no /proc
        print(f"{PROG}: cannot stop processes here: {exc}", file=sys.stderr)
        return FAILED
    if not report.held:
        print(nothing_found(args, environ, scope_said), file=sys.stderr)
        return NOTHING
    print("\n".join(report.lines()), flush=True)
    temp_dirs = [os.path.dirname(s) for c in report.chosen for s in c.sessions]
    addresses = [a for c in report.chosen for a in c.addresses]
    for path in forget_cluster(temp_dirs, addresses):
        print(f"{PROG}: removed {echo(path)} (it named a stopped cluster)")
    return report.code()
