"""The chaos run's looks at the shared root: at the quiet point of a round (every cluster done,
none stopped) and once every cluster has stopped.

The quiet look asks each live agent (found by its cluster's processes, reached on its node's
socket in the root) which packages its live envs hold, reads the root, and asks again: Ray's
raylet releases an idle worker's env whenever it likes, so a look whose two asks differ is taken
again (``_LOOKS`` times at most) before ``chaoslib_root.root_problems`` judges it. The stopped
look is ``chaoslib_root.stopped_problems`` and more: the index agrees with ``uris/``, and no
agent's socket is left in the root. Blocking: call them in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from chaoslib_root import held, holder_of, read_root, root_problems, stopped_problems

from agent.core.kinds import row_of
from agent.core.uris import UriKind
from agent.ops.ray_agent import socket_name
from agent.state.ray_folders import TREES
from chaosray import procs
from rtenv.v1 import agent_pb2, agent_pb2_grpc

_LOOKS = 20


def _flag(argv: tuple[bytes, ...], name: bytes) -> str:
    """The value of ``--name=X`` or ``--name X`` in ``argv`` ("" if absent)."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + b"="):
            return arg.split(b"=", 1)[1].decode()
        if arg == name and i + 1 < len(argv):
            return argv[i + 1].decode()
    return ""


def _node_id(argv: tuple[bytes, ...]) -> str:
    return _flag(argv, b"--node-id")


def _tree_problems(
    label: str, agent: procs.Proc, held: set[str], dirs: dict[str, str], root: Path
) -> list[str]:
    """Each package of a folder of files (working dirs, modules) that the agent's envs hold is
    shown in its node's Ray folder, whole: Ray's tools and GC checks read it there."""
    base = _flag(agent.argv, b"--runtime-env-dir")
    if not base:
        return []
    problems = []
    for key in sorted(held):
        kind, _, _ = key.partition(":")
        folder = row_of(UriKind(kind)).ray_folder
        name = dirs.get(key, "")
        if folder not in TREES or not name:
            continue
        shown = Path(base) / folder / name
        package = root / "uris" / name
        if not shown.exists():
            problems.append(f"{label}{key}, held, is not shown in its node's {folder}")
        elif not shown.is_symlink() and _files(shown) != _files(package):
            problems.append(f"{label}{key}, held, is shown in part in its node's {folder}")
    return problems


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()}


def _info(root: Path, node_id: str) -> agent_pb2.GetRuntimeEnvsInfoReply:
    address = f"unix:{root / socket_name(node_id)}"
    with grpc.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        reply: agent_pb2.GetRuntimeEnvsInfoReply = stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=20
        )
    return reply


def _held(root: Path, agents: Sequence[tuple[str, procs.Proc]]) -> dict[str, set[str]] | None:
    """Each agent's (by label) held packages; None while any agent has a build in flight (a
    build goes on past a failed create: its claim is in the index until it ends)."""
    out = {}
    for label, a in agents:
        info = _info(root, _node_id(a.argv))
        if info.builds:
            return None
        out[label] = held(info)
    return out


def quiet_problems(root: Path, ray_tmps: Sequence[Path], budget: int) -> list[str]:
    """What is wrong with the root while every cluster is done and none stopped."""
    agents: list[tuple[str, procs.Proc]] = []
    for i, ray_tmp in enumerate(ray_tmps):
        for a in procs.roles(ray_tmp).agents:
            agents.append((f"cluster {i} agent {a.pid}: ", a))
    holders = {label: holder_of(root, a.pid) for label, a in agents}
    if missing := sorted(label for label, h in holders.items() if not h):
        return [f"{label}has no holder lock in the root" for label in missing]
    problems: list[str] = []
    for _ in range(_LOOKS):
        before = _held(root, agents)
        state = read_root(root)
        after = _held(root, agents)
        if before is not None and before == after:
            nodes = {holders[label]: (label, after[label]) for label, _ in agents}
            problems = root_problems(state, nodes, budget)
            dirs = {key: d for key, d, _, st, _ in state.rows if st == "ready"}
            for label, a in agents:
                problems += _tree_problems(label, a, after[label], dirs, root)
            return problems
        time.sleep(0.5)
    problems.append(
        f"no steady look at the root in {_LOOKS} tries (the agents' envs or builds kept moving)"
    )
    return problems


def stopped_root_problems(root: Path) -> list[str]:
    """What is wrong with the root once every cluster has stopped."""
    if not (root / "state.db").exists():
        return []
    state = read_root(root)
    problems = stopped_problems(state)
    ready = {d for _, d, _, st, _ in state.rows if st == "ready"}
    if state.dirs != ready:
        problems.append(f"directories {sorted(state.dirs ^ ready)} and state.db disagree")
    if sockets := sorted(p.name for p in root.glob("agent*.sock")):
        problems.append(f"sockets of stopped agents left in the root: {sockets}")
    return problems
