"""Parsing runtime envs, remembering recent answers: a scheduler sends the same JSON again and
again, and parsing (JSON, canonical form, hash) is most of a cache-hit create's work.

Remembered by the digest of the text (never the text: a client may pad it to 1 MiB), each
distinct env once by its id, within a byte budget. The value is immutable and a pure function of
the text and the settings, but for ``config``, which is not part of an env's identity: two texts
of one env may differ in it, and each keeps its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from agent.app.records import env_weight
from agent.core.bounded import BoundedCache
from agent.core.dialect import GRPC, Dialect
from agent.core.errors import echo
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env

log = logging.getLogger(__name__)

_PARSED_KEPT = 4096  # parsed envs remembered by the digest of their JSON text
_PARSED_BYTES = 8 * 1024 * 1024


class ParseCache:
    def __init__(
        self,
        limits: EnvLimits,
        file_roots: Sequence[str],
        plugin_fields: frozenset[str] = frozenset(),
        *,
        node_python: str = "",
        agent_uv: str = "",
    ) -> None:
        """``plugin_fields``: the fields of the node's runtime env plugins (run where the
        dialect runs them); ``node_python``: the node's python, whose site folders a venv that
        sees the node's packages sees; ``agent_uv``: the version of the agent's uv (a
        ``uv_version`` it does not satisfy names the uv that does)."""
        self._limits = limits
        self._plugin_fields = plugin_fields
        self._file_roots = file_roots
        self._node_python = node_python
        self._agent_uv = agent_uv
        # digest of a JSON text -> env id (and the text's config) -> parsed env: many spellings
        # share one value
        self._spellings: BoundedCache[bytes, _Spelling] = BoundedCache(
            _PARSED_KEPT, _PARSED_KEPT * 128
        )
        self._parsed: BoundedCache[str, RuntimeEnv] = BoundedCache(_PARSED_KEPT, _PARSED_BYTES)

    def parse(self, serialized: str, dialect: Dialect = GRPC) -> RuntimeEnv:
        """The env the text names as ``dialect`` reads it (``InvalidRuntimeEnv`` if it names
        none), each dialect's remembered apart."""
        digest = hashlib.sha256(serialized.encode("utf-8", "surrogatepass")).digest()
        if dialect is not GRPC:
            digest = dialect.name.encode() + b":" + digest
        spelling = self._spellings.get(digest)
        # by dialect and id: one env read through both doors is two values (each carries its
        # dialect, which says how its door answers it)
        env = self._parsed.get(_key(dialect, spelling.env_id)) if spelling is not None else None
        if env is None or spelling is None:
            env = parse_runtime_env(
                serialized,
                self._limits,
                file_roots=self._file_roots,
                dialect=dialect,
                node_python=self._node_python,
                plugin_fields=self._plugin_fields,
                agent_uv=self._agent_uv,
            )
            config = _Spelling(env.env_id, env.setup_timeout_seconds, env.eager_install)
            self._spellings.put(digest, config, 128)
            self._parsed.put(_key(dialect, env.env_id), env, env_weight(env))
        elif (env.setup_timeout_seconds, env.eager_install) != spelling.config:
            # one env, another spelling with another ``config`` (not part of the env's identity)
            timeout, eager = spelling.config
            env = dataclasses.replace(env, setup_timeout_seconds=timeout, eager_install=eager)
        return env


def _key(dialect: Dialect, env_id: str) -> str:
    return f"{dialect.name}:{env_id}"


@dataclass(frozen=True, slots=True)
class _Spelling:
    """What a JSON text parsed to: its env's id, and its own ``config`` (which is not part of the
    env's identity, so two texts of one env may differ in it)."""

    env_id: str
    setup_timeout_seconds: int | None
    eager_install: bool | None

    @property
    def config(self) -> tuple[int | None, bool | None]:
        return self.setup_timeout_seconds, self.eager_install


def warn_ignored(env: RuntimeEnv) -> None:
    """One warning per unknown field the dialect ignored in ``env`` (``RuntimeEnv.ignored``)."""
    for name in env.ignored:
        shown = name if name.isprintable() else echo(name)  # a bare name, as Ray writes it
        log.warning(
            "runtime_env field %s is not recognized and will be ignored, as Ray's agent ignores "
            "it (env %s)",
            shown,
            env.env_id,
            extra={"field": shown, "env_id": env.env_id},
        )
