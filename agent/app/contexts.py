"""The worker contexts of the live envs: a pure function of the env, the settings and the package
its create derived, if it did (kept in its record: ``ProjectVenvs``), built each time it is
asked for (the doors keep their replies; a record keeps no context).

An env is answered in the format its dialect says (``Dialect.context``): the ``.proto``'s here,
Ray's by the Ray door (``agent.doors.ray_context``); asking for another is a bug of the
caller, raised as one (``check_format``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from agent.app.config import Settings
from agent.app.records import EnvRecord
from agent.core.context import WorkerContext, build_context
from agent.core.dialect import ContextFormat
from agent.core.packages import Package
from agent.core.runtime_env import RuntimeEnv
from agent.core.uris import UriKey


class EnvContexts:
    def __init__(
        self,
        settings: Settings,
        path_for: Callable[[UriKey], Path],
        records: Mapping[str, EnvRecord],
    ) -> None:
        self._settings = settings
        self._path_for = path_for  # the store's: where each package lives
        self._records = records  # the service's, by env id

    def worker(self, env: RuntimeEnv) -> WorkerContext:
        """The env's context as the ``.proto``'s ``WorkerContext`` (``build_context``)."""
        check_format(env, ContextFormat.WORKER)
        return self.startable(env)

    def startable(self, env: RuntimeEnv) -> WorkerContext:
        """``worker`` whatever the env's dialect: before counting a create, the check that a
        worker could be started with its variables (E2BIG), the same in either format."""
        return build_context(
            env,
            self._path_for,
            py_executable=self._settings.py_executable,
            limits=self._settings.env,
            derived=self.derived(env),
        )

    def derived(self, env: RuntimeEnv) -> tuple[Package, ...]:
        """The package the env's create derived, if it did (placed as the env's own)."""
        record = self._records.get(env.env_id) if env.derives_venv else None
        derived = None if record is None else record.derived
        return () if derived is None else (derived,)


def check_format(env: RuntimeEnv, wanted: ContextFormat) -> None:
    """A door asks for the context in its dialect's format; another is a bug of the caller."""
    if env.dialect.context is not wanted:
        raise AssertionError(
            f"env {env.env_id} was read in the {env.dialect.name} dialect, whose context is "
            f"{env.dialect.context.value}, not {wanted.value}"
        )
