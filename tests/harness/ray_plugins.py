"""Ray runtime env plugins the plugin tests name in ``RAY_RUNTIME_ENV_PLUGINS``: imported by the
agent a raylet starts (through the node's ``PYTHONPATH``), never by the tests themselves, which
read what the plugins did in the file ``PLUGIN_LOG`` (one JSON line per call: the hook, the
plugin, its URI) and what the worker saw.

- ``RtenvHang``: ``create`` sleeps an hour (a setup timeout must end it).
- ``RtenvFlaky``: ``modify_context`` fails the first ``fail`` times for each ``tag``.
- ``RtenvFirst``/``RtenvSecond``: each appends its name to ``RTENV_PLUGIN_ORDER``.
- ``RtenvUris``: ``get_uris`` is the field's ``uris``; ``create`` and ``delete_uri`` noted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from ray._private.runtime_env.context import RuntimeEnvContext
from ray._private.runtime_env.plugin import RuntimeEnvPlugin

LOG_VAR = "RTENV_TEST_PLUGIN_LOG"  # the node's variable naming the file the calls go to
ORDER_VAR = "RTENV_PLUGIN_ORDER"
URI_BYTES = 1000  # what each created URI "takes"
MODULE = "tests.harness.ray_plugins"
_failed: dict[str, int] = {}


def _note(**fields: Any) -> None:
    with open(os.environ[LOG_VAR], "a") as f:
        f.write(json.dumps(fields) + "\n")


class RtenvHang(RuntimeEnvPlugin):
    name = "RtenvHang"

    async def create(
        self, uri: str | None, runtime_env: Any, context: RuntimeEnvContext, logger: logging.Logger
    ) -> float:
        _note(hook="create", plugin=self.name)
        await asyncio.sleep(3600)
        return 0


class RtenvFlaky(RuntimeEnvPlugin):
    name = "RtenvFlaky"

    def modify_context(
        self, uris: list[str], runtime_env: Any, ctx: RuntimeEnvContext, logger: logging.Logger
    ) -> None:
        spec = runtime_env[self.name]
        done = _failed[spec["tag"]] = _failed.get(spec["tag"], 0) + 1
        _note(hook="modify_context", plugin=self.name, attempt=done)
        if done <= spec["fail"]:
            raise ValueError(f"Fault injection {done}")
        ctx.env_vars["RTENV_FLAKY_ATTEMPTS"] = str(done)


class _Ordered(RuntimeEnvPlugin):
    def modify_context(
        self, uris: list[str], runtime_env: Any, ctx: RuntimeEnvContext, logger: logging.Logger
    ) -> None:
        before = ctx.env_vars.get(ORDER_VAR)
        ctx.env_vars[ORDER_VAR] = f"{before},{self.name}" if before else self.name


class RtenvFirst(_Ordered):
    name = "RtenvFirst"
    priority = 60  # the node's configuration gives it 5


class RtenvSecond(_Ordered):
    name = "RtenvSecond"
    priority = 50


class RtenvUris(RuntimeEnvPlugin):
    name = "RtenvUris"

    def get_uris(self, runtime_env: Any) -> list[str]:
        # Ray's agent asks every plugin for the URIs of every env, its field there or not
        return list((runtime_env.get(self.name) or {}).get("uris", []))

    async def create(
        self, uri: str | None, runtime_env: Any, context: RuntimeEnvContext, logger: logging.Logger
    ) -> float:
        _note(hook="create", plugin=self.name, uri=uri)
        return URI_BYTES

    def modify_context(
        self, uris: list[str], runtime_env: Any, ctx: RuntimeEnvContext, logger: logging.Logger
    ) -> None:
        ctx.env_vars["RTENV_URIS"] = ",".join(uris)

    def delete_uri(self, uri: str, logger: logging.Logger) -> float:
        _note(hook="delete_uri", plugin=self.name, uri=uri)
        return URI_BYTES


def plugins_config() -> str:
    """``RAY_RUNTIME_ENV_PLUGINS`` for a node hosting all of them (RtenvFirst's priority set
    here, below RtenvSecond's, though listed after it and its class says 60)."""
    return json.dumps(
        [
            {"class": f"{MODULE}.RtenvHang"},
            {"class": f"{MODULE}.RtenvFlaky"},
            {"class": f"{MODULE}.RtenvSecond"},
            {"class": f"{MODULE}.RtenvFirst", "priority": 5},
            {"class": f"{MODULE}.RtenvUris"},
        ]
    )
