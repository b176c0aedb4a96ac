"""The chaos runner's look at a shared agent root: state.db, the folders, the holders' locks.

Several agents (one per node) serve one root; what they agree on is the index (state.db: its
packages, their claims, the holders and their references) and the folders (uris/, each holder's
tmp/ and trash/, its lock under holders/). ``read_root`` takes one look at all of it;
``root_problems`` says what is wrong with that look when every node is quiet, given what each
node's agent says its live envs hold. The rules checked are the agent's (agent/state/index.py,
R1-R4), seen from outside: nothing here imports the agent's own view but ``is_alive``, and the
queries' text (``agent.state.schema``, where all of the index's SQL is written).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.state import schema
from agent.state.holders import HOLDERS_DIR, is_alive
from rtenv.v1 import agent_pb2


@dataclass
class RootState:
    """One look at the shared root: state.db in one read transaction, then its folders."""

    dirs: set[str]  # package directories under uris/ (start-up probes skipped)
    rows: list[tuple[str, str, int, str, str | None]]  # "kind:uri", dir, size, state, claimant
    refs: list[tuple[str, str]]  # (holder, "kind:uri")
    holders: list[str]  # the index's holder rows
    locks: list[str]  # the holders whose lock file is under holders/
    folders: dict[str, list[str]]  # "tmp/<holder>", "trash/<holder>" -> what is inside
    alive: set[str]  # of every holder named anywhere above: those whose lock is held
    # the index's change log, every agent's since the root was made (a killed agent's counters
    # die with it): packages made ready, ready packages removed (evicted, or dropped at a start)
    installed: int = 0
    removed: int = 0


def _names(folder: Path) -> list[str]:
    """What a folder holds, start-up probes (names starting with ".") skipped."""
    try:
        return sorted(name for name in os.listdir(folder) if not name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_root(root: Path) -> RootState:
    """Blocking (run it in a thread): the index, the folders, then which holders are alive."""
    db = sqlite3.connect(
        f"file:{root / 'state.db'}?mode=ro", uri=True, timeout=10, isolation_level=None
    )
    try:
        db.execute(schema.BEGIN)  # one snapshot of the three tables
        rows = [
            (f"{kind}:{uri}", directory, size, state, holder)
            for kind, uri, directory, size, _, state, holder in db.execute(schema.ALL_URIS)
        ]
        refs = [(h, f"{kind}:{uri}") for h, kind, uri in db.execute(schema.ALL_REFS)]
        holders = [h for h, *_ in db.execute(schema.ALL_HOLDERS)]
        logged = dict(db.execute(schema.CHANGES_BY_READY).fetchall())
        db.execute(schema.COMMIT)
    finally:
        db.close()
    folders = {
        f"{sub}/{name}": _names(root / sub / name)
        for sub in ("tmp", "trash")
        for name in _names(root / sub)
    }
    locks = [n.removesuffix(".lock") for n in _names(root / HOLDERS_DIR) if n.endswith(".lock")]
    named = {h for *_, h in rows if h} | {h for h, _ in refs} | {*holders, *locks}
    named |= {folder.split("/", 1)[1] for folder in folders}
    alive = {h for h in named if is_alive(root, h)}
    return RootState(
        set(_names(root / "uris")), rows, refs, holders, locks, folders, alive,
        installed=logged.get(1, 0), removed=logged.get(0, 0),
    )  # fmt: skip


def holder_of(root: Path, pid: int) -> str:
    """The holder id whose lock file under holders/ holds ``pid`` ("" if none does)."""
    for name in _names(root / HOLDERS_DIR):
        with contextlib.suppress(OSError):
            if name.endswith(".lock") and (root / HOLDERS_DIR / name).read_text() == str(pid):
                return name.removesuffix(".lock")
    return ""


def root_problems(
    state: RootState, nodes: dict[str, tuple[str, set[str]]], budget: int
) -> list[str]:
    """What is wrong with a quiet root (no create in flight on any node). ``nodes``: each live
    node's holder -> its label and the packages ("kind:uri") its agent's live envs hold."""
    problems = []
    ready = {key: (d, size) for key, d, size, state_, _ in state.rows if state_ == "ready"}
    per_dir = Counter(d for d, _ in ready.values())
    if twice := sorted(d for d, n in per_dir.items() if n > 1):
        problems.append(f"directories {twice} recorded for several packages")
    if state.dirs != set(per_dir):
        problems.append(f"directories {sorted(state.dirs ^ set(per_dir))} and state.db disagree")
    if claims := sorted(f"{key} by {h}" for key, _, _, st, h in state.rows if st != "ready"):
        problems.append(f"claims with no create in flight: {claims}")
    named = {*state.holders, *state.locks, *(h for h, _ in state.refs)}
    if dead := sorted(named - state.alive):
        problems.append(f"dead holders not reaped: {dead}")
    if strangers := sorted(state.alive - set(nodes)):
        problems.append(f"live holders that are no node's agent: {strangers}")
    for holder, (label, held) in sorted(nodes.items(), key=lambda item: item[1][0]):
        in_db = {key for h, key in state.refs if h == holder}
        if in_db != held:
            problems.append(
                f"{label}its live envs hold {sorted(held)} but state.db's references of its "
                f"holder {holder} are {sorted(in_db)}"
            )
        for key in sorted(held):
            if key not in ready:
                problems.append(f"{label}{key}, which a live env holds, has no ready row")
            elif ready[key][0] not in state.dirs:
                problems.append(f"{label}{key}, which a live env holds, is not on disk")
    referenced = {key for h, key in state.refs if h in state.alive}
    unused = sum(size for key, (_, size) in ready.items() if key not in referenced)
    if unused > budget:
        problems.append(f"unused bytes {unused} over the budget {budget}")
    for folder, inside in sorted(state.folders.items()):
        if folder.split("/", 1)[1] not in state.alive:
            problems.append(f"{folder} of no live holder left")
        elif inside:
            problems.append(f"{folder} did not drain: {inside[:3]}")
    return problems


def check_known(
    state: RootState,
    info: agent_pb2.GetRuntimeEnvsInfoReply,
    budget: int,
    violation: Callable[[str], None],
) -> None:
    """Alone on its root, an agent knows every package on it, and its own figures hold."""
    known = {Path(u.local_path).name for u in info.uris if u.local_path}
    if state.dirs != known:
        violation(f"directories {sorted(state.dirs ^ known)} and the agent's records disagree")
    if info.cache.unused_bytes > budget:
        violation(f"unused bytes {info.cache.unused_bytes} over the budget {budget} (agent)")


def held(info: agent_pb2.GetRuntimeEnvsInfoReply) -> set[str]:
    """The packages ("kind:uri") an agent's live envs hold."""
    return {key for e in info.envs if e.references and e.state != "failed" for key in e.uris}


def stopped_problems(state: RootState) -> list[str]:
    """What is wrong with a root whose agents all stopped cleanly: each one's stop took its
    holder row, references, claims, lock file, staging and trash folders with it."""
    problems = []
    if state.alive:
        problems.append(f"holders alive after every agent stopped: {sorted(state.alive)}")
    if left := sorted({*state.holders, *state.locks, *(h for h, _ in state.refs)}):
        problems.append(f"holders left in state.db or holders/: {left}")
    if claims := sorted(f"{key} by {h}" for key, _, _, st, h in state.rows if st != "ready"):
        problems.append(f"claims left: {claims}")
    if state.folders:
        problems.append(f"staging or trash folders left: {sorted(state.folders)}")
    return problems
