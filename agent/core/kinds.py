"""The package kinds, one row each: every trait of a kind in one place.

Pure: no I/O. A kind (``UriKind``) is how a package is made and put on the worker; its row in
``KINDS`` says all of it, side by side:

- ``placement``: where its installed folder goes in the worker's context (``build_context``,
  ``build_ray_context``);
- ``build``: how the install layer makes the folder (``agent.install.installers`` maps each
  ``Build`` to its installer);
- ``origin``: whether an env names the package by a URI, names a set it is built from, the
  package is derived by the env's create from files it reads, or it is a tool that builds
  another package of the env (the uv of a ``uv_version``: installed first, placed nowhere);
- ``ray_folder``: the folder of Ray's ``runtime_resources`` it is shown in under Ray
  (``agent.state.ray_folders``);
- ``ray_cache``: Ray's plugin whose ``RAY_RUNTIME_ENV_<PLUGIN>_CACHE_SIZE_GB`` caps it
  (``agent.ops.ray_knobs``). What a Ray folder shows is what its plugin's variable caps, so a
  ``uv run`` project's venv, shown in ``uv``, is capped by ``RAY_RUNTIME_ENV_UV_CACHE_SIZE_GB``.

Adding a kind is a ``UriKind``, its row here, its parse (``agent.core.env_parse``) and, when no
``Build`` fits, an installer. ``tests/test_kinds.py`` walks every row.
"""

# ruff: noqa: E501 (the table of kinds is read side by side, a row a line)
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent.core.uris import UriKind

VENV_PYTHON = "bin/python"  # a venv's python, relative to its folder
VENV_BIN = "bin"  # the folder of a venv's programs, relative to its folder


class VenvPlace(Enum):
    """How a venv is put on the worker."""

    # sees only its own packages: the worker runs its python (the env's own py_executable
    # wins); Ray's worker keeps the node's python and gets the venv's site-packages on its path
    ISOLATED = "isolated"
    # sees the node's packages after its own (how Ray's agent makes venvs): the worker runs its
    # python (the env's own py_executable wins), ``VIRTUAL_ENV`` set, its bin first on ``PATH``
    NODE_SITE = "node_site"
    # a ``uv run`` project's: the worker runs its python in place of the env's ``uv run`` line,
    # ``VIRTUAL_ENV`` set, its bin first on ``PATH``, as ``uv run`` would
    PROJECT = "project"


@dataclass(frozen=True, slots=True)
class NodeSite:
    """What a venv that sees the node's packages sees: the site folders of the node's python,
    after its own (how Ray's agent makes venvs). Part of the venv's key: another python,
    another venv, even on one shared root."""

    python: str


@dataclass(frozen=True, slots=True)
class Placement:
    """How a kind's installed folder is put on the worker. An env names at most one package of
    a kind that gives the cwd or the python."""

    on_path: bool = False  # the folder goes on PYTHONPATH (in the env's order of packages)
    cwd: bool = False  # the worker starts in the folder
    java: bool = False  # the folder goes on a Java worker's class path (its jars and itself)
    venv: VenvPlace | None = None  # the folder is a venv, placed as this says


class Build(Enum):
    """How the install layer makes a kind's folder (one installer each)."""

    ZIP = "zip"  # a zip unpacked as it is
    ZIP_AS_WORKING_DIR = "zip_as_working_dir"  # a zip unpacked, a single top folder dropped
    # (unless its scheme keeps it: a gcs:// upload)
    JARS = "jars"  # a .jar kept whole in a folder, or a .zip unpacked
    WHEEL = "wheel"  # a .whl pip-installed (``--target``) into the folder
    PIP_VENV = "pip_venv"  # a venv built by pip from a requirement set
    UV_VENV = "uv_venv"  # a venv built by uv from a requirement set
    PROJECT_VENV = "project_venv"  # a uv run project's venv, built by uv from its lock
    UV_TOOL = "uv_tool"  # a venv holding a uv of a uv_version, its binary checked after


class Origin(Enum):
    """How an env comes to hold the package."""

    NAMED = "named"  # the env names its URI
    SET = "set"  # the env names the set it is built from; a set naming files of the node, or
    # read from requirements files of the working dir, is derived at create from those files
    DERIVED = "derived"  # derived by the env's create from its working dir; never named
    # builds another package of the env (the uv of a uv env's uv_version): named by the env
    # beside the venv it builds (or, when that venv is derived, derived with it), installed
    # before it; put nowhere on the worker
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class KindRow:
    """Every trait of one package kind (see the module docstring)."""

    placement: Placement
    build: Build
    origin: Origin
    ray_folder: str
    ray_cache: str


_WORKING_DIR = Placement(on_path=True, cwd=True)
_ON_PATH = Placement(on_path=True)
_ISOLATED = Placement(venv=VenvPlace.ISOLATED)
_NODE_SITE = Placement(venv=VenvPlace.NODE_SITE)
_PROJECT = Placement(venv=VenvPlace.PROJECT)
_JAVA = Placement(java=True)
_NOWHERE = Placement()  # a tool: used by the build of another package, not by the worker

# One row per kind; a table whose alignment is the point. Ray's caches in the order Ray lists them.
KINDS: dict[UriKind, KindRow] = {
    UriKind.WORKING_DIR:      KindRow(_WORKING_DIR, Build.ZIP_AS_WORKING_DIR, Origin.NAMED, "working_dir_files", "working_dir"),
    UriKind.PY_MODULES:       KindRow(_ON_PATH,     Build.ZIP,                Origin.NAMED, "py_modules_files",  "py_modules"),
    UriKind.RAY_PY_MODULES:   KindRow(_ON_PATH,     Build.ZIP_AS_WORKING_DIR, Origin.NAMED, "py_modules_files",  "py_modules"),
    UriKind.PY_MODULES_WHEEL: KindRow(_ON_PATH,     Build.WHEEL,              Origin.NAMED, "py_modules_files",  "py_modules"),
    UriKind.PIP:              KindRow(_ISOLATED,    Build.PIP_VENV,           Origin.SET,   "pip",               "pip"),
    UriKind.RAY_PIP:          KindRow(_NODE_SITE,   Build.PIP_VENV,           Origin.SET,   "pip",               "pip"),
    UriKind.UV:               KindRow(_ISOLATED,    Build.UV_VENV,            Origin.SET,   "uv",                "uv"),
    UriKind.RAY_UV:           KindRow(_NODE_SITE,   Build.UV_VENV,            Origin.SET,   "uv",                "uv"),
    UriKind.UV_PROJECT:       KindRow(_PROJECT,     Build.PROJECT_VENV,       Origin.DERIVED, "uv",              "uv"),
    UriKind.JAVA_JARS:        KindRow(_JAVA,        Build.JARS,               Origin.NAMED, "java_jars_files",   "java_jars"),
    UriKind.UV_TOOL:          KindRow(_NOWHERE,     Build.UV_TOOL,            Origin.TOOL,  "uv",                "uv"),
}  # fmt: skip


def row_of(kind: UriKind) -> KindRow:
    """The kind's row of ``KINDS``; a kind without one is a bug (the table is complete)."""
    row = KINDS.get(kind)
    if row is None:
        raise AssertionError(f"no row for package kind {kind.value!r} in KINDS")
    return row


def sees_node(kind: UriKind) -> bool:
    """Whether the kind's venv sees the node's packages (its build adds the node's site
    folders after its own)."""
    return row_of(kind).placement.venv is VenvPlace.NODE_SITE
