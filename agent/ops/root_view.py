"""``rtenv-agent info --root``: a root's shared index as it is, read from ``ROOT/state.db``.

Several agents may serve one root, each on its own socket, so a root no longer names one agent
to ask: what the root holds is its index, which every agent with a state.db writes (the schema
and every query's text are ``agent.state.schema``, the rules ``agent.state.index``). This
reads it directly, with no agent running or needed: the holders (each agent serving the root, or
dead and not yet reaped, alive exactly as ``holders.liveness`` tests it, or unknown when its
lock file is not this user's to open: an agent run by another user), the packages (with their
references by live holders, in ``info --address``'s words, ``PackageState``: installing; ready,
some live holder references it; unused, none does, so a pass may evict it), and the root's
totals. A package is shown by its URI and its folder under ``uris/`` (``<kind>-<hash of the
URI>``: a ``pip://<hash>`` URI's own hash is of its requirements, another one).

The file is opened read-only (SQLite's ``mode=ro``: never created, never migrated, never
written; a WAL reader does not wait for the agents' writers) and read in one transaction, so
the tables agree with each other. A missing file, a schema other than ``SCHEMA_VERSION`` and a
file SQLite cannot read are each a ``RootViewError``: one line, exit 1. Values read from the
file are the agents' (or whoever wrote the file): text is shown as ``echo_label`` quotes it,
and a row whose types are not the schema's is an unreadable file, never a traceback.

Synchronous: ``info`` is a short-lived command with no event loop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.app.snapshot import PackageState
from agent.core.errors import echo_label
from agent.core.units import human_bytes, plural
from agent.state import schema
from agent.state.holders import holder_pid, liveness
from agent.state.schema import SCHEMA_VERSION
from agent.state.state_db import FILE_NAME

BUSY_TIMEOUT_S = 5.0  # a WAL reader waits only while a writer recovers the WAL index
_USAGE, _FAILED = 2, 1  # exit codes


class RootViewError(Exception):
    """The root's index cannot be shown: ``message`` is the one line to print."""

    def __init__(self, message: str, exit_code: int = _FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class HolderView:
    """An agent serving the root, or dead and not yet reaped by a pass."""

    id: str
    pid: int | None  # its row's; from its lock file for an id with references but no row
    alive: bool | None  # None: unknown (its lock file is not this user's to open)
    references: int  # packages it references (its rows of ``refs``)
    live_envs: int  # envs it holds (the agent writes this behind, within ~0.1 s)
    started_ms: int | None  # None: no row


@dataclass(frozen=True)
class PackageView:
    kind: str
    uri: str
    dir: str  # its folder under ``uris/`` (the name it will have, while installing)
    state: str  # a PackageState's value (or whatever the file says for a row not ready)
    installer: str | None  # while installing: the holder whose claim it is
    size_bytes: int  # unpacked; 0 while installing
    references: int  # live holders referencing it
    last_used_ms: int


@dataclass(frozen=True)
class RootView:
    root: Path
    holders: tuple[HolderView, ...]  # oldest start first
    packages: tuple[PackageView, ...]  # by kind, then URI

    @property
    def alive(self) -> int:
        return sum(h.alive is True for h in self.holders)

    @property
    def dead(self) -> int:
        return sum(h.alive is False for h in self.holders)

    @property
    def unknown(self) -> int:
        """Holders whose lock file this user cannot open: a pass keeps them, as if alive."""
        return sum(h.alive is None for h in self.holders)

    @property
    def total_bytes(self) -> int:
        return sum(p.size_bytes for p in self.packages)

    @property
    def unused_bytes(self) -> int:
        """Of the ready packages no live holder references: what a pass may evict."""
        return sum(p.size_bytes for p in self.packages if p.state == PackageState.UNUSED.value)


# -- reading ----------------------------------------------------------------------------------
def read_root(root: Path) -> RootView:
    """The root's index, read in one transaction of a read-only connection."""
    path = root / FILE_NAME
    _check_file(root, path)
    try:
        conn = sqlite3.connect(_uri(path), uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise RootViewError(f"cannot read {path}: {exc}") from exc
    try:
        conn.execute(schema.BEGIN)  # deferred: one snapshot for every SELECT below
        version = conn.execute(schema.VERSION).fetchone()[0]
        if version != SCHEMA_VERSION:
            raise RootViewError(_wrong_version(path, version))
        return _read(conn, root)
    except (sqlite3.Error, _BadRow) as exc:
        raise RootViewError(f"cannot read {path}: {exc}") from exc
    finally:
        conn.close()  # the read transaction ends with it: nothing was written


def _uri(path: Path) -> str:
    """Read-only, and creating no file: while an agent has the index open its WAL and
    shared-memory files exist and the reader uses them (it sees every commit, waits for no
    writer). With neither there (no agent has it open), a read-only connection would create
    them, owned by whoever runs info (root, say), and the next agent, unable to write them,
    could not open its index: the file is then read as immutable, taking no lock. Agents write
    to the WAL, and fold it into the file only at a checkpoint: one that lands in the few
    milliseconds of this read could make it fail (one line, exit 1) or mix two states."""
    quoted = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    beside = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    return quoted if all(p.exists() for p in beside) else quoted + "&immutable=1"


def _check_file(root: Path, path: Path) -> None:
    """A missing index is told from a root that is not a folder and from a file that is not one
    SQLite could open without blocking (a FIFO would hang the open)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise RootViewError(
            f"{root} has no index: there is no {path} (no agent with a state.db has served this "
            "root; an agent started with --no-state-db keeps its index in memory: use "
            "info --address)"
        ) from None
    except NotADirectoryError:
        raise RootViewError(f"--root {root} is not a folder", _USAGE) from None
    except OSError as exc:
        raise RootViewError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise RootViewError(f"cannot read {path}: not a regular file")


def _wrong_version(path: Path, version: object) -> str:
    said = f"{path} has schema version {version!r}, and this info reads version {SCHEMA_VERSION}"
    if isinstance(version, int) and 0 < version < SCHEMA_VERSION:
        return f"{said}: an older agent wrote it (an agent of this version migrates it at start)"
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return f"{said}: a newer agent wrote it (run that version's rtenv-agent info)"
    return f"{said}: it is not an index an agent wrote"


class _BadRow(Exception):
    """A value of a type the schema does not allow (SQLite's columns accept anything)."""


def _read(conn: sqlite3.Connection, root: Path) -> RootView:
    rows = {
        _text(hid): (_int(pid), _int(started), _int(envs))
        for hid, pid, started, envs in conn.execute(schema.ALL_HOLDERS)
    }
    refs = [(_text(h), _text(k), _text(u)) for h, k, u in conn.execute(schema.ALL_REFS)]
    uris = [
        (_text(k), _text(u), _text(d), _int(size), _int(used), _text(state), _opt_text(holder))
        for k, u, d, size, used, state, holder in conn.execute(schema.ALL_URIS)
    ]
    # Every holder the index names: with a row, with references, or with a claim.
    named = set(rows) | {h for h, _, _ in refs} | {h for *_, h in uris if h is not None}
    alive = {hid: liveness(root, hid) for hid in named}
    counts = Counter(h for h, _, _ in refs)
    holders = []
    for hid in named:
        pid, started, envs = rows[hid] if hid in rows else (holder_pid(root, hid), None, 0)
        holders.append(HolderView(hid, pid, alive[hid], counts[hid], envs, started))
    holders.sort(key=lambda h: (h.started_ms is None, h.started_ms or 0, h.id))
    # an unknown holder's references protect its packages from a pass: counted as live
    live_refs = Counter((kind, uri) for hid, kind, uri in refs if alive[hid] is not False)
    packages = [
        PackageView(
            kind,
            uri,
            directory,
            _state(state, live_refs.get((kind, uri), 0)),
            holder if state == "installing" else None,
            size,
            live_refs.get((kind, uri), 0),
            used,
        )
        for kind, uri, directory, size, used, state, holder in uris
    ]
    packages.sort(key=lambda p: (p.kind, p.uri))
    return RootView(root, tuple(holders), tuple(packages))


def _state(stored: str, references: int) -> str:
    """A row's state in ``info --address``'s words: a ready row is ready while a live holder
    references it, else unused; any other (installing) as the file says."""
    if stored != "ready":
        return stored
    return str((PackageState.READY if references else PackageState.UNUSED).value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _BadRow(f"a row holds {type(value).__name__} where the schema says text")
    return value


def _opt_text(value: object) -> str | None:
    return None if value is None else _text(value)


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise _BadRow(f"a row holds {type(value).__name__} where the schema says an integer")
    return value


# -- showing ------------------------------------------------------------------------------------
_STATES = {True: "alive", False: "dead", None: "unknown"}


def _when(ms: int | None) -> str:
    """Local time to the second; "-" for none, "?" for a value no clock shows."""
    if not ms:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    except (OverflowError, OSError, ValueError):
        return "?"


def format_root(view: RootView) -> str:
    """Two tables and a summary line, sizes in binary units."""
    lines = [f"{'HOLDER':<34}{'PID':>8}  {'STATE':<6}{'REFS':>5}{'ENVS':>6}  STARTED"]
    for h in view.holders:
        pid = "-" if h.pid is None else str(h.pid)
        state = _STATES[h.alive]
        lines.append(
            f"{echo_label(h.id):<34}{pid:>8}  {state:<6}{h.references:>5}{h.live_envs:>6}  "
            f"{_when(h.started_ms)}"
        )
    alive = {h.id: h.alive for h in view.holders}
    lines.append("")
    folders = [_folder(p.dir, p.state) for p in view.packages]
    width = max([len("FOLDER"), *map(len, folders)]) + 2
    lines.append(
        f"{'KIND':<13}{'REFS':>5}  {'STATE':<11}{'SIZE':>10}  {'LAST USED':<21}"
        f"{'FOLDER':<{width}}URI"
    )
    for p, folder in zip(view.packages, folders, strict=True):
        size = "-" if p.state == PackageState.INSTALLING.value else human_bytes(p.size_bytes)
        lines.append(
            f"{echo_label(p.kind):<13}{p.references:>5}  {echo_label(p.state):<11}{size:>10}  "
            f"{_when(p.last_used_ms):<21}{folder:<{width}}{echo_label(p.uri)}"
        )
        if p.installer is not None:
            by = {True: "alive", None: "unknown: a pass keeps its claim"}.get(
                alive.get(p.installer, False), "dead: a pass reaps its claim"
            )
            lines.append(f"{'':<{64 + width}}installing by holder {echo_label(p.installer)} ({by})")
    lines.append("")
    unknown = (
        f", {view.unknown} unknown (lock files this user cannot open: run info as their owner)"
        if view.unknown
        else ""
    )
    lines.append(
        f"holders: {view.alive} alive, {view.dead} dead{unknown}; "
        f"{plural(len(view.packages), 'package')}, {human_bytes(view.total_bytes)}; "
        f"unused {human_bytes(view.unused_bytes)} (ready, no live holder references them)"
    )
    return "\n".join(lines)


def _folder(name: str, state: str) -> str:
    """A package's folder under ``uris/`` as the table shows it: none yet while installing."""
    return "-" if state == PackageState.INSTALLING.value else echo_label(name)


def root_json(view: RootView) -> str:
    """The same as one JSON object: exact bytes and milliseconds, full URIs (JSON escapes
    what a terminal would act on)."""
    doc: dict[str, Any] = {
        "root": str(view.root),
        "holders": [
            {
                "id": h.id,
                "pid": h.pid,
                "alive": h.alive,  # null: unknown
                "references": h.references,
                "live_envs": h.live_envs,
                "started_ms": h.started_ms,
            }
            for h in view.holders
        ],
        "packages": [
            {
                "kind": p.kind,
                "uri": p.uri,
                "dir": p.dir,
                "state": p.state,
                "installer": p.installer,
                "size_bytes": p.size_bytes,
                "references": p.references,
                "last_used_ms": p.last_used_ms,
            }
            for p in view.packages
        ],
        "summary": {
            "holders_alive": view.alive,
            "holders_dead": view.dead,
            "holders_unknown": view.unknown,
            "packages": len(view.packages),
            "bytes": view.total_bytes,
            "unused_bytes": view.unused_bytes,
        },
    }
    return json.dumps(doc, indent=2)
