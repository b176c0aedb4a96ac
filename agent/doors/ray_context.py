"""The context a Ray worker is started with, in Ray's own format (Ray 2.60's
``RuntimeEnvContext``): the raylet hands this JSON to ``RuntimeEnvContext(**json.loads(...))``,
so it has exactly Ray's five keys (an unknown one crashes the worker before it starts).

Pure: where each package lives is a function of its key (``UriStore.path_for``); how it is put
on the worker is its kind's placement (``agent.core.kinds``), as for ``build_context`` (a kind
added there is placed here too), the packages its create derived included.

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
- A venv that sees the node's packages (``VenvPlace.NODE_SITE``, what the Ray door builds:
  Ray among them) is put on the worker as Ray's agent puts its own: the worker runs
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
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.core.kinds import VENV_BIN, VENV_PYTHON, VenvPlace, row_of
from agent.core.packages import Package
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
    derived: Sequence[Package] = (),
) -> dict[str, object]:
    """The worker context of ``env`` as Ray's worker reads it (see the module docstring), its
    packages and those its create ``derived`` each placed as its kind's row says."""
    roots: list[str] = []  # the folders put on the path, in the env's order of packages
    site_packages: list[str] = []
    venv_bins: list[str] = []
    command_prefix: list[str] = []
    jars: list[str] = []
    own_venv: Path | None = None  # a venv that sees the node's: the worker runs its python
    project: Path | None = None  # a uv run project's venv: runs in place of the env's line
    major, minor = python_version
    for package in (*env.packages, *derived):
        placement = row_of(package.key.kind).placement
        folder = path_for(package.key)
        if placement.on_path:
            roots.append(str(folder))
        if placement.cwd and not command_prefix:
            command_prefix = ["cd", shlex.quote(str(folder)), "&&"]
        if placement.venv is VenvPlace.PROJECT:
            project = project or folder
        elif placement.venv is VenvPlace.NODE_SITE:
            own_venv = own_venv or folder
            venv_bins.append(str(folder / VENV_BIN))
        elif placement.venv is VenvPlace.ISOLATED:  # the worker keeps the base python
            site_packages.append(str(folder / "lib" / f"python{major}.{minor}" / "site-packages"))
            venv_bins.append(str(folder / VENV_BIN))
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
    if project is not None:
        venv_bins.insert(0, str(project / VENV_BIN))
        env_vars["VIRTUAL_ENV"] = str(project)
        own_command = shlex.quote(str(project / VENV_PYTHON))
    elif own_venv is not None:
        env_vars["VIRTUAL_ENV"] = str(own_venv)
        own_command = own_command or shlex.quote(str(own_venv / VENV_PYTHON))
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
