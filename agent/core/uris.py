"""Package URIs: what the agent downloads, counts, caches and deletes, named by (kind, URI).

Pure: no I/O. ``parse_uri`` validates one URI a runtime env names (a ``ParsedUri``: scheme,
what to fetch, the path, the digest the URI pins), each scheme by its entry in the registry
``SCHEMES`` (``file``, ``http(s)``, ``gcs``: a package a Ray driver uploaded to its cluster's
GCS, named ``gcs://_ray_pkg_<hash>.zip``, and the object stores ``s3``, ``gs``, ``azure`` and
``abfss``, checked in ``object_uris``), which also holds each scheme's traits (``Scheme``: what
the install layer decides by scheme); ``UriKind`` says how a package is installed and put on the
worker's path; a ``UriKey`` is one (kind, URI) pair, the unit of the reference tables, the store
and the index.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import SplitResult, unquote, urlsplit

from agent.core.errors import InvalidRuntimeEnv, echo, echo_label, type_name
from agent.core.hostname import host_problem
from agent.core.object_uris import check_azure, check_gs, check_s3

MAX_URI_CHARS = 4096
_SHA256_FRAGMENT = re.compile(r"sha256=([0-9a-fA-F]{64})")
_GCS_NAME = re.compile(r"[A-Za-z0-9._-]+")
_WHEEL = ".whl"
# PEP 427: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl, each part escaped
_WHEEL_NAME = re.compile(
    r"[A-Za-z0-9_.]+-[A-Za-z0-9_.+!]+(-[0-9][A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+"
    r"-[A-Za-z0-9_.]+\.whl"
)
_MAX_WHEEL_NAME = 255
_ZIP = ".zip"
_TARBALLS = (".tar.gz", ".tgz", ".tar")  # Ray uploads zips; a tarball is not one yet


class UriKind(StrEnum):
    """How a package is unpacked and put on the worker's path."""

    WORKING_DIR = "working_dir"
    PY_MODULES = "py_modules"
    PIP = "pip"  # a virtualenv built from a requirement set; its uri is pip://<hash>
    JAVA_JARS = "java_jars"  # a .jar kept whole in a folder, or a .zip unpacked
    UV = "uv"  # a virtualenv built by uv from a requirement set; its uri is uv://<hash>
    # The Ray door's pip and uv venvs, that see the node's packages (``PipSpec.sees``): they see
    # the node's packages, so they are other packages than the gRPC door's isolated ones
    RAY_PIP = "ray_pip"  # pip://<hash>, another hash than the isolated venv's
    RAY_UV = "ray_uv"  # uv://<hash>, likewise
    # a uv run project's virtualenv, built by uv from its lock; uvproject://<hash>, derived by
    # a create from its working dir (never named by an env itself)
    UV_PROJECT = "uv_project"
    # a .whl named in py_modules, pip-installed (``--target``) into its folder, as Ray does
    PY_MODULES_WHEEL = "py_modules_wheel"
    # the Ray door's py_modules zip from a scheme whose zips lose a single top folder (http(s),
    # file, object stores): Ray's agent drops it (``remove_top_level_directory``), the gRPC door
    # keeps it, so they are other packages (a gcs:// upload is unpacked as it is by both)
    RAY_PY_MODULES = "ray_py_modules"
    # the uv a uv env's ``uv_version`` asks for, when the agent's own does not satisfy it: a
    # venv holding ``uv<version>`` from the env's indexes, which builds the env's venv
    # (``agent.core.uv_tool``); uvtool://<hash>, named by the env beside its venv
    UV_TOOL = "uv_tool"


@dataclass(frozen=True, order=True, slots=True)
class UriKey:
    """One (kind, URI) pair: the unit the agent downloads, counts, caches and deletes."""

    kind: UriKind
    uri: str

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.uri}"

    @property
    def label(self) -> str:
        """The key as its messages and log lines name it: cut once (``echo_label``)."""
        return echo_label(str(self))


@dataclass(frozen=True, slots=True)
class ParsedUri:
    """A validated package URI. ``url`` is what is fetched (no fragment)."""

    scheme: str  # one of ``SCHEMES``: "file", "http", "https", "gcs", "s3", "gs", "azure"...
    url: str
    path: str  # the local path for file://, the package's name for gcs://, the object's key
    # for an object store (s3://, gs://, azure://, abfss://), else the URL path
    sha256: str | None  # lowercase hex, when the URI carries "#sha256=<hex>"


def parse_uri(field_name: str, value: object, *, wheel_ok: bool = False) -> ParsedUri:
    """Validate one package URI; ``field_name`` names it in errors ("py_modules[2]").
    ``wheel_ok`` (py_modules'): a ``.whl`` is taken, its file name checked (``wheel_name``)."""
    if not isinstance(value, str):
        raise InvalidRuntimeEnv(f"{field_name} must be a URI string, got {type_name(value)}")
    if not value:
        raise InvalidRuntimeEnv(f"{field_name} must not be empty")
    if len(value) > MAX_URI_CHARS:
        raise InvalidRuntimeEnv(
            f"{field_name} is {len(value)} characters long; the limit is {MAX_URI_CHARS}"
        )
    if any(ch.isspace() or ord(ch) < 0x20 or ch == "\x7f" for ch in value):
        raise InvalidRuntimeEnv(
            f"{field_name} {echo(value)} contains whitespace or control characters"
        )
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise InvalidRuntimeEnv(
            f"{field_name} {echo(value)} is not a valid URI: {echo(str(exc))}"
        ) from exc
    scheme = parts.scheme.lower()
    if not scheme:
        raise InvalidRuntimeEnv(
            f"{field_name} {echo(value)} is not a URI: relative and bare paths are not supported; "
            "give file:///absolute/path.zip, http(s)://host/path.zip, gcs://name.zip or an "
            "object store's s3://bucket/key.zip, gs://bucket/key.zip, "
            "azure://container@account.blob.core.windows.net/key.zip"
        )
    entry = SCHEMES.get(scheme)
    if entry is None:
        raise InvalidRuntimeEnv(
            f"{field_name} {echo(value)}: scheme {echo(scheme)} is not supported; "
            f"supported schemes are {supported_schemes()}"
        )
    where = f"{field_name} {echo(value)}"
    if entry.check_text is not None:  # urlsplit drops an empty "#" or "?": the text as written
        entry.check_text(value, where)
    path = entry.check(parts, where)  # first: a scheme that takes no fragment says so
    if path.lower().endswith(_WHEEL):
        if not wheel_ok:
            raise InvalidRuntimeEnv(_wheel_refusal(where, entry))
        wheel_name(path, where)
    sha256 = None
    if parts.fragment:
        match = _SHA256_FRAGMENT.fullmatch(parts.fragment)
        if match is None:
            raise InvalidRuntimeEnv(
                f"{field_name} {echo(value)}: the only fragment understood is "
                "#sha256=<64 hex digits>"
            )
        sha256 = match.group(1).lower()
    url = parts._replace(fragment="").geturl()
    return ParsedUri(scheme, url, path, sha256)


def supported_schemes() -> str:
    """The schemes of ``SCHEMES`` for a message: "file, http and https"."""
    names = list(SCHEMES)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _file_path(parts: SplitResult, where: str) -> str:
    """A file URI names an absolute path on this node; the path is its value."""
    if parts.netloc not in ("", "localhost"):
        raise InvalidRuntimeEnv(
            f"{where}: a file URI names an absolute path on this node "
            f"(file:///path), not host {echo(parts.netloc)}"
        )
    if parts.query:
        raise InvalidRuntimeEnv(f"{where}: a file URI takes no query")
    path = unquote(parts.path)
    if not path.startswith("/") or path == "/":
        raise InvalidRuntimeEnv(f"{where}: the file path must be absolute")
    if "\x00" in path:
        raise InvalidRuntimeEnv(f"{where}: the path contains a NUL byte")
    return path


def _http_path(parts: SplitResult, where: str) -> str:
    """An http(s) URI needs a valid host and port; its path is the URL's."""
    if not parts.hostname:
        raise InvalidRuntimeEnv(f"{where}: an http(s) URI needs a host")
    if (problem := host_problem(parts.hostname)) is not None:  # not later, as a bug in idna
        raise InvalidRuntimeEnv(f"{where}: {problem}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise InvalidRuntimeEnv(f"{where}: bad port: {echo(str(exc))}") from exc
    return parts.path


def _gcs_markers(value: str, where: str) -> None:
    """A gcs URI is the key the package is stored under: no fragment nor query, empty ones
    included (``gcs://a.zip#`` is another key than ``gcs://a.zip``)."""
    if "#" in value:
        raise InvalidRuntimeEnv(
            f"{where}: a gcs URI names a package the Ray driver uploaded, gcs://<name>; "
            "it takes no fragment"
        )
    if "?" in value:
        raise InvalidRuntimeEnv(f"{where}: a gcs URI takes no query (gcs://<name>)")


def _gcs_name(parts: SplitResult, where: str) -> str:
    """A gcs URI names a package in the Ray cluster's GCS key-value store, as a Ray driver
    uploads it (``gcs://_ray_pkg_<hash>.zip``): a name, and nothing else; the name is its value.
    The whole URI is the key the package is stored under, so the URI takes no digest fragment
    (the GCS keeps one value per key, written once by the driver that uploaded it)."""
    name = parts.netloc
    if not name:
        raise InvalidRuntimeEnv(f"{where}: a gcs URI needs a package name (gcs://<name>)")
    if parts.fragment:
        raise InvalidRuntimeEnv(
            f"{where}: a gcs URI names a package the Ray driver uploaded, gcs://<name>; "
            "it takes no fragment"
        )
    if parts.query:
        raise InvalidRuntimeEnv(f"{where}: a gcs URI takes no query (gcs://<name>)")
    if parts.path:
        raise InvalidRuntimeEnv(
            f"{where}: a gcs URI names a package, gcs://<name>, with no path after the name "
            "(a Google Cloud Storage object is gs://<bucket>/<key>)"
        )
    if "@" in name:
        raise InvalidRuntimeEnv(f"{where}: a gcs URI takes no user info (gcs://<name>)")
    if ":" in name and name.rpartition(":")[2].isdecimal():  # a port, where a name goes
        raise InvalidRuntimeEnv(
            f"{where}: a gcs URI takes no port (gcs://<name>): the GCS is the Ray node's own"
        )
    lowered = name.lower()
    if lowered.endswith(_WHEEL):
        return name  # parse_uri refuses a wheel saying why, whatever its name holds ('+')
    if _GCS_NAME.fullmatch(name) is None:
        raise InvalidRuntimeEnv(
            f"{where}: a gcs package name is made of letters, digits, '.', '_' and '-' "
            "(as Ray names its uploads: _ray_pkg_<hash>.zip)"
        )
    if lowered.endswith(_TARBALLS):
        raise InvalidRuntimeEnv(
            f"{where}: a gcs tarball is not supported yet: a gcs package must be a zip "
            "(gcs://<name>.zip, as Ray uploads a working_dir or a py_modules folder)"
        )
    if not lowered.endswith(_ZIP):
        raise InvalidRuntimeEnv(
            f"{where}: a gcs package must be a zip (gcs://<name>.zip, as Ray uploads a "
            "working_dir or a py_modules folder)"
        )
    return name


def is_wheel(uri: ParsedUri) -> bool:
    """The URI names a wheel (a ``.whl`` file), which py_modules pip-installs."""
    return uri.path.lower().endswith(_WHEEL)


def wheel_name(path: str, where: str) -> str:
    """The wheel's file name, the last segment of ``path``, checked against PEP 427's form (pip
    installs a file only by such a name); ``InvalidRuntimeEnv`` naming ``where`` if it is not.
    Pure."""
    name = unquote(path.rpartition("/")[2])
    if len(name) > _MAX_WHEEL_NAME or _WHEEL_NAME.fullmatch(name) is None:
        raise InvalidRuntimeEnv(
            f"{where}: {echo(name)} is not a wheel's file name "
            "(<name>-<version>[-<build>]-<python>-<abi>-<platform>.whl, at most "
            f"{_MAX_WHEEL_NAME} characters, as pip requires)"
        )
    return name


def _wheel_refusal(where: str, scheme: Scheme) -> str:
    """Why a wheel is refused where only zips are taken (working_dir, java_jars): Ray
    pip-installs wheels only when py_modules names them."""
    instead = (
        "name it in py_modules, or list it under pip as 'name @ <URL>'"
        if scheme.pip_url
        else "name it in py_modules"
    )
    return f"{where}: a .whl is a wheel, which only py_modules installs (as Ray does): {instead}"


SchemeCheck = Callable[[SplitResult, str], str]  # (the split URI, "field 'value'") -> path
TextCheck = Callable[[str, str], None]  # (the URI as written, "field 'value'")


@dataclass(frozen=True, slots=True)
class Scheme:
    """What the pure core knows of one scheme a package URI may use: how the rest of such a URI
    is checked (its scheme, fragment and length are checked before), and its traits, which the
    install layer reads rather than naming schemes itself."""

    check: SchemeCheck  # returns the ``ParsedUri.path``
    check_text: TextCheck | None = None  # checks of the URI as written, before ``check``
    pip_url: bool = False  # pip takes it as a requirement's URL ('name @ <URL>'): a wheel's
    # refusal says to list it there
    ranged: bool = False  # a large zip's extraction may overlap its download (ranged reads of
    # its tail: ``overlap.py``)
    keeps_top_level: bool = False  # its zips are unpacked as they are, a working dir's single
    # top folder kept (as Ray unpacks a package its driver uploaded)


# The scheme registry: each scheme a package URI may use, with its check and traits. A new scheme
# is one entry here and one in the install layer's table of fetchers (``install/fetch/fetcher.py``'s
# ``FETCHERS``; a test fails when a scheme is in one and not the other); messages listing the
# supported schemes come from this table. Order: as messages list them.
_HTTP = Scheme(_http_path, pip_url=True, ranged=True)
_AZURE = Scheme(check_azure)
SCHEMES: dict[str, Scheme] = {
    "file": Scheme(_file_path, pip_url=True),
    "http": _HTTP,
    "https": _HTTP,
    "gcs": Scheme(_gcs_name, check_text=_gcs_markers, keeps_top_level=True),
    "s3": Scheme(check_s3),
    "gs": Scheme(check_gs),
    "azure": _AZURE,
    "abfss": _AZURE,
}
