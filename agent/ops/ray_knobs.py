"""Ray's per-kind cache sizes, as this agent honours them under Ray.

Ray's agent keeps one URI cache per plugin, sized by ``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``
(10 when unset; ``plugin.py``'s ``create_uri_cache_for_plugin``): an unused URI of that plugin
is deleted once the plugin's cache is over its size. This agent keeps one budget for the whole
root (``--cache-budget``); a Ray variable that is SET adds a cap on the unused bytes of the
packages its plugin makes (``KIND_GROUPS``), enforced by the same passes (``index.sweep``). An
unset one adds nothing (the root's budget stays the default). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.core.errors import ConfigError, echo
from agent.core.uris import UriKind
from agent.state.index import KindBudget

_GIB = 1024**3

# Ray's plugin name -> the kinds of this agent's packages it covers
KIND_GROUPS: dict[str, tuple[UriKind, ...]] = {
    "working_dir": (UriKind.WORKING_DIR,),
    "py_modules": (UriKind.PY_MODULES, UriKind.RAY_PY_MODULES, UriKind.PY_MODULES_WHEEL),
    "pip": (UriKind.PIP, UriKind.RAY_PIP),
    "uv": (UriKind.UV, UriKind.RAY_UV),
    "java_jars": (UriKind.JAVA_JARS,),
}


def cache_size_var(name: str) -> str:
    """Ray's variable for a plugin's cache size, as Ray spells it."""
    return f"RAY_RUNTIME_ENV_{name}_CACHE_SIZE_GB".upper()


def ray_cache_budgets(environ: Mapping[str, str]) -> tuple[KindBudget, ...]:
    """The kind budgets the environment sets (``ConfigError`` naming a value that is not a
    number of GiB, 0 or more)."""
    budgets = []
    for name, kinds in KIND_GROUPS.items():
        var = cache_size_var(name)
        text = environ.get(var)
        if text is None:
            continue
        try:
            gib = float(text)
        except ValueError:
            gib = math.nan
        if not math.isfinite(gib) or gib < 0:
            raise ConfigError(f"{var}={echo(text)} is not a size in GiB (a number, 0 or more)")
        budgets.append(KindBudget(var, frozenset(k.value for k in kinds), int(gib * _GIB)))
    return tuple(budgets)
