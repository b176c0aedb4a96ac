"""Ray's runtime env plugins, hosted as Ray's agent runs them (loaded only when configured).

``load_host(environ)`` imports the classes ``RAY_RUNTIME_ENV_PLUGINS`` names (the raylet's
``PYTHONPATH`` put on ``sys.path`` for that import only: the agent runs isolated, ``-I``) and the
fields of ``RAY_RUNTIME_ENV_PLUGIN_SCHEMAS``' schemas (their ``title``). ``PluginHost.setup``
runs, for an env's plugin fields, each plugin in increasing priority as Ray's
``create_for_plugin_if_needed`` does (``validate``, ``get_uris``, ``create`` on a URI not in the
plugin's cache, ``modify_context``), the whole under the env's setup timeout, tried
``RUNTIME_ENV_RETRY_TIMES`` times ``RUNTIME_ENV_RETRY_INTERVAL_MS`` apart (Ray reads them without
``RAY_``); a failure or a
timeout is raised with Ray's words. A plugin URI is counted per create and per delete; unused,
it is left to the plugin's ``URICache`` (Ray's own class: deleted through ``delete_uri`` when
the plugin's cache exceeds ``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``, 10 by default).
This module is in the launcher's package: the only one that imports Ray.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from agent.core.errors import AgentError, ConfigError, PluginFailed, SetupTimeout
from agent.core.plugin_config import (
    DEFAULT_PRIORITY,
    PLUGINS_VAR,
    SCHEMAS_VAR,
    check_priority,
    ordered,
    parse_plugins,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 600  # Ray's DEFAULT_RUNTIME_ENV_TIMEOUT_SECONDS


def _import_attr(path: str, extra_paths: list[str]) -> Any:
    added = [p for p in extra_paths if p and p not in sys.path]
    sys.path.extend(added)
    try:
        module_name, _, attr = path.rpartition(".")
        if not module_name:
            raise ConfigError(f"{PLUGINS_VAR}: class {path!r} is not 'module.Class'")
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{PLUGINS_VAR}: cannot import {path!r}: {exc}") from exc


def _schema_titles(text: str) -> list[str]:
    titles: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        files = (
            [os.path.join(part, n) for n in sorted(os.listdir(part)) if n.endswith(".json")]
            if os.path.isdir(part)
            else [part]
        )
        for name in files:
            try:
                with open(name) as f:
                    title = json.load(f).get("title")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(title, str):
                titles.append(title)
    return titles


class PluginHost:
    def __init__(self, plugins: list[Any], extra_fields: list[str], environ: Mapping[str, str]):
        from ray._private.runtime_env.uri_cache import URICache

        self._plugins = {p.name: p for p in plugins}
        self._order = ordered([(int(p.priority), p.name) for p in plugins])
        self.fields = frozenset([*self._plugins, *extra_fields])
        self._caches = {
            p.name: URICache(
                p.delete_uri,
                int(
                    1024**3
                    * float(environ.get(f"RAY_RUNTIME_ENV_{p.name}_CACHE_SIZE_GB".upper(), 10))
                ),
            )
            for p in plugins
        }
        self._counts: dict[tuple[str, str], int] = {}
        self._retries = max(1, int(environ.get("RUNTIME_ENV_RETRY_TIMES", 3)))
        self._interval = int(environ.get("RUNTIME_ENV_RETRY_INTERVAL_MS", 1000)) / 1000

    async def setup(
        self,
        serialized: str,
        fields: Mapping[str, Any],
        context: dict[str, object],
        setup_timeout: int,
    ) -> tuple[dict[str, object], list[tuple[str, str]]]:
        """The context after each plugin's ``modify_context``; the plugin URIs now counted."""
        seconds = None if setup_timeout == -1 else (setup_timeout or DEFAULT_TIMEOUT_SECONDS)
        error = ""
        for attempt in range(self._retries):
            if attempt:
                await asyncio.sleep(self._interval)
            try:
                result, uris = await asyncio.wait_for(
                    self._setup_once(serialized, fields, dict(context)), seconds
                )
            except Exception as exc:  # a plugin's error, whatever it is, is Ray's failure
                error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                if isinstance(exc, asyncio.TimeoutError):
                    error = (
                        f"Failed to install runtime_env within the timeout of {seconds} "
                        "seconds. Consider increasing the timeout in the runtime_env config. "
                        'For example: \n    runtime_env={"config": {"setup_timeout_seconds":'
                        " 1800}, ...}\nIf not provided, the default timeout is "
                        f"{DEFAULT_TIMEOUT_SECONDS} seconds. " + error
                    )
                log.warning(
                    "runtime env plugins failed (attempt %d of %d)",
                    attempt + 1,
                    self._retries,
                    extra={"attempt": attempt + 1},
                )
                continue
            for key in uris:
                self._counts[key] = self._counts.get(key, 0) + 1
            return result, uris
        log.error(
            "runtime_env creation failed %d times, giving up.",
            self._retries,
            extra={"attempts": self._retries},
        )
        # Ray's agent answers the last attempt's traceback (a timeout's with its hint first)
        raise (SetupTimeout if error.startswith("Failed to install") else PluginFailed)(error)

    async def _setup_once(
        self, serialized: str, fields: Mapping[str, Any], context: dict[str, object]
    ) -> tuple[dict[str, object], list[tuple[str, str]]]:
        from ray._private.runtime_env.context import RuntimeEnvContext
        from ray.runtime_env import RuntimeEnv

        env = RuntimeEnv.deserialize(serialized)  # the whole env, as Ray's agent passes it
        held: list[tuple[str, str]] = []
        ctx = RuntimeEnvContext(**context)  # type: ignore[arg-type]
        for name in self._order:
            if fields.get(name) is None:
                continue
            plugin, cache = self._plugins[name], self._caches[name]
            plugin.validate(env)
            uris = plugin.get_uris(env)
            if not uris:
                await plugin.create(None, env, ctx, logger=log)
            for uri in uris:
                if uri not in cache:
                    cache.add(uri, await plugin.create(uri, env, ctx, logger=log), logger=log)
                else:
                    cache.mark_used(uri, logger=log)
            plugin.modify_context(uris, env, ctx, log)
            held.extend((name, uri) for uri in uris)
        out: dict[str, object] = json.loads(ctx.serialize())
        return out, held

    def release(self, uris: list[tuple[str, str]]) -> None:
        """One count of each URI back; a URI no create holds is unused in its plugin's cache."""
        for key in uris:
            left = self._counts.get(key, 0) - 1
            if left > 0:
                self._counts[key] = left
                continue
            self._counts.pop(key, None)
            try:
                self._caches[key[0]].mark_unused(key[1], logger=log)
            except Exception:
                log.exception(
                    "plugin %s: deleting %s failed",
                    key[0],
                    key[1],
                    extra={"plugin": key[0], "uri": key[1]},
                )


def load_host(environ: Mapping[str, str] = os.environ) -> PluginHost:
    """The host of the plugins the environment names (``ConfigError`` when one cannot load)."""
    from ray._private.runtime_env.plugin import RuntimeEnvPlugin

    extra = environ.get("PYTHONPATH", "").split(os.pathsep)
    plugins: list[Any] = []
    for spec in parse_plugins(environ.get(PLUGINS_VAR, "")):
        cls = _import_attr(spec.class_path, extra)
        if not (isinstance(cls, type) and issubclass(cls, RuntimeEnvPlugin)):
            raise ConfigError(
                f"Invalid runtime env plugin class {cls}. The plugin class must inherit "
                "ray._private.runtime_env.plugin.RuntimeEnvPlugin."
            )
        if not getattr(cls, "name", None):
            raise ConfigError(f"No valid name in runtime env plugin {cls}.")
        plugin = cls()
        plugin.priority = check_priority(
            spec.priority
            if spec.priority is not None
            else getattr(cls, "priority", DEFAULT_PRIORITY)
        )
        plugins.append(plugin)
    return PluginHost(plugins, _schema_titles(environ.get(SCHEMAS_VAR, "")), environ)


__all__ = ["AgentError", "PluginHost", "load_host"]
