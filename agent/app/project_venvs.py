"""Venvs an env's create derives once its working dir is installed: a ``uv run`` env's project
venv, and a Ray env's venv whose requirements files its working dir holds.

The env names a working dir and a ``uv run`` line (``RuntimeEnv.uv_run``). When the line is one the
agent builds (a ``UvRun``), its create, after the env's own packages are installed, plans the
project's venv (``plan_project``: read, check and lock the project in a scratch folder of its own,
removed after), holds the venv's key for the env (``RefTables.derive``: counted and released with
the env's own keys) and installs it through the store, single-flight and counted in the budget as
every package. The env's record keeps the package (``EnvRecord.derived``), placed in the worker's
context as its kind says, as the env's own. A line left to uv (a ``Passthrough``, at parse or at
plan) is said in one log line per create that installs.

An env whose ``pip`` or ``uv`` packages read ``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/<file>``
(``RuntimeEnv.wd_requirements``, the Ray door's) gets its venv the same way: its files read from the
installed working dir (``agent.install.venvs.wd_read.read_field``, in a thread), the field they make
parsed as any, the venv held for the env, kept in its record and installed through the store.

An env whose ``pip`` or ``uv`` set names files or folders of the node (``RuntimeEnv.local_venv``,
either door's), or whose requirements files do, gets its venv the same way too: their bytes read
(``agent.install.venvs.local_read``, in a thread) into the venv's key, once per life of the env (a
live env's creates share the venv its first create made, as its workers do; the first create
after its last reference is gone reads them again).

A derived uv venv whose ``uv_version`` needs a uv of its own (``agent.core.uv_tool``) gets it
first: named by the env when its parse saw the set (a set naming files of the node), else
(requirements files) held for the env the same way and installed before the venv.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from agent.app.config import Settings
from agent.app.records import EnvRecord
from agent.core.packages import Package, tool_package, venv_package
from agent.core.pip_spec import PipSpec
from agent.core.refs import RefTables
from agent.core.roots import FileRoots
from agent.core.runtime_env import RuntimeEnv
from agent.core.uris import UriKey, UriKind
from agent.core.uv_run import Passthrough
from agent.core.uv_spec import UvSpec
from agent.core.wd_requirements import venv_spec
from agent.install.disk.root import remove_tree
from agent.install.venvs.local_read import read_contents
from agent.install.venvs.project_plan import Planning, plan_project
from agent.install.venvs.wd_read import read_field
from agent.state.store import UriStore

log = logging.getLogger(__name__)


class ProjectVenvs:
    """The service's part for ``uv run`` envs."""

    def __init__(
        self,
        settings: Settings,
        store: UriStore,
        tables: RefTables,
        note: Callable[[tuple[UriKey, ...]], None],
    ) -> None:
        self._store = store
        self._tables = tables
        self._note = note  # the service's: a package's last use, for the index
        cache = store.wheel_cache
        self._agent_uv = "" if cache is None else cache.version  # as the parse's
        self._planning = Planning(
            uv=None if cache is None else cache.uv,
            roots=FileRoots.of(settings.allow_file_roots),
            logs=store.root / "logs",
        )

    async def derive(self, env: RuntimeEnv, record: EnvRecord) -> None:
        """Plan, hold and install the env's project venv (its own packages installed), or say
        why its line is left to uv; or its venv of requirements files. Called by a create,
        under its timeout; what it holds is given back with the env's references if the create
        fails."""
        if env.local_venv is not None:  # never with a uv run line, nor requirements files
            await self._hold_venv(env, record, env.local_venv)
            return
        run = env.uv_run
        if run is None:
            await self._derive_requirements(env, record)
            return
        if isinstance(run, Passthrough):
            _log_passthrough(env, run)
            return
        wd = next(p.key for p in env.packages if p.key.kind is UriKind.WORKING_DIR)
        scratch = self._store.scratch_folder()
        try:
            planned = await plan_project(
                self._store.path_for(wd),
                run,
                wd_uri=wd.uri,
                planning=self._planning,
                scratch=scratch,
                label=f"env {env.env_id}'s uv run project",
            )
        finally:
            await asyncio.shield(asyncio.to_thread(remove_tree, scratch))
        if isinstance(planned, Passthrough):
            _log_passthrough(env, planned)
            return
        await self._hold_and_install(env, record, planned)

    async def _derive_requirements(self, env: RuntimeEnv, record: EnvRecord) -> None:
        """Read the env's requirements files from its installed working dir, then hold and
        install the venv they make (nothing if they name no requirement)."""
        wanted = env.wd_requirements
        if wanted is None:
            return
        wd = next(p.key for p in env.packages if p.key.kind is UriKind.WORKING_DIR)
        label = f"env {env.env_id}'s {wanted.tool} field"
        folder = self._store.path_for(wd)
        value = await asyncio.to_thread(read_field, wanted, folder, label)
        spec = venv_spec(wanted, value, self._planning.roots)
        if spec is not None:
            await self._hold_venv(env, record, spec)

    async def _hold_venv(self, env: RuntimeEnv, record: EnvRecord, spec: PipSpec | UvSpec) -> None:
        """Hold and install the venv of a pip or uv set; one naming files or folders of the
        node is keyed by their bytes, read now (in a thread): a file rebuilt since the env's
        last life is another venv."""
        tool = "pip" if isinstance(spec, PipSpec) else "uv"
        if spec.sources:
            label = f"env {env.env_id}'s {tool} field"
            contents = await read_contents(spec.sources, self._planning.roots, label)
            spec = dataclasses.replace(spec, contents=contents)
        uv = tool_package(spec, self._agent_uv)
        if uv is not None and uv.key not in env.uri_keys:  # the uv of a uv_version in its
            # files: held for the env, installed before the venv it builds (``ensures``)
            self._tables.derive(env.env_id, [uv.key])
            self._note((uv.key,))
            await self._store.ensure(uv)
        await self._hold_and_install(env, record, venv_package(env.dialect.venv_kind(tool), spec))

    async def _hold_and_install(self, env: RuntimeEnv, record: EnvRecord, venv: Package) -> None:
        """Count the derived venv for the env, keep it in its record, install it."""
        self._tables.derive(env.env_id, [venv.key])
        if record.derived is None:
            record.derived = venv
        self._note((venv.key,))
        await self._store.ensure(venv)


def _log_passthrough(env: RuntimeEnv, why: Passthrough) -> None:
    log.info(
        "runtime env %s: its uv run line is left to uv in each worker: %s",
        env.env_id,
        why.reason,
        extra={"env_id": env.env_id, "reason": why.reason},
    )
