"""Host names in package URIs, checked when the URI is parsed (pure).

A host the resolver cannot even encode (an empty label as in ``a..b``, a label over 63 bytes, a
name over 253) used to fail deep in the socket layer's idna codec, as a bug. Here it is a reason
the caller turns into INVALID_ARGUMENT. An IP literal must parse as one; a name is labels of
letters, digits, ``-`` and ``_`` (non-ASCII labels are taken through IDNA first), each 1 to 63
bytes, 253 in all; one trailing dot (a fully qualified name) is allowed.
"""

from __future__ import annotations

import ipaddress
import re

from agent.core.errors import echo

_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")
_MAX_NAME = 253
_DOTS = re.compile("[\u3002\uff0e\uff61]")  # what IDNA also takes for a dot


def host_problem(host: str) -> str | None:
    """Why ``host`` (as ``urlsplit().hostname`` gives it: no brackets) cannot be fetched from,
    or None when it can."""
    if ":" in host:  # only an IPv6 literal holds colons
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{echo(host)} is not a valid IPv6 address"
        return None
    name = host[:-1] if host.endswith(".") else host
    if not name:
        return "the host name is empty"
    shown = echo(host)
    labels = []
    for label in _DOTS.sub(".", name).split("."):
        if not label:
            return f"host {shown} has an empty label (two dots in a row, or a leading dot)"
        try:
            ascii_label = label if label.isascii() else label.encode("idna").decode("ascii")
        except UnicodeError as exc:
            return f"host {shown} has a label IDNA cannot encode: {echo(str(exc))}"
        if len(ascii_label) > 63:
            return f"host {shown} has a label of {len(ascii_label)} bytes; the limit is 63"
        if not _LABEL.fullmatch(ascii_label):
            return (
                f"host {shown} has a label with characters other than letters, digits, '-' and '_'"
            )
        labels.append(ascii_label)
    length = len(".".join(labels))
    if length > _MAX_NAME:
        return f"host name {shown} is {length} bytes long; the limit is {_MAX_NAME}"
    return None
