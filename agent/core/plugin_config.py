"""Ray's runtime env plugins as the node configures them, read without importing anything.

``RAY_RUNTIME_ENV_PLUGINS`` holds a JSON list of ``{"class": "module.Class", "priority": N}``
(priority optional: the class's own, Ray's default 10); a priority is an integer in
``[MIN_PRIORITY, MAX_PRIORITY]`` (Ray's bounds, 0 and 100). Plugins run in increasing priority
(ties in the order listed, as Python's stable sort leaves them in Ray's agent).
``RAY_RUNTIME_ENV_PLUGIN_SCHEMAS`` names JSON schema files or folders of them (``.json``),
which Ray's driver checks fields against; the agent reads only their names, so a schema's
field is accepted too. The host that loads and runs the classes is ``agent.launcher.plugins``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from agent.core.errors import ConfigError, echo

PLUGINS_VAR = "RAY_RUNTIME_ENV_PLUGINS"
SCHEMAS_VAR = "RAY_RUNTIME_ENV_PLUGIN_SCHEMAS"
DEFAULT_PRIORITY = 10
MIN_PRIORITY = 0
MAX_PRIORITY = 100
MAX_PLUGINS = 64  # classes one node may name


@dataclass(frozen=True, slots=True)
class PluginSpec:
    class_path: str  # "module.Class", imported by the host
    priority: int | None  # None: the class's own


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the node names any plugin (the agent then loads Ray's plugin host)."""
    return bool(environ.get(PLUGINS_VAR, "").strip())


def check_priority(priority: object) -> int:
    """Ray's rule and its words: an integer within Ray's bounds."""
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ConfigError(
            f"Invalid runtime env priority {echo(priority)}, it should be an integer "
            f"between {MIN_PRIORITY} and {MAX_PRIORITY}."
        )
    return priority


def parse_plugins(text: str) -> tuple[PluginSpec, ...]:
    """The plugins ``RAY_RUNTIME_ENV_PLUGINS`` names; ``ConfigError`` saying what is wrong."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{PLUGINS_VAR} is not JSON: {exc} (value {echo(text)})") from exc
    if not isinstance(value, list):
        raise ConfigError(
            f"{PLUGINS_VAR} must be a JSON list of {{'class': ...}}, got {echo(text)}"
        )
    if len(value) > MAX_PLUGINS:
        raise ConfigError(f"{PLUGINS_VAR} names {len(value)} plugins; the limit is {MAX_PLUGINS}")
    specs: list[PluginSpec] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("class"), str):
            raise ConfigError(
                f"{PLUGINS_VAR}: {echo(json.dumps(item))} is not a dict with a 'class' field"
            )
        priority = check_priority(item["priority"]) if "priority" in item else None
        specs.append(PluginSpec(item["class"], priority))
    return tuple(specs)


def ordered(plugins: list[tuple[int, str]]) -> list[str]:
    """Plugin names by increasing priority, ties in the order given (Ray's stable sort)."""
    return [name for _, name in sorted(plugins, key=lambda pair: pair[0])]
