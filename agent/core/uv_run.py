"""A ``py_executable`` that is a ``uv run`` command line: which ones the agent builds itself.

Ray's uv-run hook (a driver started with ``uv run``) sets the job's ``py_executable`` to
``<uv> run <the driver's uv flags> --python X.Y.Z python``, and users write such lines by hand.
Each worker would then run ``uv run`` in its copy of the working dir, building a ``.venv`` there.
When the line is one the agent can build faithfully, ``parse_uv_run`` returns a ``UvRun``: the
flags that decide what the project's environment holds, normalised; the agent builds that
environment once, at create time (``agent.install.venvs.project_plan``), and the worker runs its
python.
Any other line is left to ``uv run`` as it is, and ``parse_uv_run`` says why (``Passthrough``),
so that the create logs one line saying so: never built wrongly.

Recognised: the program is ``uv`` (any path), then ``run``, then flags from the tables below,
then ``python`` (``python3``, ``python3.N``) and nothing after it (the worker appends its own
arguments), or nothing at all after the flags: Ray 2.51's hook writes ``<uv> run <flags>``, the
worker's script following, which uv runs with the project's python (``with_program`` gives such
a line ``python`` when it is left to uv). Flags that change what is installed are kept
(``SYNC_FLAGS``, ``--with``, ``--python``); those that change only how uv works here are dropped
(``_IGNORED``); any other flag (a workspace member, a requirements file, an index on the command
line, a script) passes the line through.

Pure: no I/O.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from agent.core.errors import echo

# Flags kept, each with whether it takes a value: they decide what ``uv sync`` installs.
SYNC_FLAGS: dict[str, bool] = {
    "--extra": True, "--all-extras": False, "--no-extra": True, "--no-dev": False,
    "--only-dev": False, "--group": True, "--no-group": True, "--only-group": True,
    "--all-groups": False, "--no-default-groups": False, "--no-editable": False,
    "--compile-bytecode": False,
}  # fmt: skip
# Flags of how the lock is read: --frozen (as it is), --locked (must be current), --no-sync
# (uv implies --frozen: the lock is not updated; the env is built from it here, once).
_LOCK_FLAGS = ("--frozen", "--locked", "--no-sync")
# Flags dropped, each with whether it takes a value: how uv runs, not what the env holds (a
# fresh venv is exact and isolated already; the cache and link mode are the agent's).
_IGNORED: dict[str, bool] = {
    "--isolated": False, "--exact": False, "--no-cache": False, "-n": False, "--offline": False,
    "--refresh": False, "--reinstall": False, "-q": False, "--quiet": False, "-v": False,
    "--verbose": False, "--no-progress": False, "--color": True, "--native-tls": False,
    "--link-mode": True, "--cache-dir": True, "--no-python-downloads": False,
    "--managed-python": False, "--no-managed-python": False,
}  # fmt: skip
_SHORT = {"-p": "--python", "-q": "-q", "-v": "-v", "-n": "-n"}
_PROGRAM = re.compile(r"python(3(\.\d{1,3})?)?")
# an absolute path to uv holding a space, unquoted (no quote, no backslash), then " run"
_UNQUOTED_UV = re.compile(r"/[^'\"\\]*?/uv run(?=\s|$)")
_MAX_WITH = 50  # packages named by --with
_MAX_WITH_CHARS = 500  # each


@dataclass(frozen=True, slots=True)
class UvRun:
    """A ``uv run`` line the agent builds itself: what decides the project's environment."""

    python: str | None  # --python's request (a version, or a path): the venv's interpreter
    lock: str  # "" (uv run's default: lock if stale), "frozen", "locked"
    sync_flags: tuple[str, ...]  # of SYNC_FLAGS, each "--flag" or "--flag=value", sorted
    with_packages: tuple[str, ...]  # --with's requirements, in order, deduplicated

    def identity(self) -> dict[str, object]:
        """What of the line decides the env (the package's name hashes it)."""
        return {
            "python": self.python,
            "lock": self.lock,
            "sync": list(self.sync_flags),
            "with": list(self.with_packages),
        }


@dataclass(frozen=True, slots=True)
class Passthrough:
    """A ``uv run`` line the agent leaves to uv, and why (one log line at create)."""

    reason: str


def is_uv_run(py_executable: str | None) -> bool:
    """Whether the command is ``uv run ...`` (by its first two words; not a parse)."""
    return bool(py_executable) and _after_run(py_executable or "") is not None


def _after_run(line: str) -> list[str] | None:
    """The words after ``<uv> run``, or None when the line is no ``uv run``. Ray's hook joins
    the driver's command line with spaces, unquoted: a uv whose absolute path has a space
    (``/home/me/My Tools/uv``) is taken up to its ``/uv run``, which Ray's own agent could
    not run at all."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    if len(words) >= 2 and os.path.basename(words[0]) == "uv" and words[1] == "run":
        return words[2:]
    unquoted = _UNQUOTED_UV.match(line)
    if unquoted is None:
        return None
    try:
        return shlex.split(line[unquoted.end() :])
    except ValueError:
        return None


def parse_uv_run(py_executable: str) -> UvRun | Passthrough:
    """The ``UvRun`` of a ``uv run`` line the agent builds itself, or why it passes it through.
    Call it on a line ``is_uv_run`` accepts."""
    words = _after_run(py_executable) or []
    python: str | None = None
    lock = ""
    sync: list[str] = []
    with_packages: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            break
        flag, eq, value = word.partition("=")
        flag = _SHORT.get(flag, flag)
        takes = _takes_value(flag)
        if takes is None:
            return Passthrough(f"its flag {echo(word, 60)} is not one the agent builds")
        if takes and not eq:
            if i + 1 >= len(words):
                return Passthrough(f"its flag {echo(word, 60)} has no value")
            i += 1
            value = words[i]
        i += 1
        if flag == "--python":
            python = value
        elif flag in _LOCK_FLAGS:
            lock = "locked" if flag == "--locked" and lock != "frozen" else "frozen"
        elif flag == "--with":
            with_packages.extend(p.strip() for p in value.split(",") if p.strip())
        elif flag in SYNC_FLAGS:
            sync.append(f"{flag}={value}" if takes else flag)
    program = words[i:]
    # no program: the worker's script follows (``uv run`` runs a ``.py`` with the project's
    # python), the line Ray 2.51's hook writes, as ``python`` would
    if len(program) > 1 or (program and not _PROGRAM.fullmatch(program[0])):
        return Passthrough(
            f"it runs {echo(' '.join(program), 60)}, not python (the worker's arguments follow)"
        )
    if len(with_packages) > _MAX_WITH or any(len(p) > _MAX_WITH_CHARS for p in with_packages):
        return Passthrough(f"its --with names more than {_MAX_WITH} packages, or a long one")
    return UvRun(
        python=python,
        lock=lock,
        sync_flags=tuple(sorted(set(sync))),
        with_packages=tuple(dict.fromkeys(with_packages)),
    )


def with_program(py_executable: str) -> str:
    """The line a worker is given when the agent leaves it to uv: a ``uv run`` line naming no
    program after its flags (Ray 2.51's hook writes ``<uv> run <flags>``, the worker's script
    following) gets ``python``, as Ray 2.60's hook writes it: ``uv run <flags> <script.py>``
    finds its project from the script's folder (where Ray is installed), not from the working
    dir; ``uv run <flags> python <script.py>`` from the working dir. Any other line, and one
    with a flag of unknown arity, as it is."""
    words = _after_run(py_executable)
    if words is None:
        return py_executable
    i = 0
    while i < len(words) and words[i].startswith("-"):
        flag, eq, _ = words[i].partition("=")
        takes = _takes_value(_SHORT.get(flag, flag))
        if takes is None:
            return py_executable
        i += 2 if takes and not eq else 1
    return py_executable if i < len(words) else f"{py_executable} python"


def _takes_value(flag: str) -> bool | None:
    """Whether a recognised flag takes a value; None for a flag the agent does not build."""
    if flag == "--python" or flag == "--with":
        return True
    if flag in _LOCK_FLAGS:
        return False
    if flag in SYNC_FLAGS:
        return SYNC_FLAGS[flag]
    return _IGNORED.get(flag)
