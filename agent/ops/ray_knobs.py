"""Ray's per-kind cache sizes and http(s) download headers, as this agent honours them under Ray.

Ray's agent keeps one URI cache per plugin, sized by ``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB`` (10
when unset; ``plugin.py``'s ``create_uri_cache_for_plugin``): an unused URI of that plugin is
deleted once the plugin's cache is over its size. This agent keeps one budget for the whole root
(``--cache-budget``); a Ray variable that is SET adds a cap on the bytes of the packages its plugin
makes (each kind's ``ray_cache`` in ``agent.core.kinds``), used or not, as Ray's cache counts them,
kept by evicting the unused ones in the same passes (``agent.state.sweeping``). An unset one adds
nothing (the root's budget stays the default).

Ray's agent downloads http(s) packages with a ``User-Agent`` of
``RAY_RUNTIME_ENV_HTTP_USER_AGENT`` (``ray-runtime-env-curl/1.0`` when unset) and, when
``RAY_RUNTIME_ENV_BEARER_TOKEN`` is set, ``Authorization: Bearer <token>`` (``protocol.py``'s
``_http_headers``); so does this one under Ray, except that a redirect to another origin drops
the token (``agent.install.fetch.transport``), where Ray's sends it to every host.

Ray's agent tries a create ``RUNTIME_ENV_RETRY_TIMES`` times (3 when unset), each under the
setup timeout, starting the build again each time (``runtime_env_agent.py``'s
``_create_runtime_env_with_retry``), so a create under Ray fails after that many timeouts. This
agent waits as long (``Settings.setup_attempts``): its one build goes on through them all, so a
build that Ray's retries would have finished never fails here. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agent.core.errors import ConfigError, echo
from agent.core.kinds import KINDS
from agent.core.uris import UriKind
from agent.state.index import KindBudget

_GIB = 1024**3


def kind_groups() -> dict[str, tuple[UriKind, ...]]:
    """Ray's plugin name -> the kinds of this agent's packages its cache covers (each kind's
    ``ray_cache``), in the order of ``KINDS``."""
    groups: dict[str, tuple[UriKind, ...]] = {}
    for kind, row in KINDS.items():
        groups[row.ray_cache] = (*groups.get(row.ray_cache, ()), kind)
    return groups


def cache_size_var(name: str) -> str:
    """Ray's variable for a plugin's cache size, as Ray spells it."""
    return f"RAY_RUNTIME_ENV_{name}_CACHE_SIZE_GB".upper()


def ray_cache_budgets(environ: Mapping[str, str]) -> tuple[KindBudget, ...]:
    """The kind budgets the environment sets (``ConfigError`` naming a value that is not a
    number of GiB, 0 or more)."""
    budgets = []
    for name, kinds in kind_groups().items():
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


USER_AGENT_VAR = "RAY_RUNTIME_ENV_HTTP_USER_AGENT"
BEARER_TOKEN_VAR = "RAY_RUNTIME_ENV_BEARER_TOKEN"
RAYS_USER_AGENT = "ray-runtime-env-curl/1.0"  # Ray's when the variable is unset
MAX_HEADER_CHARS = 8192  # a header value, as most servers take at most


def ray_http_headers(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers Ray's agent sends with an http(s) download, from the environment
    (``ConfigError`` naming a variable whose value no header can carry; a token is never
    echoed)."""
    agent = environ.get(USER_AGENT_VAR, RAYS_USER_AGENT)
    if problem := _header_problem(agent):
        raise ConfigError(f"{USER_AGENT_VAR}={echo(agent)} {problem}")
    headers = [("User-Agent", agent)]
    token = environ.get(BEARER_TOKEN_VAR)
    if token:
        if problem := _header_problem(token):
            raise ConfigError(f"{BEARER_TOKEN_VAR} (not shown) {problem}")
        headers.append(("Authorization", f"Bearer {token}"))
    return tuple(headers)


def _header_problem(value: str) -> str | None:
    """Why ``value`` cannot be an HTTP header's value, or None."""
    if len(value) > MAX_HEADER_CHARS:
        return f"is {len(value)} characters; the limit is {MAX_HEADER_CHARS}"
    if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
        return "has a control character (a line break?): no HTTP header can carry it"
    if not value.isascii():
        return "is not ASCII: an HTTP header carries ASCII"
    return None


RETRY_TIMES_VAR = "RUNTIME_ENV_RETRY_TIMES"
RAYS_RETRY_TIMES = 3  # Ray's when the variable is unset
MAX_ATTEMPTS = 100  # more is a typo: a create would wait 100 setup timeouts


def ray_setup_attempts(environ: Mapping[str, str]) -> int:
    """How many setup timeouts a create waits under Ray: Ray's ``RUNTIME_ENV_RETRY_TIMES``,
    at least 1 (``ConfigError`` naming a value that is not a whole number up to
    ``MAX_ATTEMPTS``)."""
    text = environ.get(RETRY_TIMES_VAR)
    if text is None:
        return RAYS_RETRY_TIMES
    try:
        times = int(text)
    except ValueError:
        times = -1
    if not 0 <= times <= MAX_ATTEMPTS:
        raise ConfigError(
            f"{RETRY_TIMES_VAR}={echo(text)} is not a number of attempts (0 to {MAX_ATTEMPTS})"
        )
    return max(times, 1)
