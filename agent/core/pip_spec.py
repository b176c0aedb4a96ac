"""The ``pip`` field: a dependency set, normalised and named by its content. Pure but for
``realpath`` and ``isdir`` of the local paths it names.

Ray's two forms are accepted, as Ray's agent takes them: a list of requirement strings, or
``{"packages": [...], "pip_install_options": [...], "pip_check": ..., "pip_version": ...}``.
``pip_check: false`` (Ray's default) and an empty or null ``pip_version`` change nothing and are
not part of the set's identity. ``pip_check: true`` runs ``pip check`` in the venv after the
install; a ``pip_version`` (a specifier Ray appends to ``pip``) installs that pip into the venv
first, which then installs the set (``agent.install.venvs.pip_commands``); each is part of the
set's identity. Ray's agent writes the list into a requirements file: a line holding options pip
reads there (``--index-url URL``, ``--extra-index-url``, ``--find-links``, ``--pre``...:
``pip_options.REQUIREMENTS_FILE``) is taken, its words kept in order (``PipSpec.lines``) and
given to pip after the options. ``pip_install_options`` takes every option of ``pip install``
(``pip_options.PIP_INSTALL``, whole spellings only) but those refused by name, each saying why
(``pip_options.REFUSED``).
Requirement names are normalised as PEP 503 says (lowercase, runs of ``-_.`` become ``-``),
whitespace is dropped, and the list is sorted and de-duplicated; the set, the options, the
Python version and the platform are hashed into ``pip://<hash>``, so the same set written in
another order or spelling is the same venv.

Every place pip would read packages from is checked up front (``agent.core.places``): a direct
reference (``name @ file:///x.whl``, ``name @ git+file:///repo``), a path, ``--find-links``,
``--index-url``, ``--extra-index-url`` and ``--editable``. A local one must be an absolute path
or a ``file:`` URL; with allowed file roots set it must lie inside one (links resolved:
PERMISSION_DENIED otherwise), a ``--find-links`` must then be a folder (an HTML page's links
lead anywhere) and a local index is refused (its pages, likewise), in an option line as in
the options (``agent.core.install_options``). Options that make pip read a file of requirements
(``-r``, ``-c``, which may name further files, and whose lines pip quotes in its errors), pass
arguments to a build backend (``--config-settings``) or write outside the venv are refused by
name, in the options and as lines. Requirement strings are PEP
508, whose markers compare the interpreter's properties and name no file, or a line pip reads as
a path or URL: a wheel, an sdist or a project folder by its absolute path (or ``file:`` URL),
``-e <folder>``, a bare remote URL (``agent.core.local_sources``: what is taken, what is refused
and why). A set naming files or folders of the node keeps them apart (``PipSpec.sources``): its
key holds their bytes, read at create, so it has none at parse.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from agent.core.errors import InvalidRuntimeEnv, echo
from agent.core.install_options import OptionTables, check_options, pick, read_option_line
from agent.core.kinds import NodeSite
from agent.core.local_sources import (
    LocalSource,
    bare,
    direct,
    editable,
    is_archive_name,
    listed,
    option_line,
    relative,
    source_identity,
)
from agent.core.pip_options import (
    ALLOWED,
    INDEX_OPTIONS,
    PIP_INSTALL,
    PIP_ONLY,
    REFUSED,
    REQUIREMENTS_FILE,
)
from agent.core.places import check_place
from agent.core.roots import FileRoots
from agent.core.uv_options import SPLITS

# a pip set may be built by uv (``pip-installer uv``), which splits some values into several
# places (``--find-links a,b``): each part is checked, for whichever installer reads it
PIP_TABLES = OptionTables(ALLOWED, REFUSED, REQUIREMENTS_FILE, splits=SPLITS)
_FIELDS = ("packages", "pip_install_options", "pip_check", "pip_version")
_MAX_VERSION_CHARS = 100
MAX_REQUIREMENTS = 512
_MAX_ITEM_CHARS = 4096


@dataclass(frozen=True, slots=True)
class PipSpec:
    packages: tuple[str, ...]  # normalised, sorted, distinct
    options: tuple[str, ...]  # as given: their order can matter to pip
    python: str  # "3.11"
    platform: str  # "linux-x86_64"
    # a venv that sees the node's packages after its own (a kind placed ``NODE_SITE``: Ray's
    # venvs; ``agent.install.venvs.build.SITE_PTH``): another venv than an isolated one,
    # so another digest; None (isolated) leaves the digest as it always was
    sees: NodeSite | None = None
    # lines naming files or folders of the node (``agent.core.local_sources``), sorted, distinct;
    # and their bytes' digests, read at create: only then has the set a key
    sources: tuple[LocalSource, ...] = ()
    contents: tuple[str, ...] = ()
    # the option lines of the list (``--extra-index-url URL``), each split into its words, in
    # their order: pip reads them from the requirements file Ray's agent writes
    lines: tuple[tuple[str, ...], ...] = ()
    pip_version: str = ""  # a specifier Ray appends to "pip", installed into the venv first
    pip_check: bool = False  # run ``pip check`` in the venv after the install

    @property
    def digest(self) -> str:
        fields: dict[str, object] = {
            "packages": self.packages,
            "options": self.options,
            "python": self.python,
            "platform": self.platform,
        }
        if self.lines:  # each added only when set: the digests of sets without, as they were
            fields["lines"] = self.lines
        if self.pip_version:
            fields["pip_version"] = self.pip_version
        if self.pip_check:
            fields["pip_check"] = True
        if self.sees is not None:
            fields["node_site"] = True  # the digest's keys as they always were
            fields["node_python"] = self.sees.python
        if self.sources:
            fields["sources"] = source_identity(self.sources, self.contents)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    @property
    def uri(self) -> str:
        return f"pip://{self.digest}"

    def canonical(self) -> dict[str, object]:
        """The env's identity keeps the set, its option lines first (as given, in their order),
        the options and the keys that change the venv (the interpreter is the node's)."""
        out: dict[str, object] = {
            "packages": [
                *(shlex.join(line) for line in self.lines),
                *listed(self.packages, self.sources),
            ],
            "pip_install_options": list(self.options),
        }
        if self.pip_version:
            out["pip_version"] = self.pip_version
        if self.pip_check:
            out["pip_check"] = True
        return out

    @property
    def line_options(self) -> tuple[str, ...]:
        """The option lines' words, as the installer is given them after the options (a line's
        ``--index-url`` wins over the options', as a requirements file's does)."""
        return tuple(word for line in self.lines for word in line)

    @property
    def pip_only(self) -> tuple[str, ...]:
        """What of the set ``uv pip install`` does not take: its options and option lines' of
        ``PIP_ONLY``, and a ``pip_version`` (a pip installed into the venv, which installs the
        set). Such a set is built by pip whatever the ``pip-installer`` setting."""
        given = (*self.options, *self.line_options)
        version = ("pip_version",) if self.pip_version else ()
        return (*(option for option in given if option in PIP_ONLY), *version)

    def uv_options(self) -> tuple[str, ...]:
        """The options and option lines as uv is given them: pip's ``--no-cache-dir`` (which uv
        takes, for its ``--no-cache``) dropped, as a uv env's ``--no-cache`` is: the venvs link
        from the agent's wheel cache, counted in its budget, and pip's meaning (no download
        cache) is kept by that cache being the agent's, not the user's."""
        given = (*self.options, *self.line_options)
        return tuple(option for option in given if option != "--no-cache-dir")

    def index_options(self) -> tuple[str, ...]:
        """The options and option lines that say where pip finds packages (``INDEX_OPTIONS``):
        the ``pip_version``'s pip is installed from there."""
        return pick((*self.options, *self.line_options), INDEX_OPTIONS, PIP_INSTALL)


def normalize_requirement(text: str, field: str) -> str:
    """One requirement in a canonical spelling (PEP 508 parsed by ``packaging``): the name per
    PEP 503, extras sorted, the specifier set and marker as packaging prints them. Whitespace
    inside a marker's quoted values is meaning, and is kept."""
    return _canonical(_requirement(text, field))


def _requirement(text: str, field: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise _not_a_requirement(text, field, exc) from exc


def _not_a_requirement(text: str, field: str, exc: InvalidRequirement) -> InvalidRuntimeEnv:
    reason = (str(exc).splitlines() or [""])[0][:200]
    return InvalidRuntimeEnv(
        f"{field} {echo(text)} is not a requirement (a name, optionally with extras, a "
        "version specifier or a marker, such as 'requests>=2.31'; or a wheel, an sdist or a "
        f"project folder by its absolute path, such as '/abs/x-1.0-py3-none-any.whl'): {reason}"
    )


def _canonical(req: Requirement) -> str:
    out: str = canonicalize_name(req.name)
    if req.extras:
        out += "[" + ",".join(sorted(canonicalize_name(e) for e in req.extras)) + "]"
    if req.url:
        out += f" @ {req.url}"
    else:
        out += str(req.specifier)
    if req.marker is not None:
        out += f" ; {req.marker}" if req.url else f"; {req.marker}"  # a URL ends at a space
    return out


def parse_pip(value: object, *, file_roots: Sequence[str] | FileRoots = ()) -> PipSpec | None:
    """The ``pip`` field, validated and normalised; None when it names nothing. ``file_roots``:
    resolved once (``FileRoots.of``), or folder names, resolved on each call."""
    if value is None:
        return None
    version, check = "", False
    if isinstance(value, list):
        packages, options = value, []
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise InvalidRuntimeEnv(
                f"unknown pip field(s) {', '.join(echo(k) for k in unknown[:5])}; supported: "
                f"{', '.join(_FIELDS)}"
            )
        version, check = _ray_pip_keys(value)
        packages = value.get("packages", [])
        options = value.get("pip_install_options", [])
    else:
        raise InvalidRuntimeEnv("pip must be a list of requirements or an object with packages")
    found = checked_set("pip", packages, "pip_install_options", options, file_roots, PIP_TABLES)
    if not found.packages and not found.sources:
        return None
    python, machine = interpreter()
    return PipSpec(
        packages=found.packages,
        options=found.options,
        python=python,
        platform=machine,
        sources=found.sources,
        lines=found.lines,
        pip_version=version,
        pip_check=check,
    )


@dataclass(frozen=True, slots=True)
class CheckedSet:
    """A pip or uv set's parts, each checked: see ``checked_set``."""

    packages: tuple[str, ...]
    sources: tuple[LocalSource, ...]
    options: tuple[str, ...]
    lines: tuple[tuple[str, ...], ...]


def checked_set(
    field: str,
    packages: object,
    options_field: str,
    options: object,
    file_roots: Sequence[str] | FileRoots,
    tables: OptionTables,
) -> CheckedSet:
    """A pip or uv set's requirements (parsed, normalised, sorted; () when it names none), its
    lines naming files or folders of the node (``LocalSource``, sorted), its option lines (each
    split into words, in their order) and install options (``tables.dropped`` ones left out),
    each checked against the tool's ``tables`` and the file roots. ``file_roots``: resolved once
    (``FileRoots.of``), or folder names."""
    requirements = check_items(f"{field}.packages", packages)
    given = check_items(f"{field}.{options_field}", options)
    kept = tuple(option for option in given if option not in tables.dropped)
    roots = file_roots if isinstance(file_roots, FileRoots) else FileRoots.of(file_roots)
    where = f"{field}.{options_field}"
    check_options(kept, roots, where, tables.allowed, tables.refused, splits=tables.splits)
    named, sources, lines = parse_requirements(
        requirements, f"{field}.packages", roots, f"{field}.{options_field}", tables
    )
    return CheckedSet(named, sources, kept, lines)


def interpreter() -> tuple[str, str]:
    """The python (major.minor) and platform a venv built here is for: part of its identity."""
    return (
        f"{sys.version_info.major}.{sys.version_info.minor}",
        f"{sys.platform}-{platform.machine()}",
    )


def check_items(field: str, items: object) -> list[str]:
    """``items``, which must be a list of strings, bounded in count and in each one's length,
    no NUL nor newline."""
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InvalidRuntimeEnv(f"{field} must be a list of strings")
    if len(items) > MAX_REQUIREMENTS:
        raise InvalidRuntimeEnv(f"{field} has {len(items)} items; the limit is {MAX_REQUIREMENTS}")
    for item in items:
        if len(item) > _MAX_ITEM_CHARS or "\x00" in item or "\n" in item:
            raise InvalidRuntimeEnv(
                f"{field}: {echo(item)} is not a valid item (at most {_MAX_ITEM_CHARS} "
                "characters, no NUL, no newline)"
            )
    return items


def parse_requirements(
    packages: Sequence[str], field: str, roots: FileRoots, options_field: str, tables: OptionTables
) -> tuple[tuple[str, ...], tuple[LocalSource, ...], tuple[tuple[str, ...], ...]]:
    """The requirements, each parsed (PEP 508, or a line pip reads as a path or URL) and each
    place it reads checked against the roots, normalised, sorted and de-duplicated: the lines
    naming files or folders of the node apart (``agent.core.local_sources``), and the option
    lines (``tables.lines``) apart, each split into its words, in their order."""
    normalised: set[str] = set()
    sources: dict[str, LocalSource] = {}
    lines: list[tuple[str, ...]] = []
    for i, text in enumerate(packages):
        found = _line(text.strip(), f"{field}[{i}]", roots, options_field, tables)
        if isinstance(found, LocalSource):
            sources.setdefault(found.line, found)
        elif isinstance(found, tuple):
            lines.append(found)
        elif found is not None:
            normalised.add(found)
    ordered = tuple(sources[line] for line in sorted(sources))
    return tuple(sorted(normalised)), ordered, tuple(lines)


def _line(
    text: str, where: str, roots: FileRoots, options_field: str, tables: OptionTables
) -> str | LocalSource | tuple[str, ...] | None:
    """One package line as the tool reads it: a requirement (normalised), a local source, an
    option line (its words), or None (a line the tool ignores)."""
    if text.startswith("-"):
        source = editable(text, where, roots, options_field)
        if source is not None:
            return source
        if not tables.lines:
            raise option_line(text, where, options_field)
        return read_option_line(text, where, roots, options_field, tables)
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        found = bare(text, where, roots)
        if found is None:
            raise _not_a_requirement(text, where, exc) from exc
        return found
    canonical = _canonical(requirement)
    if requirement.url:
        marker = "" if requirement.marker is None else str(requirement.marker)
        head = canonical.partition(" @ ")[0]
        source = direct(canonical, head, marker, requirement.url, where, roots)
        if source is not None:
            return source
        check_place(requirement.url, where, roots, vcs=True, path=False)
    elif not requirement.specifier and not requirement.extras and is_archive_name(text):
        raise relative(where, text)  # pip would take it as a file in its working directory
    return canonical


def _ray_pip_keys(value: dict[str, object]) -> tuple[str, bool]:
    """Ray's ``pip_version`` (a specifier it appends to "pip": "==23.2.1", "<24,>=22"; "" when
    unset, empty or null), normalised, and ``pip_check``."""
    check = value.get("pip_check", False)
    if not isinstance(check, bool):
        raise InvalidRuntimeEnv(f"pip.pip_check must be a boolean, got {echo(check)}")
    version = value.get("pip_version")
    if version is None:
        return "", check
    if not isinstance(version, str):
        raise InvalidRuntimeEnv(f"pip.pip_version must be a string, got {echo(version)}")
    if not version.strip():
        return "", check
    if len(version) > _MAX_VERSION_CHARS:
        raise InvalidRuntimeEnv(
            f"pip.pip_version {echo(version)} is {len(version)} characters long; the limit is "
            f"{_MAX_VERSION_CHARS}"
        )
    try:
        return str(SpecifierSet(version)), check
    except InvalidSpecifier as exc:
        raise InvalidRuntimeEnv(
            f"pip.pip_version {echo(version)} is not a version specifier (such as '==23.2.1' or "
            "'<24,>=22'; Ray appends it to 'pip')"
        ) from exc
