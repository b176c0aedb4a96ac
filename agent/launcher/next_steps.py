"""The next steps ``rtenv-agent ray start`` prints after Ray's own, for a node on this agent.

Ray's ``ray start`` ends with ``ray start --address='<GCS>'`` (which would start a node on Ray's
own agent) and ``ray stop`` (which stops every Ray node on the machine). Right after them, once
the node is up, the launcher prints the same steps for this agent: the command that adds a node
to this cluster through ``rtenv-agent ray start``, the one that stops this node, by its temp dir
(``rtenv-agent ray stop --temp-dir``), and on a head the one that stops the cluster's nodes on
this machine (``--address``). The values are the raylet's own (its ``--gcs-address=`` and the
folder of its session: the temp dir the node really uses); the command is ``rtenv-agent`` where
PATH finds this one, else its full path, quoted for a shell.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from agent.launcher.node_procs import gcs_address, sessions_named
from agent.ops.ray_swap import CLI as EXE
from agent.ops.ray_swap import agent_cli, shell_line

PROG = "rtenv-agent ray"


def runnable(argv0: str, executable: str, path: str | None) -> list[str]:
    """The words that run this rtenv-agent from a shell whose PATH is ``path``: ``rtenv-agent``
    when PATH finds this one; else the script's full path (``argv0`` when it is the script, else
    the one beside ``executable``, a venv's ``bin``); else ``<executable> -m agent``
    (``ray_swap.agent_cli``)."""
    mine = os.path.basename(argv0) == EXE
    words = [os.path.abspath(argv0)] if mine else agent_cli(executable)
    found = shutil.which(EXE, path=path)
    if len(words) == 1 and found is not None and _same_file(found, words[0]):
        return [EXE]
    return words


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def next_steps(raylet_argv: Sequence[str], words: Sequence[str]) -> list[str]:
    """The lines for the node this raylet command starts (none when it names no GCS address or
    no single session)."""
    address = gcs_address(raylet_argv)
    sessions = sessions_named(raylet_argv)
    if address is None or len(sessions) != 1:
        return []
    temp_dir = os.path.dirname(sessions.pop())

    def run(*args: str) -> str:
        return "    " + shell_line([*words, "ray", *args])

    lines = [
        f"{PROG}: next steps for this node, which runs runtime-env-agent's agent (Ray's "
        "`ray start --address` above would add a node on Ray's own agent, and its `ray stop` "
        "stops every Ray node on this machine):",
        "  To add another node to this Ray cluster, on this agent, run",
        run("start", f"--address={address}"),
        "  To stop this node (the Ray nodes of its temp dir), run",
        run("stop", f"--temp-dir={temp_dir}"),
    ]
    if "--head" in raylet_argv:
        lines += [
            "  To stop every node of this cluster on this machine, run",
            run("stop", f"--address={address}"),
        ]
    return lines


class NextSteps:
    """Says the next steps once, for the last raylet command the launcher swapped."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(words)
        self.raylet: list[str] | None = None
        self.said = False

    @classmethod
    def here(cls) -> NextSteps:
        """For this process: the command that runs it, as PATH finds it."""
        return cls(runnable(sys.argv[0], sys.executable, os.environ.get("PATH")))

    def saw(self, raylet_argv: Sequence[str]) -> None:
        self.raylet = list(raylet_argv)

    def say(self, out: TextIO) -> None:
        if self.said or self.raylet is None:
            return
        self.said = True
        if lines := next_steps(self.raylet, self.words):
            print("\n".join(lines), file=out, flush=True)
