"""The context a worker is started with: its variables (PYTHONPATH included), cwd and python.

Pure: where each package lives is a function of its key (``UriStore.path_for``), so the context,
and whether a process could be started with it, are known before anything is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.core.packages import placement_of
from agent.core.runtime_env import EnvLimits, RuntimeEnv, check_env_var_size
from agent.core.uris import UriKey


@dataclass(frozen=True, slots=True)
class WorkerContext:
    env_vars: dict[str, str]
    cwd: str  # "" leaves the worker's cwd as it is
    py_executable: str


def build_context(
    env: RuntimeEnv,
    path_for: Callable[[UriKey], Path],
    *,
    py_executable: str,
    limits: EnvLimits,
) -> WorkerContext:
    """Each package is placed as its kind says (``PLACEMENTS``): PYTHONPATH is the folders put
    on it in the env's order (the working dir, then each py_module root in order), then the
    env's own; the cwd and the python are those of the first package giving one."""
    paths: list[str] = []
    cwd = ""
    python = None
    for package in env.packages:
        placement = placement_of(package.key.kind)
        folder = path_for(package.key)
        if placement.on_path:
            paths.append(str(folder))
        if placement.cwd and not cwd:
            cwd = str(folder)
        if placement.python is not None and python is None:
            python = str(folder / placement.python)
    env_vars = dict(env.env_vars)
    own = env_vars.get("PYTHONPATH")
    if own:
        paths.append(own)
    if paths:
        env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    check_env_var_size(env_vars, limits)
    return WorkerContext(env_vars=env_vars, cwd=cwd, py_executable=python or py_executable)
