"""The ``uv`` field: a dependency set installed with uv, normalised and named by its content.
Pure but for ``realpath`` and ``isdir`` of the local paths it names (as ``pip_spec``).

Ray's two forms are accepted: a list of requirement strings, or ``{"packages": [...],
"uv_version": ..., "uv_check": ..., "uv_pip_install_options": [...]}``. The two spellings of
one set are one venv: the list, and the object with the same packages and nothing else (or
``uv_check: false``, an empty or null ``uv_version``, no options), hash alike into
``uv://<hash>``. Requirements are normalised as ``pip``'s are (``parse_requirements``), and
lines naming files or folders of the node are taken as ``pip``'s are (``local_sources``).

- ``uv_version``: a version specifier Ray appends to ``uv`` (``"==0.13.9"``, ``">=0.5"``). Ray
  installs that uv and builds the venv with it; so does this agent when its own uv (beside its
  python, or on PATH) does not satisfy the specifier: that uv is a package of the env, fetched
  once per root from the env's indexes and shared (``agent.core.uv_tool``); a uv no index has
  fails the install FAILED_PRECONDITION in the installer's words. It stays in the venv's key.
- ``uv_check: true`` runs ``uv pip check`` in the venv after the install, as Ray does; a
  conflict fails the install with uv's lines.
- ``uv_pip_install_options``: every option of ``uv pip install`` (``agent.core.uv_options``:
  the installed uv's table, whole spellings only) but those refused by name, each saying why:
  what reads a file of the node (``-r``, ``-c``, ``--overrides``, ``--cert``, ``--config-file``),
  writes outside the venv (``--target``, ``--prefix``, ``--system``, ``--cache-dir``), picks
  another interpreter (``-p``), the link mode (``--link-mode``: the agent's)... Each place they
  read packages from is checked as ``pip``'s are, each part of a value uv splits
  (``--find-links a,b``) apart. ``--no-cache`` (``-n``), which Ray's driver writes into the
  object form as its default, is dropped: the agent's venvs are all linked from its one wheel
  cache, counted in its budget (the point of Ray's default is to keep uv's own cache in the
  home folder from growing unbounded), so Ray's normalised object and the list are one venv.
- Option lines: Ray's agent writes the list into a requirements file, so a line holding an
  option uv reads there (``--index-url URL``, ``--extra-index-url``, ``--find-links``,
  ``--no-index``...: ``uv_options.REQUIREMENTS_FILE``) is taken as uv reads it (one option a
  line, its value up to a ``#``), its words kept in order (``UvSpec.lines``, in the key) and
  given to uv after the options, as uv makes of them (``UvSpec.line_options``); the lines uv
  ignores (``--pre``, ``--trusted-host``...) are taken and left out, as uv leaves them.

``uv`` and ``pip`` with the same packages are *not* one venv: a different resolver, and options
of a different tool; and both fields in one env are refused, as Ray refuses them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from agent.core.errors import InvalidRuntimeEnv, echo, type_name
from agent.core.install_options import OptionTables
from agent.core.kinds import NodeSite
from agent.core.local_sources import LocalSource, listed, source_identity
from agent.core.pip_spec import checked_set, interpreter
from agent.core.roots import FileRoots
from agent.core.uv_options import (
    ALLOWED,
    DROPPED,
    IGNORED_LINES,
    REFUSED,
    REQUIREMENTS_FILE,
    SPLITS,
)

_FIELDS = ("packages", "uv_version", "uv_check", "uv_pip_install_options")
_MAX_VERSION_CHARS = 100
_ALLOWED = ALLOWED  # uv pip install's options an env may pass (``agent.core.uv_options``)
_TABLES = OptionTables(
    ALLOWED,
    REFUSED,
    REQUIREMENTS_FILE,
    DROPPED,
    tool="uv",
    splits=SPLITS,
    ignored_lines=IGNORED_LINES,
    one_option_a_line=True,
)
_DEFAULT_INDEX = ("-i", "--index-url", "--default-index")  # uv keeps the first it is given
_ONCE = ("--no-index", "--require-hashes")  # flags uv's command line takes once


@dataclass(frozen=True, slots=True)
class UvSpec:
    packages: tuple[str, ...]  # normalised, sorted, distinct
    options: tuple[str, ...]  # as given: their order can matter to uv
    uv_version: str  # a specifier the uv that builds the venv satisfies; "" for any
    uv_check: bool  # run ``uv pip check`` after the install
    python: str  # "3.11"
    platform: str  # "linux-x86_64"
    # a venv that sees the node's packages after its own (a kind placed ``NODE_SITE``: Ray's
    # venvs; ``agent.install.venvs.build.SITE_PTH``): another venv than an isolated one,
    # so another digest; None (isolated) leaves the digest as it always was
    sees: NodeSite | None = None
    sources: tuple[LocalSource, ...] = ()  # as ``PipSpec.sources``
    contents: tuple[str, ...] = ()  # their digests, read at create
    # the option lines of the list (``--index-url URL``), each its words, in their order: uv
    # reads them from the requirements file Ray's agent writes (``PipSpec.lines``)
    lines: tuple[tuple[str, ...], ...] = ()

    @property
    def digest(self) -> str:
        identity: dict[str, object] = {
            "tool": "uv",
            "packages": self.packages,
            "options": self.options,
            "python": self.python,
            "platform": self.platform,
        }
        if self.lines:  # only when set: the digests of sets without, as they were
            identity["lines"] = self.lines
        if self.uv_version:
            identity["uv_version"] = self.uv_version
        if self.uv_check:
            identity["uv_check"] = True
        if self.sees is not None:
            identity["node_site"] = True  # the digest's keys as they always were
            identity["node_python"] = self.sees.python
        if self.sources:
            identity["sources"] = source_identity(self.sources, self.contents)
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    @property
    def uri(self) -> str:
        return f"uv://{self.digest}"

    def canonical(self) -> dict[str, object]:
        """The env's identity: the set, its option lines first (as given, in their order), the
        options, and the keys that change the venv."""
        out: dict[str, object] = {
            "packages": [
                *(shlex.join(line) for line in self.lines),
                *listed(self.packages, self.sources),
            ],
            "uv_pip_install_options": list(self.options),
        }
        if self.uv_version:
            out["uv_version"] = self.uv_version
        if self.uv_check:
            out["uv_check"] = True
        return out

    @property
    def line_options(self) -> tuple[str, ...]:
        """The option lines' words as uv's command line takes them after the options, meaning
        what uv makes of them in a requirements file: there, the options' default index wins
        over a line's ``--index-url`` (dropped), and a flag the options hold, or a line before,
        counts once (uv's command line refuses it twice)."""
        given = {option.partition("=")[0] for option in self.options}
        out: list[str] = []
        for line in self.lines:
            flag = line[0].partition("=")[0]
            if flag in _DEFAULT_INDEX and given.intersection(_DEFAULT_INDEX):
                continue
            if flag in _ONCE and flag in given:
                continue
            given.add(flag)
            out.extend(line)
        return tuple(out)


def parse_uv(value: object, *, file_roots: Sequence[str] | FileRoots = ()) -> UvSpec | None:
    """The ``uv`` field, validated and normalised; None when it names nothing."""
    if value is None:
        return None
    version, check = "", False
    if isinstance(value, list):
        packages, options = value, []
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise InvalidRuntimeEnv(
                f"unknown uv field(s) {', '.join(echo(k) for k in unknown[:5])}; supported: "
                f"{', '.join(_FIELDS)}"
            )
        if "packages" not in value:
            raise InvalidRuntimeEnv("uv must include the field packages (a list of requirements)")
        packages = value["packages"]
        options = value.get("uv_pip_install_options", [])
        check = _check_flag(value.get("uv_check", False))
        version = _version(value.get("uv_version"))
    else:
        raise InvalidRuntimeEnv(
            f"uv must be a list of requirements or an object with packages, got {type_name(value)}"
        )
    found = checked_set("uv", packages, "uv_pip_install_options", options, file_roots, _TABLES)
    _one_index_line(found.lines)
    if not found.packages and not found.sources:
        return None
    python, machine = interpreter()
    return UvSpec(
        packages=found.packages,
        options=found.options,
        uv_version=version,
        uv_check=check,
        python=python,
        platform=machine,
        sources=found.sources,
        lines=found.lines,
    )


def _one_index_line(lines: tuple[tuple[str, ...], ...]) -> None:
    """uv refuses a requirements file with two ``--index-url`` lines: so does the agent."""
    indexes = [line for line in lines if line[0].partition("=")[0] in ("-i", "--index-url")]
    if len(indexes) > 1:
        raise InvalidRuntimeEnv(
            f"uv.packages: {len(indexes)} --index-url lines ({echo(shlex.join(indexes[1]))} "
            "after the first); uv reads one from a requirements file: name the others with "
            "--extra-index-url"
        )


def _check_flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRuntimeEnv(f"uv.uv_check must be a boolean, got {echo(value)}")
    return value


def _version(value: object) -> str:
    """Ray's ``uv_version``: a specifier (``==0.13.9``), normalised; "" when unset."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRuntimeEnv(f"uv.uv_version must be a string, got {type_name(value)}")
    if not value.strip():
        return ""
    if len(value) > _MAX_VERSION_CHARS:
        raise InvalidRuntimeEnv(
            f"uv.uv_version {echo(value)} is {len(value)} characters long; the limit is "
            f"{_MAX_VERSION_CHARS}"
        )
    try:
        return str(SpecifierSet(value))
    except InvalidSpecifier as exc:
        raise InvalidRuntimeEnv(
            f"uv.uv_version {echo(value)} is not a version specifier (such as '==0.13.9' or "
            "'>=0.5'; Ray appends it to 'uv')"
        ) from exc


def uv_version_matches(spec: UvSpec, version: str) -> bool:
    """Whether a uv of ``version`` ("0.13.9") satisfies the env's ``uv_version``."""
    return not spec.uv_version or SpecifierSet(spec.uv_version).contains(version, prereleases=True)


def options_among(options: tuple[str, ...], flags: frozenset[str]) -> tuple[str, ...]:
    """The options of ``options`` (a set's, checked against ``_ALLOWED``) whose flag is one of
    ``flags``, each with its value, in their order: where the uv of a ``uv_version`` is fetched
    from (``agent.core.uv_tool``)."""
    out: list[str] = []
    i = 0
    while i < len(options):
        flag, eq, _ = options[i].partition("=")
        taken = options[i : i + 2] if _ALLOWED.get(flag, False) and not eq else options[i : i + 1]
        if flag in flags:
            out.extend(taken)
        i += len(taken)
    return tuple(out)
