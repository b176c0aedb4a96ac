"""The places a pip or uv install may read packages from, checked before anything runs.

A place is remote (http(s), or a VCS over http(s), ssh, git, svn) or local: a ``file:`` URL
naming no host (its percent-escapes decoded, as pip decodes them), a VCS over ``file:``, or an
absolute path. With allowed file roots set, a local place must lie inside one once links and
``..`` are resolved (``PermissionDenied`` otherwise); a relative path, or any other scheme, is
refused whatever the roots: it would mean the agent's working directory, or a tool's own
resolution. ``pip_spec`` checks a set's requirements and options with it, ``local_sources`` the
package lines naming files and folders, ``uv_project`` a project's uv settings.

Pure but for ``realpath`` of the local path it names.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo
from agent.core.roots import FileRoots

_REMOTE = frozenset({"http", "https"})
_VCS = frozenset({"git", "hg", "svn", "bzr"})
_VCS_REMOTE = frozenset({"http", "https", "ssh", "git", "svn"})


def check_place(
    value: str, where: str, roots: FileRoots, *, vcs: bool, path: bool = True
) -> str | None:
    """The local path ``value`` names (a ``file:`` URL, ``vcs+file:`` when ``vcs``, or an
    absolute path when ``path``), checked against the roots; None when it is remote (http(s),
    or a VCS over http(s), ssh, git, svn when ``vcs``). Anything else is refused, naming
    ``where``."""
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError as exc:  # such as an unclosed [ of an IPv6 host
        raise InvalidRuntimeEnv(
            f"{where} {echo(value)} is not a valid URL: {echo(str(exc))}"
        ) from exc
    scheme = parts.scheme.lower()
    base, plus, transport = scheme.partition("+")
    if vcs and plus and base in _VCS:
        if transport in _VCS_REMOTE:
            return None
        if transport != "file":
            raise InvalidRuntimeEnv(
                f"{where} {echo(value)}: a VCS URL must use http(s), ssh, git, svn or file"
            )
        # pip cuts an @revision off the path before it decodes it: so must this check
        local = file_url_path(parts._replace(path=parts.path.rsplit("@", 1)[0]), value, where)
    elif scheme in _REMOTE:
        return None
    elif scheme == "file":
        local = file_url_path(parts, value, where)
    elif path and not scheme and os.path.isabs(value):
        local = value
    else:
        what = "a URL (http, https, file" + (", or git+ and the like)" if vcs else ")")
        nor = " nor an absolute path (a relative one would mean the agent's working directory)"
        raise InvalidRuntimeEnv(f"{where} {echo(value)} is not {what}" + (nor if path else ""))
    if not roots.allow_opened(os.path.realpath(local)):
        raise PermissionDenied(
            f"{where} {echo(value)} is outside the folders pip may read from "
            f"({', '.join(roots.real)}; the allow-file-root setting)"
        )
    return local


def file_url_path(parts: urllib.parse.SplitResult, value: str, where: str) -> str:
    """The path pip makes of a ``file:`` URL: percent-escapes decoded, as ``url_to_path`` does."""
    if parts.netloc not in ("", "localhost"):
        raise InvalidRuntimeEnv(f"{where} {echo(value)}: a file: URL must name no host")
    path = urllib.request.url2pathname(parts.path)
    if not os.path.isabs(path) or "\x00" in path:
        raise InvalidRuntimeEnv(
            f"{where} {echo(value)}: a file: URL must be absolute, and decode to no NUL"
        )
    return path
