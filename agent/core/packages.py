"""Packages: each (kind, URI) key an env names, with the recipe its installer needs.

Pure: no I/O. A ``Package`` is parsed once, with the env (``parse_runtime_env``), or derived
once by its create (a ``uv run`` project's venv, a set's venv keyed by the files it reads), and
carries everything its install needs: the store never parses a URI again, nor learns a recipe
through another channel. How each kind is made and placed is its row of ``agent.core.kinds``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.pip_spec import PipSpec
from agent.core.uris import ParsedUri, UriKey, UriKind
from agent.core.uv_project import ProjectRecipe
from agent.core.uv_spec import UvSpec
from agent.core.uv_tool import UvTool, uv_tool

# what an installer needs: a URI to fetch, a dependency set, a uv run project's files, the uv
# of a uv_version
Recipe = ParsedUri | PipSpec | UvSpec | ProjectRecipe | UvTool


@dataclass(frozen=True, slots=True)
class Package:
    """One package of an env: its key (the unit counted, cached and deleted) and its recipe
    (``ParsedUri`` for the zip kinds, ``PipSpec`` for pip, ``UvSpec`` for uv, ``ProjectRecipe``
    for a uv run project's venv, ``UvTool`` for the uv of a uv_version). Equal keys have equal
    recipes: the key's URI is the recipe's name (the URI itself, or the set's hash)."""

    key: UriKey
    recipe: Recipe


def venv_package(kind: UriKind, spec: PipSpec | UvSpec) -> Package:
    """A pip or uv set's venv as a package of ``kind`` (the door's dialect chose it: an isolated
    venv, or one that sees the node's packages). A set naming local sources has its bytes read
    first (``PipSpec.contents``): its key holds them."""
    return Package(UriKey(kind, spec.uri), spec)


def tool_package(spec: PipSpec | UvSpec, agent_uv: str) -> Package | None:
    """The uv that builds a uv set's venv, as a package of the env, when its ``uv_version`` asks
    for one the agent's uv (of version ``agent_uv``) does not satisfy (``agent.core.uv_tool``);
    None for a pip set, and when the agent's uv builds it."""
    tool = uv_tool(spec, agent_uv) if isinstance(spec, UvSpec) else None
    return None if tool is None else Package(UriKey(UriKind.UV_TOOL, tool.uri), tool)
