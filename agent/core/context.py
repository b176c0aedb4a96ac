"""The context a worker is started with: its variables (PYTHONPATH included), cwd and python.

Pure: where each package lives is a function of its key (``UriStore.path_for``), so the context,
and whether a process could be started with it, are known before anything is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.core.runtime_env import EnvLimits, RuntimeEnv, check_env_var_size
from agent.core.uris import UriKey, UriKind


@dataclass(frozen=True)
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
    """PYTHONPATH is the working dir, then each py_module root in order, then the env's own."""
    paths = [str(path_for(key)) for key in env.uri_keys if key.kind is not UriKind.PIP]
    env_vars = dict(env.env_vars)
    own = env_vars.get("PYTHONPATH")
    if own:
        paths.append(own)
    if paths:
        env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    cwd = str(path_for(env.uri_keys[0])) if env.working_dir is not None else ""
    check_env_var_size(env_vars, limits)
    venvs = [key for key in env.uri_keys if key.kind is UriKind.PIP]
    if venvs:  # the env's own virtualenv; the working dir and py_modules still come first
        py_executable = str(path_for(venvs[0]) / "bin" / "python")
    return WorkerContext(env_vars=env_vars, cwd=cwd, py_executable=py_executable)
