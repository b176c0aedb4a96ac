"""The processes of the Ray nodes of one temp dir or one GCS address, chosen from a snapshot of
the machine's processes (pure: ``rtenv-agent ray stop`` reads ``/proc`` and signals them).

A process is never chosen by its name alone. Ray names a node's session on the command line of
every process it starts for the node: the GCS server, the raylet, the monitor, the dashboard,
the log monitor and this agent each take options such as ``--session-dir=<temp dir>/session_<date>
_<pid>`` (``--log_dir=``, ``--raylet_socket_name=``... under it). So:

- the *sessions* of a scope: for a temp dir, every session named by an option whose path is
  ``<temp dir>/session_*`` (never ``session_latest``, the link a person's ``tail -f`` follows);
  for an address, the sessions named by the processes whose ``--gcs-address=`` (or
  ``--gcs_address=``) is that address;
- the node's processes: every process with an option naming one of those sessions; a head's
  Ray Client server (``-m ray.util.client.server``, which names no session), when its
  ``--address=`` is the GCS address of a head raylet (``--head``) chosen; the process that
  started the node and blocks on it (a ``ray start ... --block``: the parent of a chosen
  process, with ``start`` and ``--block`` among its words); and every descendant of these (the
  workers and the agents the raylet starts, whose command lines Ray replaces with titles such as
  ``ray::IDLE``).

A value that holds a command line (the raylet's ``--java_worker_command=``: a space, then ``-``,
before the session) names no session. The order to stop them is Ray's (``ray stop``): the
raylets first (agents fate-share with their raylet), the GCS servers and a blocking ``ray
start`` last.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SESSION_PREFIX = "session_"  # Ray's session folders: session_<%Y-%m-%d_%H-%M-%S_%f>_<pid>
SESSION_LATEST = "session_latest"  # Ray's link to the newest session: no process names it
GCS_OPTIONS = ("--gcs-address", "--gcs_address")  # how Ray tells a node's processes its GCS
CLIENT_SERVER = "ray.util.client.server"  # a head's Ray Client server (python -m ...)
RAYLET, GCS_SERVER = "raylet", "gcs_server"  # Ray's two binaries, by their file names
STEPS = 3  # Ray's ray stop: raylets, the rest, GCS servers (its grace period split in three)
LABEL_CHARS = 80  # of a process's label in the report


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` showed it: ``start`` (clock ticks after boot) tells a process
    from a later one given the same PID."""

    pid: int
    ppid: int
    start: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Scope:
    """The nodes to stop: those of a temp dir (``temp_dirs``: its spellings, as given and
    resolved) or those of a GCS address (``address``)."""

    temp_dirs: frozenset[str] = frozenset()
    address: str | None = None


@dataclass(frozen=True)
class Chosen:
    """The processes of a scope's nodes, with the sessions and GCS addresses they name."""

    procs: tuple[Proc, ...]
    sessions: tuple[str, ...]
    addresses: tuple[str, ...]


def options(argv: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, value)`` of each ``--name=value`` word after the program."""
    split = (word.partition("=") for word in argv[1:] if word.startswith("-"))
    return [(name, value) for name, sep, value in split if sep]


def session_of(value: str) -> str | None:
    """The session folder a path names (``<dir>/session_<...>``, normalized), or None: not an
    absolute path, ``session_latest``, or a command line (a space and ``-`` before it)."""
    if not value.startswith("/"):
        return None
    parts = os.path.normpath(value).split("/")
    for i, part in enumerate(parts):
        if part.startswith(SESSION_PREFIX) and part != SESSION_LATEST and i > 0:
            folder = "/".join(parts[: i + 1])
            return None if " -" in folder else folder
    return None


def sessions_named(argv: Sequence[str]) -> set[str]:
    """The sessions a command line's options name."""
    found = (session_of(value) for _, value in options(argv))
    return {session for session in found if session is not None}


def gcs_address(argv: Sequence[str]) -> str | None:
    """The GCS address a node's process is told (``--gcs-address=``), or None."""
    for name, value in options(argv):
        if name in GCS_OPTIONS and value:
            return value
    return None


def program(argv: Sequence[str]) -> str:
    """The file name of a command line's program (``raylet``, ``gcs_server``, ``python3``)."""
    return os.path.basename(argv[0]) if argv else ""


def _is_client_server(argv: Sequence[str], heads: set[str]) -> bool:
    if CLIENT_SERVER not in argv:
        return False
    return any(name == "--address" and value in heads for name, value in options(argv))


def _is_blocking_start(argv: Sequence[str]) -> bool:
    return "start" in argv and "--block" in argv


def scope_sessions(procs: Iterable[Proc], scope: Scope) -> set[str]:
    """The sessions of the scope's nodes that a running process names."""
    found: set[str] = set()
    for proc in procs:
        named = sessions_named(proc.argv)
        if scope.address is not None:
            if named and gcs_address(proc.argv) == scope.address:
                found |= named
        else:
            found |= {s for s in named if os.path.dirname(s) in scope.temp_dirs}
    return found


def choose(snapshot: Mapping[int, Proc], scope: Scope, exclude: Iterable[int] = ()) -> Chosen:
    """The processes of the scope's nodes in ``snapshot`` (none of ``exclude``: the stopping
    process itself), by PID."""
    sessions = scope_sessions(snapshot.values(), scope)
    chosen = {p.pid for p in snapshot.values() if sessions_named(p.argv) & sessions}
    heads = {
        address
        for pid in chosen
        if "--head" in snapshot[pid].argv and (address := gcs_address(snapshot[pid].argv))
    }
    chosen |= {p.pid for p in snapshot.values() if _is_client_server(p.argv, heads)}
    parents = {snapshot[pid].ppid for pid in chosen} - chosen
    chosen |= {p for p in parents if p in snapshot and _is_blocking_start(snapshot[p].argv)}
    chosen = descendants(snapshot, chosen) - set(exclude)
    procs = tuple(snapshot[pid] for pid in sorted(chosen))
    addresses = {a for p in procs if (a := gcs_address(p.argv))}
    return Chosen(procs, tuple(sorted(sessions)), tuple(sorted(addresses)))


def descendants(snapshot: Mapping[int, Proc], roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for proc in snapshot.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def steps(procs: Sequence[Proc]) -> list[list[Proc]]:
    """Ray's ``STEPS``, in its order: the raylets, the rest, then the GCS servers and a blocking
    ``ray start`` (a step may be empty)."""
    first = [p for p in procs if program(p.argv) == RAYLET]
    last = [p for p in procs if program(p.argv) == GCS_SERVER or _is_blocking_start(p.argv)]
    middle = [p for p in procs if p not in first and p not in last]
    return [first, middle, last]


def label(argv: Sequence[str]) -> str:
    """A process's short name for the report: its program (``raylet``), its script
    (``monitor.py``), its module (``-m agent ray-agent``) or the title Ray gave it
    (``ray::IDLE``)."""
    words = list(argv)
    if not words:
        return "?"
    if words[0].startswith("ray::"):  # a title Ray set over the command line
        return _cut(" ".join(" ".join(words).split()))
    if not program(words).startswith("python"):
        return _cut(program(words))
    for i, word in enumerate(words[1:], start=1):
        if word == "-c":
            return f"{program(words)} -c"
        if word == "-m" and i + 1 < len(words):
            module = [w for w in words[i + 1 : i + 3] if not w.startswith("-")]
            return _cut(" ".join(["-m", *module]))
        if word.endswith(".py"):
            return _cut(os.path.basename(word))
    rest = [os.path.basename(words[1]), *words[2:4]] if len(words) > 1 else words
    return _cut(" ".join(rest))


def _cut(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."
