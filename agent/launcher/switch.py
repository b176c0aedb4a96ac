"""``rtenv-agent ray enable|disable|enabled [--python PATH]``: the switch that makes every Ray node
a Python environment starts (a bare ``ray.init()``, ``ray start``, a test's ``Cluster``) run this
agent, with no code edit.

``enable`` asks the target python (``PATH -I -c ...``) for its site-packages (``purelib``) and
writes two files there, nothing else:

- ``_rtenv_agent_switch.py``: a copy of ``agent/ops/ray_swap.py`` (standard library only), and its
  bytecode, compiled by the target python (read at each start, even under
  ``PYTHONDONTWRITEBYTECODE``);
- ``_rtenv_agent_switch.pth``: one ``import`` line, run at every interpreter start, calling
  ``arm(<agent python>, <root>)``: a finder that patches Ray's ``start_ray_process`` when Ray's
  ``services`` module loads (the raylet's agent command becomes ``<agent python> -u -I -m agent
  ray-agent --root=<root> <Ray's flags>``) and warns before Ray checks a node's socket paths.

The agent python is the one this command runs in (``sys.executable``): the agent runs from its
own installation, never from the target environment, so it need not be among the project's
dependencies nor land in a worker's venv. The root defaults to
``${XDG_CACHE_HOME:-~/.cache}/rtenv-agent/root``, one per user and machine; ``RTENV_ROOT`` in a
node's environment still wins. No ``dist-info`` is written: ``uv sync`` and ``pip`` leave the two
files alone (a venv made anew loses them: enable again, or per user). ``disable`` removes exactly
those two files and the module's bytecode; ``enabled`` tells: exit 0 when that python's nodes
run this agent, 1 when they run Ray's, saying why (off, or on but not in effect: ``not_in_effect``).
``enable``'s lines name ``rtenv-agent`` by its full path (``ray_swap.agent_cli``: it need not be on
PATH). A mistake (a PATH that is no python, a site-packages it cannot write) is one line, exit 2.
The switch that outlives a venv (``--user``, ``--project DIR``) is ``agent.launcher.user_switch``;
the command line of both, ``agent.launcher.switch_cli``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import echo
from agent.ops import ray_swap, user_hook

PROG = "rtenv-agent ray"
COMMANDS = ("enable", "disable", "enabled")
NAME = "_rtenv_agent_switch"  # the module's name in the target's site-packages, and the .pth's
PROBE_S = 60.0  # for the target python to answer (a cold interpreter on a slow disk)
MIN_PYTHON = (3, 9)  # Ray's oldest; ray_swap.py keeps to it
HEADER = (
    "# Written by `rtenv-agent ray enable` (runtime-env-agent): a copy of its "
    "agent/ops/ray_swap.py.\n"
    "# `rtenv-agent ray disable --python PATH` removes it and the .pth file beside it.\n"
)
# what the target python says of itself: its site-packages, its version, whether it has Ray (and
# which, from its metadata: Ray itself is not imported) and whether its start armed the switch
# (the .pth was run: what a driver's start does; or the per-user hook, asked with it on PYTHONPATH)
PROBE = """\
import importlib.metadata, importlib.util, json, sys, sysconfig
try:
    ray = importlib.metadata.version('ray')
except Exception:
    ray = ''
print(json.dumps({'purelib': sysconfig.get_paths()['purelib'], 'prefix': sys.prefix,
    'version': list(sys.version_info[:3]), 'ray': importlib.util.find_spec('ray') is not None,
    'ray_version': ray, 'finders': [type(f).__module__ for f in sys.meta_path]}))
"""
AGENT_PROBE = "import agent; print(agent.__file__)"
# the module's bytecode, written now by the target python: Python reads it at each start even
# where it writes none (PYTHONDONTWRITEBYTECODE), so the switch costs well under a millisecond
COMPILE = "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)"


class SwitchError(Exception):
    """A mistake: one line, exit 2."""


@dataclass(frozen=True)
class Target:
    """The python the switch applies to, as it answered."""

    python: str
    purelib: Path
    version: tuple[int, ...]
    has_ray: bool
    ray_version: str = ""  # from its metadata ("" where it has none)
    armed: bool = False  # its start ran the switch's .pth (or the per-user hook) and armed it
    stderr: str = ""  # what its start wrote on stderr (the switch's warning, if any), cut
    prefix: str = ""  # its sys.prefix: the Python environment's folder

    @property
    def pth(self) -> Path:
        return self.purelib / f"{NAME}.pth"

    @property
    def module(self) -> Path:
        return self.purelib / f"{NAME}.py"

    def bytecode(self) -> list[Path]:
        """The module's cached bytecode, as Python wrote it when the module was imported."""
        cache = self.purelib / "__pycache__"
        return sorted(cache.glob(f"{NAME}.*.pyc")) if cache.is_dir() else []


def pth_line(python: str, root: str) -> str:
    """The ``.pth`` file's text: a comment and the one line Python runs at start (paths written
    with ``ascii()``: the file is plain ASCII whatever the paths hold)."""
    return (
        f"# rtenv-agent ray enable: Ray nodes this python starts run runtime-env-agent's agent\n"
        f"import {NAME}; {NAME}.arm({python!a}, {root!a})\n"
    )


def read_pth(text: str) -> tuple[str, str | None] | None:
    """(agent python, root) from a ``.pth`` line ``enable`` wrote, or None for another text."""
    for line in text.splitlines():
        if not line.startswith("import "):
            continue
        try:
            tree = ast.parse(line)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "arm":
                try:
                    args = [ast.literal_eval(a) for a in node.args]
                except ValueError:
                    return None
                if args and all(isinstance(a, str | None) for a in args):
                    return args[0], (args[1] if len(args) > 1 else None)
    return None


def module_text() -> str:
    """What ``enable`` writes as the module: this agent's ray_swap.py, under a header."""
    return HEADER + Path(ray_swap.__file__).read_text(encoding="utf-8")


def default_root(environ: Mapping[str, str], home: Path | None) -> Path:
    """``$XDG_CACHE_HOME/rtenv-agent/root`` (an absolute XDG_CACHE_HOME), else
    ``~/.cache/rtenv-agent/root``."""
    cache = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(cache):
        return Path(cache) / "rtenv-agent" / "root"
    if home is None:
        raise SwitchError("no home folder to put the default root in: pass --root DIR")
    return home / ".cache" / "rtenv-agent" / "root"


def check_root(root: Path) -> None:
    """A root the agent can make and write: a folder, or under the nearest existing folder
    this user can write."""
    if root.exists() and not root.is_dir():
        raise SwitchError(f"--root {echo(str(root))} is not a folder")
    existing = root
    for _ in range(len(root.parts)):
        if existing.exists():
            break
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise SwitchError(
            f"the root {echo(str(root))} cannot be made or written: {echo(str(existing))} is "
            "not a folder this user can write (pass --root DIR)"
        )


def probe(python: str, hook: Path | None = None) -> Target:
    """Ask ``python`` (isolated, as nothing of the caller's may change its answer) for its
    site-packages, its version and whether it has Ray. With ``hook`` (the per-user switch's
    folder): started with that folder alone on its PYTHONPATH, armed by that hook or not."""
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise SwitchError(f"--python {echo(python)} is not an executable file")
    flags, env = ["-I"], None
    if hook is not None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        flags, env["PYTHONPATH"] = ["-s"], str(hook)
    try:
        done = subprocess.run(
            [python, *flags, "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_S,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SwitchError(f"--python {echo(python)} could not be run: {exc}") from None
    try:
        said = json.loads(done.stdout.strip().splitlines()[-1])
        purelib, version, has_ray = Path(said["purelib"]), tuple(said["version"]), said["ray"]
        ray_version, prefix = str(said.get("ray_version", "")), str(said.get("prefix", ""))
        armed = (user_hook.SWAP_MODULE if hook is not None else NAME) in said.get("finders", [])
    except (IndexError, ValueError, KeyError, TypeError):
        raise SwitchError(
            f"--python {echo(python)} is not a python (it did not answer "
            f"`python -I -c ...`: exit {done.returncode}, {echo(done.stderr.strip(), 200)})"
        ) from None
    if version < MIN_PYTHON:
        shown = ".".join(map(str, version))
        raise SwitchError(
            f"--python {echo(python)} is Python {shown}; the switch needs 3.9 or later"
        )
    stderr = echo(done.stderr.strip(), 300) if done.stderr.strip() else ""
    return Target(python, purelib, version, bool(has_ray), ray_version, armed, stderr, prefix)


def agent_location(python: str) -> str | None:
    """Where ``python`` imports the agent from, isolated (``-I``, as a raylet starts it); None
    when it cannot (or cannot be run)."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", AGENT_PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    where = done.stdout.strip()
    return where if done.returncode == 0 and where else None


def agent_python_note(python: str, ours: Path) -> str | None:
    """Refuses an agent python that cannot import this agent as the raylet will start it
    (``-I``); the note to print when it imports another copy of it (None: this one)."""
    where = agent_location(python)
    if where is None:
        raise SwitchError(
            f"this agent's python {echo(python)} cannot import the agent isolated (`-I`, as a "
            "raylet starts it): install runtime-env-agent in it, then run enable with it"
        )
    if Path(where).resolve() != ours.resolve():
        return (
            f"{PROG}: note: raylets will run the agent at {echo(where)} (what {echo(python)} "
            f"imports isolated), not this one at {echo(str(ours))}"
        )
    return None


def write_file(path: Path, text: str, keep_mode: bool = False) -> None:
    """``text`` into ``path`` whole or not at all (a temp file beside it, then a rename); with
    ``keep_mode``, into the file a link names, with the mode it had (a user's ~/.bashrc)."""
    if keep_mode:
        path = path.resolve()
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        if keep_mode and path.exists():
            os.chmod(temp, path.stat().st_mode & 0o7777)
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise SwitchError(f"cannot write {echo(str(path))}: {exc.strerror or exc}") from None


def _compile(target: Target) -> None:
    """The module's bytecode, by the target python (its version's); the module is removed when
    that python cannot compile it."""
    try:
        done = subprocess.run(
            [target.python, "-I", "-c", COMPILE, str(target.module)],
            capture_output=True,
            text=True,
            timeout=PROBE_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        failed = done.stderr.strip() if done.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)
    if failed:
        with contextlib.suppress(OSError):
            target.module.unlink()
        raise SwitchError(f"{echo(target.python)} cannot compile the switch: {echo(failed, 300)}")


def enable(target: Target, agent_python: str, root: Path) -> list[str]:
    """Write the module, then the ``.pth`` (so a started interpreter never finds the one without
    the other); the lines to print."""
    if not target.purelib.is_dir() or not os.access(target.purelib, os.W_OK | os.X_OK):
        raise SwitchError(
            f"cannot write into {echo(str(target.purelib))}, the site-packages of "
            f"{echo(target.python)} (not a folder this user can write)"
        )
    was = read_pth(target.pth.read_text(errors="replace")) if target.pth.is_file() else None
    write_file(target.module, module_text())
    _compile(target)
    write_file(target.pth, pth_line(agent_python, str(root)))
    state = "enabled" if was is None else "enabled again (updated)"
    cli = ray_swap.agent_cli(agent_python)  # rtenv-agent by its full path: not always on PATH
    lines = [
        f"{PROG}: {state} for {target.python}: the Ray nodes it starts (ray.init(), ray start, "
        "Cluster) run this agent",
        f"  agent python: {agent_python}",
        f"  root: {root} (RTENV_ROOT, where set, wins)",
        f"  wrote: {target.pth}, {target.module}",
        f"  what it holds: {ray_swap.shell_line([*cli, 'info', '--root', str(root)])}",
        f"  undo: {ray_swap.shell_line([*cli, 'ray', 'disable', '--python', target.python])}",
    ]
    if not target.has_ray:
        lines.append(f"  note: ray is not importable in {target.python} (yet)")
    elif old := ray_swap.ray_version_problem(target.ray_version):
        lines.append(
            f"  note: {old}: the nodes it starts run Ray's own agent until Ray is upgraded"
        )
    return lines


def disable(target: Target) -> list[str]:
    """Remove the ``.pth`` first (no interpreter then imports the module), the module and its
    bytecode; the line to print."""
    removed = []
    for path in (target.pth, target.module, *target.bytecode()):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SwitchError(f"cannot remove {echo(str(path))}: {exc.strerror or exc}") from None
        removed.append(str(path))
    with contextlib.suppress(OSError):  # the folder Python made for that bytecode, if now empty
        (target.purelib / "__pycache__").rmdir()
    if not removed:
        return [f"{PROG}: not enabled for {target.python}; nothing to remove"]
    return [
        f"{PROG}: disabled for {target.python}: the Ray nodes it starts run Ray's own agent; "
        f"removed {', '.join(removed)}"
    ]


def status(
    target: Target, locate: Callable[[str], str | None] = agent_location
) -> tuple[int, list[str]]:
    """Exit 0 and what is on (agent python, root); or 1 and why the nodes that python starts run
    Ray's own agent: the switch is off, or on but not in effect (``not_in_effect``)."""
    if not target.pth.is_file():
        return 1, [f"{PROG}: off for {target.python} (no {target.pth})"]
    baked = read_pth(target.pth.read_text(errors="replace"))
    if baked is None or not target.module.is_file():
        return 1, [
            f"{PROG}: off for {target.python}: {target.pth} is not as enable writes it, or its "
            "module is missing (run enable again, or disable)"
        ]
    python, root = baked
    lines = [f"  agent python: {python}", f"  root: {root} (RTENV_ROOT, where set, wins)"]
    if (problem := not_in_effect(target, python, locate)) is not None:
        again = [*ray_swap.agent_cli(sys.executable), "ray", "enable", "--python", target.python]
        again += ["--root", root] if root else []
        return 1, [
            f"{PROG}: on for {target.python}, but not in effect: {problem}",
            *lines,
            f"  fix: {ray_swap.shell_line(again)} (or disable)",
        ]
    if target.module.read_text(encoding="utf-8", errors="replace") != module_text():
        lines.append("  note: its module is not this agent's version: run enable again")
    if not target.has_ray:
        lines.append(f"  note: ray is not importable in {target.python} (yet)")
    return 0, [f"{PROG}: on for {target.python}", *lines]


def not_in_effect(
    target: Target, python: str, locate: Callable[[str], str | None] = agent_location
) -> str | None:
    """Why a switch that is on (its two files as enable wrote them) changes nothing, and what
    that python's Ray nodes then run; None when it is in effect. In the order a node meets
    them: that python's start does not arm it (the .pth is not run there, or arm failed); its
    Ray is older than this agent serves (the swap leaves Ray's agent: ``ray_swap.swapping``); the
    agent python is gone (the same); it cannot import the agent isolated (the raylet would
    start an agent that exits at once, and fate-share with it)."""
    rays = "the Ray nodes it starts run Ray's own agent"
    if not target.armed:
        said = f" (its start said: {target.stderr})" if target.stderr else ""
        return f"{target.python} does not arm it at start{said}: {target.pth} is not run there"
    if target.has_ray and (old := ray_swap.ray_version_problem(target.ray_version)):
        return f"{old}: {rays}"
    if not os.access(python, os.X_OK):
        return f"the agent python {python} is gone: {rays}"
    if locate(python) is None:
        return (
            f"the agent python {python} cannot import the agent isolated (-I, as a raylet "
            "starts it): the Ray nodes it starts would fail to start"
        )
    return None


def python_path(given: str) -> str:
    """``--python`` as an absolute path, not resolved (a venv's python is a link out of the
    venv); a bare name (``python3``) is looked up on PATH."""
    if os.sep not in given and (found := shutil.which(given)) is not None:
        return os.path.abspath(found)
    return os.path.abspath(given)
