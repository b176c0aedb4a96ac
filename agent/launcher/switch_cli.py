"""``rtenv-agent ray enable|disable|enabled``'s command line: the switch of one Python environment
(``--python PATH``, ``agent.launcher.switch``) or of every Python the user starts (``--user``,
or the environments of some project folders, ``--project DIR``: ``agent.launcher.user_switch``);
``enabled --python PATH`` says which of the two covers that python, and whether it is in effect
in this shell. A mistake is one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.launcher import switch, user_switch
from agent.launcher.switch import NAME, PROG, SwitchError
from agent.ops import user_hook
from agent.ops.usage import OneLineParser, WrapAtSpaces

DESCRIPTIONS = {
    "enable": "Make every Ray node the --python starts (a bare ray.init(), ray start, a "
    "Cluster) run this agent, from the python running this command, on one root: writes "
    f"{NAME}.pth, {NAME}.py and its bytecode into that python's site-packages, nothing else. "
    "With --user: every Python environment of this user's, venvs made anew included (a hook "
    "folder put on PYTHONPATH by a block in the shell startup files); --project DIR: those in "
    "DIR. Run it again to update; disable undoes it.",
    "disable": f"Remove what enable wrote ({NAME}.pth, {NAME}.py, its bytecode; with --user, "
    "the hook folder and the startup files' block): the Ray nodes run Ray's own agent again. "
    "The root and its packages stay.",
    "enabled": "Say whether the switch is on for the --python (its own, or the per-user one), "
    "with its agent python and root, and whether it is in effect in this shell: exit 0 on, 1 off.",
}


def _parser(command: str) -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=f"{PROG} {command}",
        description=DESCRIPTIONS[command],
        formatter_class=WrapAtSpaces,  # wraps at spaces only: paths stay whole
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--python",
        metavar="PATH",
        help="the Python environment's python (default: the one rtenv-agent runs in); in a uv "
        "project, .venv/bin/python",
    )
    which.add_argument(
        "--user",
        action="store_true",
        help="the per-user switch: every Python environment of this user's",
    )
    if command != "enabled":
        which.add_argument(
            "--project",
            metavar="DIR",
            action="append",
            help="the per-user switch for the Python environments in DIR only (a uv project's "
            ".venv; a venv kept elsewhere by naming its folder); repeat for several",
        )
    if command == "enable":
        p.add_argument(
            "--root",
            metavar="DIR",
            help="the agents' root (default ${XDG_CACHE_HOME:-~/.cache}/rtenv-agent/root)",
        )
    return p


def _home() -> Path | None:
    try:
        return Path.home()
    except (KeyError, RuntimeError):
        return None


def _projects(given: list[str] | None) -> list[Path] | None:
    """The --project folders, resolved (a venv's prefix is compared resolved too)."""
    if given is None:
        return None
    folders = []
    for folder in given:
        if not folder.strip() or not os.path.isdir(folder):
            raise SwitchError(f"--project {folder!r} is not a folder")
        folders.append(Path(os.path.realpath(folder)))
    return folders


def _enabled(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[int, list[str]]:
    place = user_switch.user(environ, _home())
    if args.user:
        return user_switch.status(place, environ)
    target = switch.probe(switch.python_path(args.python or sys.executable))
    code, lines = switch.status(target)
    if not target.pth.is_file():  # its own switch is off: the per-user one may cover it
        covered = user_switch.coverage(place, target, environ)
        return (code, lines) if covered is None else covered
    try:
        config = user_switch.read_config(place)
    except SwitchError:
        config = None
    if config is not None and user_hook.covers(config, target.prefix):
        lines.append("  note: the per-user switch covers it too; its own switch wins")
    return code, lines


def main(command: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = _parser(command).parse_args(list(argv))
    per_user = command != "enabled" and (args.user or args.project is not None)
    try:
        if command == "enabled":
            code, lines = _enabled(args, environ)
        elif command == "disable" and per_user:
            place = user_switch.user(environ, _home())
            folders = _projects(args.project)
            each: list[Path | None] = [None] if folders is None else [*folders]
            lines, code = [x for p in each for x in user_switch.disable(place, p)], 0
        elif command == "disable":
            target = switch.probe(switch.python_path(args.python or sys.executable))
            lines, code = switch.disable(target), 0
        else:
            target = None
            if not per_user:
                target = switch.probe(switch.python_path(args.python or sys.executable))
            if args.root is not None and not args.root.strip():
                raise SwitchError("--root is empty")
            root = Path(os.path.abspath(args.root or switch.default_root(environ, _home())))
            switch.check_root(root)
            import agent

            note = switch.agent_python_note(sys.executable, Path(agent.__file__))
            if target is None:
                place = user_switch.user(environ, _home())
                lines = user_switch.enable(place, sys.executable, root, _projects(args.project))
            else:
                lines = switch.enable(target, sys.executable, root)
            lines, code = lines + ([note] if note else []), 0
    except SwitchError as exc:
        print(f"{PROG} {command}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return code
