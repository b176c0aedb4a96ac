"""The context a Ray worker is started with, in Ray's own format (Ray 2.60's
``RuntimeEnvContext``): the raylet hands this JSON to ``RuntimeEnvContext(**json.loads(...))``,
so it has exactly Ray's five keys (an unknown one crashes the worker before it starts).

Pure: where each package lives is a function of its key (``UriStore.path_for``); how it is put
on the worker is its kind's row of ``PLACEMENTS``, as for ``build_context`` (a kind added
there is placed here too).

- ``command_prefix``: ``["cd", <quoted working dir>, "&&"]`` with a working_dir (Ray joins the
  prefix, the python and its arguments with spaces and runs it with ``bash -c``), else ``[]``.
- ``env_vars``: the env's own, with ``PYTHONPATH`` = the working dir, then each py_modules root
  (in the env's order), then a pip venv's site-packages, then the env's own ``PYTHONPATH``, then
  the node's (the agent's process's, as Ray's agent does); and with a pip venv, ``PATH`` = the
  venv's ``bin``, then the env's own ``PATH`` or else ``${PATH}`` (Ray's worker expands
  ``${NAME}`` from its own environment).
- ``py_executable``: the env's own ``py_executable`` when it names one (Ray's worker runs
  ``exec <py_executable> <args>`` under ``bash -c``, so it is a command line, as Ray's is; it
  wins over a pip venv, as Ray's ``py_executable`` plugin runs after its ``pip`` plugin, and a
  bare ``python`` in it finds the venv's first on ``PATH``), else a Ray-semantics venv's
  python (below), else the base python (quoted as one shell word, as the working dir is),
  also with an isolated venv (the gRPC door's, which has no Ray): its packages reach the
  worker through ``PYTHONPATH``.
- A venv with Ray's semantics (``node_site``, what the Ray door builds: it sees the node's
  packages, Ray among them) is put on the worker as Ray's agent puts its own: the worker runs
  the venv's python (unless the env's own ``py_executable`` wins, as above), ``VIRTUAL_ENV`` is
  the venv and its ``bin`` first on ``PATH`` (what Ray's ``source <venv>/bin/activate`` sets),
  and its site-packages is not on ``PYTHONPATH`` (the venv's python has it, ``.pth`` files
  processed).
- ``override_worker_entrypoint``: None; ``java_jars``: each java_jars package's folder, in the
  env's order (Ray's Java worker puts ``<folder>/*`` and ``<folder>`` on its class path).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

from agent.core.packages import placement_of
from agent.core.runtime_env import RuntimeEnv
from agent.core.uris import UriKey
from agent.core.uv_run import with_program

# Ray's RuntimeEnvContext.__init__ takes exactly these (ray/_private/runtime_env/context.py).
RAY_CONTEXT_KEYS = (
    "command_prefix",
    "env_vars",
    "py_executable",
    "override_worker_entrypoint",
    "java_jars",
)


def build_ray_context(
    env: RuntimeEnv,
    path_for: Callable[[UriKey], Path],
    *,
    py_executable: str,
    node_pythonpath: str,
    python_version: tuple[int, int],
    uv_venv: Path | None = None,
) -> dict[str, object]:
    """The worker context of ``env`` as Ray's worker reads it (see the module docstring).
    ``uv_venv``: a ``uv run`` env's project venv, built by the agent: the worker runs its
    python, ``VIRTUAL_ENV`` set and its ``bin`` first on ``PATH``, as ``uv run`` would; or the
    venv of requirements files the env's working dir holds, or of a set naming files of the
    node (keyed by their bytes), placed as its own pip venv."""
    roots: list[str] = []  # the folders put on the path, in the env's order of packages
    site_packages: list[str] = []
    venv_bins: list[str] = []
    command_prefix: list[str] = []
    jars: list[str] = []
    own_venv: Path | None = None  # a venv with Ray's semantics: the worker runs its python
    major, minor = python_version
    for package in env.packages:  # each placed as its kind's row of PLACEMENTS says
        placement = placement_of(package.key.kind)
        folder = path_for(package.key)
        if placement.on_path:
            roots.append(str(folder))
        if placement.cwd and not command_prefix:
            command_prefix = ["cd", shlex.quote(str(folder)), "&&"]
        if placement.python is not None and placement.node_site:
            own_venv = folder
            venv_bins.append(str((folder / placement.python).parent))
        elif placement.python is not None:  # an isolated venv: the worker keeps the base python
            site_packages.append(str(folder / "lib" / f"python{major}.{minor}" / "site-packages"))
            venv_bins.append(str((folder / placement.python).parent))
        if placement.java:
            jars.append(str(folder))
    env_vars = dict(env.env_vars)
    paths = roots + site_packages
    own = env_vars.get("PYTHONPATH")
    if paths:
        if own:
            paths.append(own)
        if node_pythonpath:
            paths.append(node_pythonpath)
        env_vars["PYTHONPATH"] = os.pathsep.join(paths)
    own_command = env.py_executable and with_program(env.py_executable)
    if uv_venv is not None and env.uv_run is None:  # made from the working dir's files:
        own_venv = uv_venv  # placed as the env's own pip venv (its py_executable still wins)
        venv_bins.insert(0, str(uv_venv / "bin"))
        uv_venv = None
    if uv_venv is not None:
        venv_bins.insert(0, str(uv_venv / "bin"))
        env_vars["VIRTUAL_ENV"] = str(uv_venv)
        own_command = shlex.quote(str(uv_venv / "bin" / "python"))
    elif own_venv is not None:
        env_vars["VIRTUAL_ENV"] = str(own_venv)
        own_command = own_command or shlex.quote(str(own_venv / "bin" / "python"))
    if venv_bins:
        env_vars["PATH"] = os.pathsep.join([*venv_bins, env_vars.get("PATH") or "${PATH}"])
    context: dict[str, object] = {
        "command_prefix": command_prefix,
        "env_vars": env_vars,
        "py_executable": own_command or shlex.quote(py_executable),
        "override_worker_entrypoint": None,
        "java_jars": jars,
    }
    assert tuple(context) == RAY_CONTEXT_KEYS, f"context keys {tuple(context)}"
    return context
