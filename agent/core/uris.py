"""Package URIs: what the agent downloads, counts, caches and deletes, named by (kind, URI).

Pure: no I/O. ``parse_uri`` validates one URI a runtime env names (a ``ParsedUri``: scheme,
what to fetch, the path, the digest the URI pins); ``UriKind`` says how a package is installed and
put on the worker's path; a ``UriKey`` is one (kind, URI) pair, the unit of the reference tables,
the store and the index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote, urlsplit

from agent.core.errors import InvalidRuntimeEnv, echo, echo_label, type_name
from agent.core.hostname import host_problem

MAX_URI_CHARS = 4096
_SHA256_FRAGMENT = re.compile(r"sha256=([0-9a-fA-F]{64})")


class UriKind(StrEnum):
    """How a package is unpacked and put on the worker's path."""

    WORKING_DIR = "working_dir"
    PY_MODULES = "py_modules"
    PIP = "pip"  # a virtualenv built from a requirement set; its uri is pip://<hash>


@dataclass(frozen=True, order=True)
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


@dataclass(frozen=True)
class ParsedUri:
    """A validated package URI. ``url`` is what is fetched (no fragment)."""

    scheme: str  # "file", "http" or "https"
    url: str
    path: str  # the local path for file://, the URL path otherwise
    sha256: str | None  # lowercase hex, when the URI carries "#sha256=<hex>"


def parse_uri(field_name: str, value: object) -> ParsedUri:
    """Validate one package URI; ``field_name`` names it in errors ("py_modules[2]")."""
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
            "give file:///absolute/path.zip or http(s)://host/path.zip"
        )
    if scheme not in ("file", "http", "https"):
        raise InvalidRuntimeEnv(
            f"{field_name} {echo(value)}: scheme {echo(scheme)} is not supported; "
            "supported schemes are file, http and https"
        )
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
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidRuntimeEnv(
                f"{field_name} {echo(value)}: a file URI names an absolute path on this node "
                f"(file:///path), not host {echo(parts.netloc)}"
            )
        if parts.query:
            raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: a file URI takes no query")
        path = unquote(parts.path)
        if not path.startswith("/") or path == "/":
            raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: the file path must be absolute")
        if "\x00" in path:
            raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: the path contains a NUL byte")
        return ParsedUri("file", url, path, sha256)
    if not parts.hostname:
        raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: an http(s) URI needs a host")
    if (problem := host_problem(parts.hostname)) is not None:  # not later, as a bug in idna
        raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: {problem}")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise InvalidRuntimeEnv(f"{field_name} {echo(value)}: bad port: {echo(str(exc))}") from exc
    return ParsedUri(scheme, url, parts.path, sha256)
