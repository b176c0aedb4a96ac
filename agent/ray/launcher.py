"""``rtenv-agent ray <args>``: Ray's own CLI (``ray start``, ``ray stop``, ...), run in this
process with ``agent.ray.install()`` done, so that the raylet ``ray start`` starts runs this agent.
As that raylet starts, one line on stderr says so and names the agent's root. Ray's exit code is
passed through; a mistake of ours (Ray not installed) is one line, exit 2."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.core.errors import echo
from agent.ops.ray_agent import agent_root
from agent.ray import AGENT_FLAG, install

PROG = "rtenv-agent ray"
ROOT_CHARS = 300  # of the root's path in the announcement


def main(argv: Sequence[str]) -> int:
    try:
        from ray.scripts import scripts
    except ImportError as exc:
        print(
            f"{PROG}: Ray is not installed here ({exc}); install it (pip install 'ray[default]') "
            "in the python that runs rtenv-agent",
            file=sys.stderr,
        )
        return 2
    install(on_swap=_announce)
    try:
        scripts.cli.main(args=list(argv), prog_name=PROG, standalone_mode=True)
    except SystemExit as exc:
        return _exit_code(exc.code)
    return 0


def _announce(raylet_argv: list[str]) -> None:
    print(announcement(raylet_argv, os.environ), file=sys.stderr, flush=True)


def announcement(raylet_argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The line said as a raylet starts with this agent: whose agent it is, and its root
    (``$RTENV_ROOT``, else in the node's Ray session, as ``rtenv-agent ray-agent`` decides)."""
    said = f"{PROG}: this node's runtime env agent is runtime-env-agent's (rtenv-agent ray-agent)"
    if environ.get("RTENV_ROOT"):
        root = echo(environ["RTENV_ROOT"], ROOT_CHARS)
        return f"{said}, not Ray's; its root: {root} (RTENV_ROOT)"
    runtime_env_dir = _runtime_env_dir(raylet_argv)
    if runtime_env_dir is None:
        return f"{said}, not Ray's; its root: unknown (the raylet passes no --runtime-env-dir)"
    root = echo(str(agent_root(Path(runtime_env_dir), environ)), ROOT_CHARS)
    return (
        f"{said}, not Ray's; its root: {root}, in Ray's session (each session starts an empty "
        "cache; set RTENV_ROOT to keep one)"
    )


def _runtime_env_dir(raylet_argv: Sequence[str]) -> str | None:
    """The ``--runtime-env-dir`` the raylet passes its agent, or None."""
    for arg in raylet_argv:
        if not arg.startswith(AGENT_FLAG):
            continue
        try:
            words = shlex.split(arg.removeprefix(AGENT_FLAG))
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word.startswith("--runtime-env-dir="):
                return word.partition("=")[2]
            if word == "--runtime-env-dir" and i + 1 < len(words):
                return words[i + 1]
    return None


def _exit_code(code: object) -> int:
    """SystemExit's code as a process's: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
