"""The context a worker is started with: its variables (PYTHONPATH included), cwd, the command
it runs under and its Java jars.

``py_executable`` is a command line in shell words (a python, or a program and its arguments:
Ray's ``py_executable``); a client splits it (``shlex.split``), with no expansion, and appends the
worker's own arguments. The env's own ``py_executable`` wins over a pip venv's python, as in Ray
(its ``py_executable`` plugin runs after its ``pip`` plugin and replaces the python): the worker
then gets the venv's packages only if that command runs the venv's python. Else the venv's
python, else the agent's (``--python``), each a path quoted as one shell word (``shlex.quote``:
as it is unless it holds a space or a quote). ``java_jars``: each java_jars package's folder, in the
env's order (a Java worker puts ``<folder>/*`` and ``<folder>`` on its class path).

Each package is placed as its kind's row of ``agent.core.kinds`` says, those its create derived
too. Pure: where each package lives is a function of its key (``UriStore.path_for``), so the
context, and whether a process could be started with it, are known before anything is
downloaded.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.kinds import VENV_PYTHON, VenvPlace, row_of
from agent.core.packages import Package
from agent.core.runtime_env import EnvLimits, RuntimeEnv, check_env_var_size
from agent.core.uris import UriKey


@dataclass(frozen=True, slots=True)
class WorkerContext:
    env_vars: dict[str, str]
    cwd: str  # "" leaves the worker's cwd as it is
    py_executable: str  # a command line in shell words: the python, or a program and arguments
    java_jars: tuple[str, ...] = ()  # the java_jars folders, in the env's order


def build_context(
    env: RuntimeEnv,
    path_for: Callable[[UriKey], Path],
    *,
    py_executable: str,
    limits: EnvLimits,
    derived: Sequence[Package] = (),
) -> WorkerContext:
    """Each package of the env, then each its create ``derived`` (a ``uv run`` project's venv, a
    set's venv keyed by the files it reads), is placed as its kind's row says
    (``agent.core.kinds``): PYTHONPATH is the folders put on it in order (the working dir, then
    each py_module root in order), then the env's own; the cwd and the python are those of the
    first package giving one, the env's own ``py_executable`` winning over the python; a ``uv
    run`` project's venv runs in place of the env's line (its python, ``VIRTUAL_ENV`` set, as
    ``uv run`` would); the Java jars' folders in order."""
    paths: list[str] = []
    cwd = ""
    python = None
    project: Path | None = None
    jars: list[str] = []
    for package in (*env.packages, *derived):
        placement = row_of(package.key.kind).placement
        folder = path_for(package.key)
        if placement.on_path:
            paths.append(str(folder))
        if placement.cwd and not cwd:
            cwd = str(folder)
        if placement.venv is VenvPlace.PROJECT:
            project = project or folder
        elif placement.venv is not None and python is None:
            python = str(folder / VENV_PYTHON)
        if placement.java:
            jars.append(str(folder))
    env_vars = dict(env.env_vars)
    own = env_vars.get("PYTHONPATH")
    if own:
        paths.append(own)
    if paths:
        env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    own_command = env.py_executable
    if project is not None:
        env_vars["VIRTUAL_ENV"] = str(project)
        own_command = shlex.quote(str(project / VENV_PYTHON))
    check_env_var_size(env_vars, limits)
    command = own_command or shlex.quote(python or py_executable)  # a path: one word
    return WorkerContext(env_vars=env_vars, cwd=cwd, py_executable=command, java_jars=tuple(jars))
