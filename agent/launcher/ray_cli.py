"""``rtenv-agent ray <args>``: Ray's own CLI (``ray start``, ``ray stop``, ...), run in this process
with ``agent.ray.install()`` done, so that the raylet ``ray start`` starts runs this agent. As
that raylet starts, one line on stderr says so, names the agent's root and the ``info`` command that
shows it (``ray_swap.announcement``). Before ``ray start`` runs, one line warns when Ray's own
socket paths would be over AF_UNIX's limit. Ray's exit code is passed through; a mistake of ours
(Ray not installed) is one line, exit 2; so is ``ray start`` on a Ray this agent does not support
(older than ``ray_swap.SUPPORTED_RAY``), refused by its version and the supported range before
anything starts (``ray stop`` and the rest still run).

Once a ``ray start`` whose raylet runs this agent has its node up (as Ray notes the cluster's
address, after Ray's own "Next steps"; else as Ray's CLI returns), the launcher prints this agent's
next steps on stdout (``agent.launcher.next_steps``): how to add a node on this agent, how to stop
just this node.

``rtenv-agent ray enable|disable|enabled`` are ours, not Ray's (Ray has no such commands; its
``enable-usage-stats`` is hyphenated): the switch of a Python environment
(``agent.launcher.switch_cli``), which needs no Ray in this python. So is ``rtenv-agent ray stop``
(``agent.launcher.stop``): it stops the nodes of one temp dir or GCS address, where Ray's ``ray
stop`` stops every Ray node on the machine; it needs no Ray either. ``--help`` lists ours after
Ray's commands, and without Ray too (``agent.launcher.commands``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agent.launcher import commands, install, stop, switch, switch_cli
from agent.launcher.next_steps import NextSteps
from agent.ops import ray_swap
from agent.ops.ray_swap import (
    longest_socket_path,
    ray_temp_dir,
    ray_version_problem,
    running_ray_version,
    socket_path_warning,
)

PROG = "rtenv-agent ray"


def main(argv: Sequence[str]) -> int:
    if argv[:1] and argv[0] in switch.COMMANDS:
        return switch_cli.main(argv[0], argv[1:], os.environ)
    if argv[:1] == ["stop"]:
        return stop.main(argv[1:], os.environ)
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
    steps = NextSteps.here()

    def swapped(raylet_argv: list[str]) -> None:
        _announce(raylet_argv)
        steps.saw(raylet_argv)

    install(on_swap=swapped)
    code = 0
    try:
        with _after_the_address_is_noted(steps):
            scripts.cli.main(args=list(argv), prog_name=PROG, standalone_mode=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    if code == 0 and argv[:1] == ["start"]:
        steps.say(sys.stdout)  # a Ray that noted no address: now that its CLI is done
    return code


@contextlib.contextmanager
def _after_the_address_is_noted(steps: NextSteps) -> Iterator[None]:
    """Ray's ``write_ray_address`` wrapped while Ray's CLI runs: ``ray start`` calls it once its
    node is up, after its "Next steps" and before ``--block`` waits, the moment to say ours."""
    from ray._private import utils

    original = getattr(utils, "write_ray_address", None)
    if original is None:
        yield
        return

    def write_ray_address(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        steps.say(sys.stdout)
        return result

    utils.write_ray_address = write_ray_address
    try:
        yield
    finally:
        utils.write_ray_address = original


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
    ``info`` command that shows it (``ray_swap.announcement``)."""
    return ray_swap.announcement(raylet_argv, environ, PROG)


def _exit_code(code: object) -> int:
    """SystemExit's code as a process's: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
