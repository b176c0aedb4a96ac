"""The ``pip`` field: a dependency set, normalised and named by its content. Pure but for
``realpath`` and ``isdir`` of the local paths it names.

Ray's two forms are accepted: a list of requirement strings, or
``{"packages": [...], "pip_install_options": [...]}``, with Ray's normalised keys
``pip_check`` and ``pip_version``: ``pip_check: false`` (Ray's default) and an empty or null
``pip_version`` change nothing and are not part of the set's identity; ``pip_check: true`` is
refused (this agent does not run ``pip check`` after installing), and so is a ``pip_version``
(the venv is made with the pip this agent installs with: the ``pip_installer`` setting).
Requirement names are normalised as PEP 503 says (lowercase, runs of ``-_.`` become ``-``),
whitespace is dropped, and the list is sorted and de-duplicated; the set, the options, the
Python version and the platform are hashed into ``pip://<hash>``, so the same set written in
another order or spelling is the same venv.

Every place pip would read packages from is checked up front (``agent.core.places``): a direct
reference (``name @ file:///x.whl``, ``name @ git+file:///repo``), a path, ``--find-links``,
``--index-url``, ``--extra-index-url`` and ``--editable``. A local one must be an absolute path
or a ``file:`` URL; with allowed file roots set it must lie inside one (links resolved:
PERMISSION_DENIED otherwise), a ``--find-links`` must then be a folder (an HTML page's links
lead anywhere) and a local index is refused (its pages, likewise). Options that make pip read a
file of requirements (``-r``, ``-c``, which may name further files, and whose lines pip quotes
in its errors), pass arguments to a build backend (``--config-settings``) or write outside the
venv are refused by name; only the options of ``_ALLOWED`` pass. Requirement strings are PEP
508, whose markers compare the interpreter's properties and name no file, or a line pip reads as
a path or URL: a wheel, an sdist or a project folder by its absolute path (or ``file:`` URL),
``-e <folder>``, a bare remote URL (``agent.core.local_sources``: what is taken, what is refused
and why). A set naming files or folders of the node keeps them apart (``PipSpec.sources``): its
key holds their bytes, read at create, so it has none at parse.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo
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
from agent.core.places import check_place
from agent.core.roots import FileRoots

# pip install options allowed in an env, by their full spelling only (pip would also take any
# unambiguous prefix, such as --targ for --target: an allow-list of whole names refuses those),
# each with whether it takes a value. Short options only alone and with their value apart.
_ALLOWED: dict[str, bool] = {
    "--index-url": True, "-i": True, "--extra-index-url": True, "--no-index": False,
    "--find-links": True, "-f": True, "--trusted-host": True, "--pre": False,
    "--no-deps": False, "--only-binary": True, "--no-binary": True, "--prefer-binary": False,
    "--no-build-isolation": False, "--use-pep517": False, "--no-use-pep517": False,
    "--upgrade": False, "-U": False, "--upgrade-strategy": True, "--force-reinstall": False,
    "--ignore-installed": False, "-I": False, "--require-hashes": False,
    "--no-cache-dir": False, "--no-compile": False, "--compile": False, "--timeout": True,
    "--retries": True, "--progress-bar": True, "--quiet": False, "-q": False,
    "--verbose": False, "-v": False, "--no-warn-script-location": False, "--editable": True,
    "-e": True, "--no-color": False,
}  # fmt: skip
# Refused by name, each with why: a refusal says what to do instead.
_FILE_LIST = "list the requirements in pip.packages instead"
_WRITES = "writes outside the env's venv"
_REFUSED: dict[str, str] = {
    "-r": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "--requirement": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "-c": f"reads a constraints file (which may name further files); {_FILE_LIST}",
    "--constraint": f"reads a constraints file (which may name further files); {_FILE_LIST}",
    "-C": "passes arguments to a package's build backend, which may take them as paths",
    "--config-settings": "passes arguments to a package's build backend, which may take them "
    "as paths",
    "-t": _WRITES, "--target": _WRITES, "--prefix": _WRITES, "--root": _WRITES,
    "--user": _WRITES, "--src": _WRITES, "--cache-dir": _WRITES, "--log": _WRITES,
    "--report": _WRITES, "--build": _WRITES, "-b": _WRITES,
}  # fmt: skip
_FIND_LINKS = ("-f", "--find-links")
# uv's: the last two (pip has neither)
_INDEXES = ("-i", "--index-url", "--extra-index-url", "--index", "--default-index")
_EDITABLE = ("-e", "--editable")
MAX_REQUIREMENTS = 512
_RAY_PIP_KEYS = ("pip_check", "pip_version")  # Ray's normalised form adds them
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

    @property
    def digest(self) -> str:
        fields: dict[str, object] = {
            "packages": self.packages,
            "options": self.options,
            "python": self.python,
            "platform": self.platform,
        }
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

    def canonical(self) -> dict[str, list[str]]:
        """The env's identity keeps the set and the options (the interpreter is the node's)."""
        return {
            "packages": listed(self.packages, self.sources),
            "pip_install_options": list(self.options),
        }

    @property
    def pip_only(self) -> tuple[str, ...]:
        """The options ``uv pip install`` does not take (``PIP_ONLY``): such a set is built by
        pip whatever the ``pip-installer`` setting, so its options mean what pip says."""
        return tuple(option for option in self.options if option in PIP_ONLY)

    def uv_options(self) -> tuple[str, ...]:
        """The options as uv is given them: pip's ``--no-cache-dir`` (which uv takes, for its
        ``--no-cache``) dropped, as a uv env's ``--no-cache`` is: the venvs link from the
        agent's wheel cache, counted in its budget, and pip's meaning (no download cache) is
        kept by that cache being the agent's, not the user's."""
        return tuple(option for option in self.options if option != "--no-cache-dir")


# Options of _ALLOWED that ``uv pip install`` refuses as unknown (uv 0.13): a pip env naming one
# is built by pip. The others uv takes as pip does (--trusted-host, --pre, --force-reinstall,
# --compile, --no-compile, --no-cache-dir among them).
PIP_ONLY = frozenset({
    "--prefer-binary", "--use-pep517", "--no-use-pep517", "--upgrade-strategy",
    "--ignore-installed", "-I", "--timeout", "--retries", "--progress-bar",
    "--no-warn-script-location",
})  # fmt: skip


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
    if isinstance(value, list):
        packages, options = value, []
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"packages", "pip_install_options", *_RAY_PIP_KEYS})
        if unknown:
            raise InvalidRuntimeEnv(
                f"unknown pip field(s) {', '.join(echo(k) for k in unknown[:5])}; supported: "
                "packages, pip_install_options, pip_check (false), pip_version (unset)"
            )
        _check_ray_pip_keys(value)
        packages = value.get("packages", [])
        options = value.get("pip_install_options", [])
    else:
        raise InvalidRuntimeEnv("pip must be a list of requirements or an object with packages")
    normalised, sources, kept = checked_set(
        "pip", packages, "pip_install_options", options, file_roots, _ALLOWED, _REFUSED
    )
    if not normalised and not sources:
        return None
    python, machine = interpreter()
    return PipSpec(
        packages=normalised, options=kept, python=python, platform=machine, sources=sources
    )


def checked_set(
    field: str,
    packages: object,
    options_field: str,
    options: object,
    file_roots: Sequence[str] | FileRoots,
    allowed: Mapping[str, bool],
    refused: Mapping[str, str],
    dropped: Collection[str] = (),
) -> tuple[tuple[str, ...], tuple[LocalSource, ...], tuple[str, ...]]:
    """A pip or uv set's requirements (parsed, normalised, sorted; () when it names none), its
    lines naming files or folders of the node (``LocalSource``, sorted) and install options
    (``dropped`` ones left out), each checked against its allow-list and the file roots.
    ``file_roots``: resolved once (``FileRoots.of``), or folder names."""
    requirements = check_items(f"{field}.packages", packages)
    given = check_items(f"{field}.{options_field}", options)
    kept = tuple(option for option in given if option not in dropped)
    roots = file_roots if isinstance(file_roots, FileRoots) else FileRoots.of(file_roots)
    check_options(kept, roots, f"{field}.{options_field}", allowed, refused)
    named, sources = parse_requirements(
        requirements, f"{field}.packages", roots, f"{field}.{options_field}"
    )
    return named, sources, kept


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
    packages: Sequence[str], field: str, roots: FileRoots, options_field: str
) -> tuple[tuple[str, ...], tuple[LocalSource, ...]]:
    """The requirements, each parsed (PEP 508, or a line pip reads as a path or URL) and each
    place it reads checked against the roots, normalised, sorted and de-duplicated: the lines
    naming files or folders of the node apart (``agent.core.local_sources``)."""
    normalised: set[str] = set()
    sources: dict[str, LocalSource] = {}
    for i, text in enumerate(packages):
        found = _line(text.strip(), f"{field}[{i}]", roots, options_field)
        if isinstance(found, LocalSource):
            sources.setdefault(found.line, found)
        else:
            normalised.add(found)
    return tuple(sorted(normalised)), tuple(sources[line] for line in sorted(sources))


def _line(text: str, where: str, roots: FileRoots, options_field: str) -> str | LocalSource:
    """One package line as pip reads it: a requirement (normalised), or a local source."""
    if text.startswith("-"):
        source = editable(text, where, roots, options_field)
        if source is None:
            raise option_line(text, where, options_field)
        return source
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


def _check_ray_pip_keys(value: dict[str, object]) -> None:
    """Ray's ``pip_check`` and ``pip_version``: their do-nothing values only (see the module
    docstring); anything else is refused, saying what this agent does instead."""
    check = value.get("pip_check", False)
    if not isinstance(check, bool):
        raise InvalidRuntimeEnv(f"pip.pip_check must be a boolean, got {echo(check)}")
    if check:
        raise InvalidRuntimeEnv(
            "pip.pip_check true is not supported: this agent does not run 'pip check' after "
            "installing; set it to false (Ray's default) or leave it out"
        )
    version = value.get("pip_version")
    if version is not None and not isinstance(version, str):
        raise InvalidRuntimeEnv(f"pip.pip_version must be a string, got {echo(version)}")
    if version:
        raise InvalidRuntimeEnv(
            f"pip.pip_version {echo(version)} is not supported: this agent makes each venv with "
            "its own pip (the pip_installer setting); leave pip_version out"
        )


def check_options(
    options: Sequence[str],
    roots: FileRoots,
    field: str,
    allowed: Mapping[str, bool],
    refused: Mapping[str, str],
) -> None:
    """Every option must be on the allow-list (``allowed``: each full spelling, and whether it
    takes a value), spelled in full; one of ``refused`` is refused with its reason; each place
    an option names to read packages from (``-f``, ``-i``, ``-e`` and their long names) must be
    allowed."""
    i = 0
    while i < len(options):
        option = options[i]
        flag, eq, attached = option.partition("=")
        takes_value = allowed.get(flag)
        if flag in refused:
            raise InvalidRuntimeEnv(f"{field}: {echo(option)} is refused: {refused[flag]}")
        if takes_value is None or (eq and (not takes_value or not flag.startswith("--"))):
            raise InvalidRuntimeEnv(
                f"{field}: {echo(option)} is not an option an env may pass (options that "
                "write outside the env's venv, such as --target, --prefix, --user, --root, or "
                "read files of requirements, such as -r, -c, are refused; so are abbreviations "
                "and short options run together)"
            )
        value = attached
        if takes_value and not eq:
            if i + 1 >= len(options):
                raise InvalidRuntimeEnv(f"{field}: {echo(option)} needs a value")
            i += 1
            value = options[i]
        where = f"{field}: {flag}"
        if flag in _FIND_LINKS:
            path = check_place(value, where, roots, vcs=False)
            if path is not None and roots and not os.path.isdir(os.path.realpath(path)):
                raise InvalidRuntimeEnv(
                    f"{where} {echo(value)} is not a folder: with allow-file-root set, a "
                    "local --find-links must be a folder of archives (pip would follow an HTML "
                    "page's links wherever they lead)"
                )
        elif flag in _INDEXES:
            path = check_place(value, where, roots, vcs=False)
            if path is not None and roots:
                raise PermissionDenied(
                    f"{where} {echo(value)} is a local index, refused with allow-file-root "
                    "set (its pages may link anywhere); name a folder of archives inside the "
                    "allowed roots with --find-links instead"
                )
        elif flag in _EDITABLE and check_place(value, where, roots, vcs=True) and not roots:
            raise PermissionDenied(
                f"{where} {echo(value)}: an editable install of a local path needs the "
                "allow-file-root setting, and the path inside one of its folders"
            )
        i += 1
