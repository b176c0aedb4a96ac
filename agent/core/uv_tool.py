"""The uv of a ``uv`` env's ``uv_version``: a package of the env that builds its venv.

Pure: no I/O. Ray installs ``uv<uv_version>`` (pip, into the env's venv) and builds the env with
it. Here that uv is a package of its own (``UriKind.UV_TOOL``, ``uvtool://<hash>``): a venv
holding ``uv<uv_version>``, built by the agent's uv from the root's wheel cache, installed once
per root and shared by every env whose ``uv_version`` and indexes are the same, reference
counted and evictable like any package (its row of ``agent.core.kinds``: ``Origin.TOOL``, placed
nowhere on the worker, shown in Ray's ``uv`` folder and capped by Ray's ``uv`` cache size). The
env names it beside its venv (``agent.core.runtime_env``), its create installs it before the
venv (``agent.app.ensures``), and that venv is then built by its ``bin/uv`` (``UV_BIN``):
``uv venv`` and ``uv pip install``, with the same flags and isolation as the agent's own uv.

Where that uv comes from: the places the env's ``uv_pip_install_options`` read packages from
(``--index-url``, ``--extra-index-url``, ``--default-index``, ``--index``, ``--no-index``,
``--find-links``, ``--index-strategy``, ``--allow-insecure-host``, ``--offline``: ``_WHERE``),
else the default index, as Ray's pip would; they were checked when the env was parsed, as every
place an env names is (``allow-file-root``). ``--no-build`` is added: a uv is taken from a wheel,
never built from its source (which needs Rust and runs the source's build).

The agent's own uv, when it satisfies the specifier, builds the env: no uv package (the env
then names none). Either way the env's venv gets ``uv<uv_version>`` installed into it, as Ray's
does (Ray installs it whatever the node has: its worker sees a ``uv`` distribution that
satisfies the specifier, its ``bin/uv`` and ``python -m uv``): the same set (``uv_set``), by the
agent's uv, from the root's wheel cache before the env's packages
(``agent.install.venvs.build``). When a uv package was built, its wheel is in that cache (the
agent's uv built it there), so the venv's uv is linked from it: one download per root. When the
agent's uv satisfies the specifier, the first venv's install fetches it from the env's places
(an env with a ``uv_version`` needs an index, or a find-links folder, that has uv, as Ray's
does), and the venvs after it link it from the cache.

The venv's own ``bin/uv`` does not build the rest (Ray's does): the uv package's does, so the
venv's ``pyvenv.cfg`` names it, and the venv's uv is installed by the agent's uv (another uv's
cache layout would not find the wheel the agent's uv cached).

A cached venv whose uv package was evicted gets that package installed again by the next create
of its env, though the venv needs it not: the package is one of the env's, held while the env
lives like the others (the store holds every key the env counts: its invariant S1), and
skipping it would leave a key counted but not held. That install is the agent's uv linking the
uv from the wheel cache, the index asked for its page at most; a download only when the wheel
cache was cleared too.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import Requirement

from agent.core.uv_spec import UvSpec, options_among, uv_version_matches

SCHEME = "uvtool://"
UV_BIN = "bin/uv"  # the uv binary, relative to the tool's folder (a venv)
# the options of uv pip install that say where packages come from: the tool is fetched from them
_WHERE = frozenset({
    "--index-url", "-i", "--extra-index-url", "--default-index", "--index", "--no-index",
    "--find-links", "-f", "--index-strategy", "--allow-insecure-host", "--offline",
})  # fmt: skip
_NO_BUILD = "--no-build"


@dataclass(frozen=True, slots=True)
class UvTool:
    """The uv a ``uv_version`` asks for: ``version`` (the specifier, "==0.4.0") and the set that
    installs it (``uv<version>``, the env's places, ``--no-build``)."""

    version: str
    spec: UvSpec

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.spec.digest}"


def uv_tool(spec: UvSpec, agent_uv: str) -> UvTool | None:
    """The uv that builds ``spec``'s venv, when the env asks for one the agent's own uv (of
    version ``agent_uv``; "" when unknown: then never taken to satisfy it) does not satisfy;
    None when the agent's uv builds it."""
    installs = uv_set(spec)
    if installs is None or (agent_uv and uv_version_matches(spec, agent_uv)):
        return None
    return UvTool(spec.uv_version, installs)


def uv_set(spec: UvSpec) -> UvSpec | None:
    """The set that installs ``uv<uv_version>`` from the env's places, in its options and its
    option lines (``--no-build``): the uv
    package's (``uv_tool``), and the one the agent's uv installs into the env's venv before its
    packages, whichever uv builds it; None without a ``uv_version``."""
    if not spec.uv_version:
        return None
    return UvSpec(
        packages=(str(Requirement(f"uv{spec.uv_version}")),),
        options=(*options_among((*spec.options, *spec.line_options), _WHERE), _NO_BUILD),
        uv_version="",
        uv_check=False,
        python=spec.python,
        platform=spec.platform,
    )
