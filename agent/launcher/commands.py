"""What ``rtenv-agent ray --help`` (``-h``, or no command) says: runtime-env-agent's own commands
and Ray's, and which of them need Ray in the python that runs rtenv-agent.

Ours (``OURS``: the switch, ``agent.launcher.switch``, and the scoped stop, ``agent.launcher.stop``)
need no Ray there: the agent's venv the README recommends has none, and ``enable --python`` names
the Python environment that has it. Every other command is Ray's own CLI, run with the raylets it
starts running this agent (``ray start`` above all): it needs Ray there. Where Ray is installed,
Ray's own help comes first (its commands, as that Ray has them) and ours after it; where it is not,
ours and a note on Ray's. Both exit 0: asking for help is no mistake (a command of Ray's without Ray
is still one line, exit 2).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from agent.ops.usage import one_line

HELP = ("--help", "-h")
WIDTH = 88  # the help's lines
RAY_PIP = "pip install 'ray[default]'"


# command -> (what it does, one line; whether it needs Ray in this python)
OURS: Mapping[str, tuple[str, bool]] = {
    "enable": (
        "make every Ray node a Python environment starts (a bare ray.init(), ray start) run "
        "this agent: --python PATH (default: this python), or --user (every venv of yours, made "
        "anew too), or --project DIR (those in DIR); --root DIR",
        False,
    ),
    "disable": ("undo enable: that environment's Ray nodes run Ray's own agent again", False),
    "enabled": ("is the switch on and in effect? exit 0 yes, 1 no (and why)", False),
    "stop": (
        "stop the Ray nodes of one temp dir (--temp-dir) or one cluster (--address), by PID; "
        "Ray's ray stop stops every node on the machine",
        False,
    ),
}
# Ray's, named in the help where Ray is not installed (its own help lists them all where it is)
RAYS = {
    "start": "start a Ray node on this machine whose raylet runs this agent (Ray's ray start)",
    "...": "every other command of Ray's ray CLI (status, job, logs, ...), as Ray runs it",
}


def wants_help(argv: Sequence[str]) -> bool:
    """``rtenv-agent ray``, ``rtenv-agent ray --help`` or ``-h``."""
    return not argv or argv[0] in HELP


def _rows(rows: Mapping[str, str]) -> list[str]:
    """``  name  what it does``, wrapped at ``WIDTH`` under its own column."""
    width = max(map(len, rows)) + 4
    out: list[str] = []
    for name, said in rows.items():
        lines = textwrap.wrap(said, WIDTH - width, break_on_hyphens=False) or [""]
        out.append(f"  {name:<{width - 2}}{lines[0]}")
        out.extend(" " * width + line for line in lines[1:])
    return out


def ours() -> list[str]:
    """Our commands, those that need Ray marked."""
    rows = {name: said + (" [needs Ray]" if ray else "") for name, (said, ray) in OURS.items()}
    header = "runtime-env-agent's commands (no Ray needed unless marked; each has --help):"
    return [header, *_rows(rows)]


def with_ray(prog: str) -> str:
    """What follows Ray's own help: ours, and what the rest are."""
    rest = (
        f"Every other command is Ray's own ({prog} start ...), run with the raylets it starts "
        "running this agent; those need Ray in the python that runs rtenv-agent."
    )
    return "\n".join(["", *ours(), "", *textwrap.wrap(rest, WIDTH)])


def without_ray(prog: str, why: ImportError) -> str:
    """The help where Ray cannot be imported: ours, and Ray's named, with how to get them."""
    about = (
        "The switch of a Python environment's Ray nodes to this agent, and Ray's own command "
        "line with the raylets it starts running this agent."
    )
    rays = f"Ray's commands (they need Ray in this python, which has none: {one_line(str(why))}):"
    return "\n".join(
        [
            f"Usage: {prog} COMMAND [ARGS]...",
            "",
            *textwrap.wrap(about, WIDTH, initial_indent="  ", subsequent_indent="  "),
            "",
            *ours(),
            "",
            *textwrap.wrap(rays, WIDTH),
            *_rows(RAYS),
            f"To run them, install Ray in the python that runs rtenv-agent: {RAY_PIP}",
        ]
    )


def show_help(prog: str) -> int:
    """Print the help (Ray's, where Ray is installed, then ours); the exit code: 0."""
    try:
        from ray.scripts import scripts
    except ImportError as exc:
        print(without_ray(prog, exc))
        return 0
    try:
        scripts.cli.main(args=["--help"], prog_name=prog, standalone_mode=True)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            return exc.code if isinstance(exc.code, int) else 1
    print(with_ray(prog))
    return 0
