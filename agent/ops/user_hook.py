"""The per-user Ray switch's hook: what ``rtenv-agent ray enable --user`` (or ``--project DIR``)
puts in a folder of the user's, ``${XDG_DATA_HOME:-~/.local/share}/rtenv-agent/switch``, which a
marked block in the user's shell startup files puts first on ``PYTHONPATH``. Every Python the
user starts from such a shell, of any version and in any venv (a venv made anew included: it
processes no ``.pth`` of the user's nor of its base interpreter, but reads the environment),
imports the folder's ``sitecustomize.py`` (``SHIM``) at start. Standard library only, and
nothing of ``agent``: this file is copied there as ``_rtenv_agent_user_hook.py``, beside a copy
of ``ray_swap.py`` (``_rtenv_agent_user_switch.py``) and the config (``switch.conf``).

- ``SHIM`` (the ``sitecustomize.py``, in a syntax every Python reads): first the next
  ``sitecustomize`` on the path runs (Debian's, a conda env's, another tool's: this folder must
  not hide it), then, on Python 3.9 or later, ``run``.
- ``Config``/``parse_config``/``config_text``: the agent python, the root, and the scope: every
  Python environment (``ALL``) or those whose folder (``sys.prefix``) is one of the listed
  project folders or inside one (a uv project's ``.venv``; a venv kept elsewhere,
  ``UV_PROJECT_ENVIRONMENT``, by naming its own folder).
- ``covers`` (pure): whether a prefix is in the scope (never the agent's own environment).
  ``ray_on_path``: whether Ray is on the path at all (a stat per path entry: a Python without
  Ray imports nothing more).
- ``run``: reads the config and arms ``ray_swap.arm(python, root)`` exactly as the per-venv
  ``.pth`` does, only where the scope covers this Python, Ray is on its path, and the venv's own
  switch (its ``.pth``, which wins) did not arm already. Never in the agent's own process: a
  raylet starts it isolated (``-I``), which ignores ``PYTHONPATH``. It never raises: a config it
  cannot read is one line on stderr, and the Python starts as if the switch were off.

It runs on the user's Pythons (3.9 or later): no syntax or call newer than that.
"""

from __future__ import annotations

import os
import sys

CONFIG = "switch.conf"  # beside this module, in the hook folder
SWAP_MODULE = "_rtenv_agent_user_switch"  # the copy of ray_swap.py in the hook folder
VENV_SWITCH = "_rtenv_agent_switch"  # the per-venv switch's module: where it armed, it wins
ALL = "all"  # the scope: every Python environment
SAID = "rtenv-agent: the per-user Ray switch"
# The sitecustomize.py: in a syntax Python 2.7 and every 3.x reads, as PYTHONPATH reaches them
# all. The next sitecustomize runs first (it may change sys.path), then the hook, on 3.9+.
SHIM = """\
# Written by `rtenv-agent ray enable --user` (runtime-env-agent), on PYTHONPATH through a marked
# block in your shell startup files; `rtenv-agent ray disable --user` removes both.
import os
import sys


def _rtenv_agent_chain(here):
    # the next sitecustomize on the path (this folder left out) runs, as it would without us
    name = "sitecustomize"
    mine = sys.modules.pop(name, None)
    saved = list(sys.path)
    gone = [i for i, p in enumerate(saved) if os.path.abspath(p or os.curdir) == here]
    sys.path[:] = [p for i, p in enumerate(saved) if i not in gone]
    try:
        __import__(name)
    except ImportError as exc:
        if getattr(exc, "name", name) != name:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n"
                             "%s: %s\\n" % (type(exc).__name__, exc))
    except Exception as exc:
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n"
                         "%s: %s\\n" % (type(exc).__name__, exc))
    for i in gone:  # back where it was; what the next one added stays
        sys.path.insert(i, saved[i])
    if name not in sys.modules and mine is not None:
        sys.modules[name] = mine


try:
    _rtenv_agent_chain(os.path.dirname(os.path.abspath(__file__)))
    if sys.version_info >= (3, 9):
        import _rtenv_agent_user_hook

        _rtenv_agent_user_hook.run(os.path.dirname(os.path.abspath(__file__)))
except Exception as exc:  # never stop a Python from starting
    sys.stderr.write("rtenv-agent: the per-user Ray switch is off here: %r\\n" % (exc,))
"""


class ConfigError(ValueError):
    """A config that is not as ``enable --user`` writes it."""


class Config:
    """The agent python, the root, and the folders covered (None: every Python environment)."""

    __slots__ = ("projects", "python", "root")

    def __init__(self, python: str, root: str, projects: tuple[str, ...] | None) -> None:
        self.python, self.root, self.projects = python, root, projects

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and (self.python, self.root, self.projects) == (
            other.python,
            other.root,
            other.projects,
        )

    def __hash__(self) -> int:
        return hash((self.python, self.root, self.projects))


def config_text(config: Config) -> str:
    """The config file: a comment, then ``key=value`` lines (paths as they are: ``enable``
    refuses one holding a newline)."""
    lines = [
        "# rtenv-agent ray enable --user: read by sitecustomize.py beside it at every Python start",
        f"python={config.python}",
        f"root={config.root}",
    ]
    if config.projects is None:
        lines.append(f"scope={ALL}")
    else:
        lines += [f"project={folder}" for folder in config.projects]
    return "\n".join(lines) + "\n"


def parse_config(text: str) -> Config:
    """The config ``config_text`` wrote; a ``ConfigError`` saying what is wrong otherwise."""
    python = root = ""
    projects: list[str] = []
    scope_all = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not value:
            raise ConfigError(f"line {number} is not key=value")
        if key == "python":
            python = value
        elif key == "root":
            root = value
        elif key == "project" and os.path.isabs(value):
            projects.append(value)
        elif key == "scope" and value == ALL:
            scope_all = True
        else:
            raise ConfigError(f"line {number}: unknown {key!r} (or a value it cannot take)")
    if not os.path.isabs(python) or not os.path.isabs(root):
        raise ConfigError("it names no absolute python= and root=")
    if scope_all == bool(projects):
        raise ConfigError("it needs scope=all or project= lines, not both")
    return Config(python, root, None if scope_all else tuple(projects))


def _inside(path: str, folder: str) -> bool:
    folder = folder.rstrip(os.sep) or os.sep
    return path == folder or path.startswith(folder if folder == os.sep else folder + os.sep)


def agents_own(config: Config, prefix: str) -> bool:
    """Whether ``prefix`` is the agent's own environment (its python's venv): the switch leaves
    it alone (``rtenv-agent ray start`` there keeps its own rules)."""
    return os.path.dirname(os.path.dirname(config.python)) == prefix


def covers(config: Config, prefix: str, real_prefix: str | None = None) -> bool:
    """Whether the scope covers the Python environment at ``prefix`` (``sys.prefix``; its
    resolved path too, when given: a project reached through a link); never the agent's own."""
    if agents_own(config, prefix):
        return False
    if config.projects is None:
        return True
    paths = [prefix] if real_prefix is None else [prefix, real_prefix]
    return any(_inside(path, folder) for path in paths for folder in config.projects)


def ray_on_path(path: list[str]) -> bool:
    """Whether a ``ray`` package is on ``path`` (the working dir's entry left out)."""
    return any(p and os.path.isfile(os.path.join(p, "ray", "__init__.py")) for p in path)


_warned: list[str] = []


def _warn_once(message: str) -> None:
    if _warned:
        return
    _warned.append(message)
    try:
        sys.stderr.write(f"{SAID} is off in this process: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr: nothing to say it on
        pass


def run(folder: str) -> bool:
    """At a Python's start (``SHIM``): arm the switch where the config's scope covers this
    Python and Ray is on its path; whether it armed. Never raises."""
    try:
        if any(type(f).__module__ == VENV_SWITCH for f in sys.meta_path):
            return False  # the venv's own switch armed: its agent python and root win
        try:
            with open(os.path.join(folder, CONFIG), encoding="utf-8") as file:
                config = parse_config(file.read())
        except FileNotFoundError:
            return False  # disabled while this shell still names the folder
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            _warn_once(
                f"cannot read {os.path.join(folder, CONFIG)} ({exc}): run `rtenv-agent ray "
                "enable --user` again, or `rtenv-agent ray disable --user`"
            )
            return False
        if not ray_on_path(sys.path):
            return False
        if not covers(config, sys.prefix) and not covers(
            config, sys.prefix, os.path.realpath(sys.prefix)
        ):
            return False
        swap = __import__(SWAP_MODULE)
        swap.arm(config.python, config.root)
        return True
    except Exception as exc:  # never stop a Python from starting
        _warn_once(repr(exc))
        return False
