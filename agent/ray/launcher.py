"""``rtenv-agent ray <args>``: Ray's own CLI (``ray start``, ``ray stop``, ...), run in this
process with ``agent.ray.install()`` done, so that the raylet ``ray start`` starts runs this agent.
As that raylet starts, one line on stderr says so, names the agent's root and the ``info`` command
that shows it (``hook.announcement``). Before ``ray start``
runs, one line warns when Ray's own socket paths would be over AF_UNIX's limit. Ray's exit code is
passed through; a mistake of ours (Ray not installed) is one line, exit 2; so is ``ray start`` on
a Ray this agent does not support (older than ``hook.SUPPORTED_RAY``), refused by its version
and the supported range before anything starts (``ray stop`` and the rest still run).

``rtenv-agent ray enable|disable|enabled`` are ours, not Ray's (Ray has no such commands; its
``enable-usage-stats`` is hyphenated): the switch of a Python environment (``agent.ray.switch``),
which needs no Ray in this python. ``--help`` lists them after Ray's commands, and without Ray
too (``agent.ray.commands``).
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Mapping, Sequence

from agent.ray import commands, hook, install, switch
from agent.ray.hook import (
    longest_socket_path,
    ray_temp_dir,
    ray_version_problem,
    running_ray_version,
    socket_path_warning,
)

PROG = "rtenv-agent ray"


def main(argv: Sequence[str]) -> int:
    if argv[:1] and argv[0] in switch.COMMANDS:
        return switch.main(argv[0], argv[1:], os.environ)
    if commands.wants_help(argv):  # ours listed too; no Ray needed for that
        return commands.show_help(PROG)
    try:
        from ray.scripts import scripts
    except ImportError as exc:
        print(
            f"{PROG}: Ray is not installed here ({exc}); install it (pip install 'ray[default]') "
            "in the python that runs rtenv-agent",
            file=sys.stderr,
        )
        return 2
    if argv[:1] == ["start"] and (old := ray_version_problem(running_ray_version())):
        print(
            f"{PROG}: {old}; not starting a node (plain ray start runs Ray's own agent)",
            file=sys.stderr,
        )
        return 2
    if argv[:1] == ["start"] and (said := start_warning(argv[1:], os.environ)) is not None:
        print(f"{PROG}: warning: {said}", file=sys.stderr, flush=True)
    install(on_swap=_announce)
    try:
        scripts.cli.main(args=list(argv), prog_name=PROG, standalone_mode=True)
    except SystemExit as exc:
        return _exit_code(exc.code)
    return 0


def start_warning(start_argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The warning for a ``ray start`` whose node's socket paths (in ``--temp-dir``, else Ray's
    default temp dir; the session named by this process's pid) would be over AF_UNIX's limit."""
    temp_dir = None
    for i, arg in enumerate(start_argv):
        if arg.startswith("--temp-dir="):
            temp_dir = arg.partition("=")[2]
        elif arg == "--temp-dir" and i + 1 < len(start_argv):
            temp_dir = start_argv[i + 1]
    now = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")  # as Ray names the session
    return socket_path_warning(
        longest_socket_path(ray_temp_dir(temp_dir, environ), os.getpid(), now)
    )


def _announce(raylet_argv: list[str]) -> None:
    print(announcement(raylet_argv, os.environ), file=sys.stderr, flush=True)


def announcement(raylet_argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The line said as a raylet starts with this agent: whose agent it is, its root and the
    ``info`` command that shows it (``hook.announcement``)."""
    return hook.announcement(raylet_argv, environ, PROG)


def _exit_code(code: object) -> int:
    """SystemExit's code as a process's: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
