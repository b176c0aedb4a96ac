"""Packages: each (kind, URI) key an env names, with the recipe its installer needs, and how
each kind is put on the worker.

Pure: no I/O. A ``Package`` is parsed once, with the env (``parse_runtime_env``), and carries
everything its install needs: the store never parses a URI again, nor learns a recipe through
another channel. ``PLACEMENTS`` says, per kind, where the installed folder goes in the worker's
context (``build_context``); the installers (``agent.install.installers``) say, per kind, how
the folder is made. A new kind is a ``UriKind``, its parser, one row here and one installer.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.pip_spec import PipSpec
from agent.core.uris import ParsedUri, UriKey, UriKind
from agent.core.uv_project import ProjectRecipe
from agent.core.uv_spec import UvSpec

# what an installer needs: a URI to fetch, a dependency set, a uv run project's files
Recipe = ParsedUri | PipSpec | UvSpec | ProjectRecipe


@dataclass(frozen=True, slots=True)
class Package:
    """One package of an env: its key (the unit counted, cached and deleted) and its recipe
    (``ParsedUri`` for the zip kinds, ``PipSpec`` for pip, ``UvSpec`` for uv). Equal keys have
    equal recipes: the key's URI is the recipe's name (the URI itself, or the set's hash)."""

    key: UriKey
    recipe: Recipe


@dataclass(frozen=True)
class Placement:
    """How a kind's installed folder is put on the worker. An env names at most one package of
    a kind that gives the cwd or the python."""

    on_path: bool = False  # the folder goes on PYTHONPATH (in the env's order of packages)
    cwd: bool = False  # the worker starts in the folder
    python: str | None = None  # the worker's python, relative to the folder
    java: bool = False  # the folder goes on a Java worker's class path (its jars and itself)
    # a venv with Ray's semantics: it sees the node's packages, so Ray's worker runs its python
    # (an isolated venv's site-packages goes on the path of the node's python instead)
    node_site: bool = False


PLACEMENTS: dict[UriKind, Placement] = {
    UriKind.WORKING_DIR: Placement(on_path=True, cwd=True),
    UriKind.PY_MODULES: Placement(on_path=True),
    UriKind.PY_MODULES_WHEEL: Placement(on_path=True),  # the wheel's --target folder
    UriKind.RAY_PY_MODULES: Placement(on_path=True),  # the Ray door's: its top folder dropped
    UriKind.PIP: Placement(python="bin/python"),  # the env's own virtualenv
    UriKind.JAVA_JARS: Placement(java=True),
    UriKind.UV: Placement(python="bin/python"),  # likewise, built by uv
    UriKind.RAY_PIP: Placement(python="bin/python", node_site=True),  # the Ray door's pip venv
    UriKind.RAY_UV: Placement(python="bin/python", node_site=True),  # the Ray door's uv venv
    # a uv run project's venv, derived at create time (``agent.core.uv_run``): the worker runs
    # its python itself, as uv run would (``build_context``'s ``uv_venv``), so no placement
    UriKind.UV_PROJECT: Placement(),
}


def venv_package(spec: PipSpec | UvSpec) -> Package:
    """A pip or uv set's venv as a package: its kind says the tool, and whether it has Ray's
    semantics (``node_site``: the Ray door's). A set naming local sources has its bytes read
    first (``PipSpec.contents``): its key holds them."""
    if isinstance(spec, PipSpec):
        kind = UriKind.RAY_PIP if spec.node_site else UriKind.PIP
    else:
        kind = UriKind.RAY_UV if spec.node_site else UriKind.UV
    return Package(UriKey(kind, spec.uri), spec)


def placement_of(kind: UriKind) -> Placement:
    """The kind's row of ``PLACEMENTS``; a kind without one is a bug (the table is complete)."""
    placement = PLACEMENTS.get(kind)
    if placement is None:
        raise AssertionError(f"no placement for package kind {kind.value!r}")
    return placement
