"""Log fields bound to the work in progress: set once where a fact becomes known (the RPC and
its request id where a door receives the call, the env id once the service has parsed it), and
added to every log line that work writes, whichever module writes it.

A context variable holds them, so they follow the request through its awaits and into the
threads and tasks it starts (each takes a copy of the fields as they were then: an install a
create started keeps that create's fields). The JSON log format writes them as keys of their
own (``agent/ops/logs.py``); a record's own ``extra`` fields win over bound ones of the same
name.

``bind`` opens a scope; ``note`` adds to the innermost scope, and its fields go when that scope
ends. An exception is never decorated with them: its log line reads the scope it is logged in.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType

CUT_CHARS = 128  # of a client's id on a log line (see ``cut``)
_EMPTY: Mapping[str, object] = MappingProxyType({})
# Each value is a new mapping, never changed in place once set: a task or thread that copied the
# context keeps its copy. (Plain dicts, not read-only views: this runs on every RPC.)
_FIELDS: ContextVar[Mapping[str, object]] = ContextVar("agent_log_fields", default=_EMPTY)


class bind:
    """Add ``fields`` to every log line written until the block ends (and drop what ``note``
    added inside it). A class, not a generator: it runs on every RPC."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: object) -> None:
        self._fields = fields  # ours: never changed once bound

    def __enter__(self) -> None:
        outer = _FIELDS.get()
        self._token = _FIELDS.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(self, *exc: object) -> None:
        _FIELDS.reset(self._token)


def note(**fields: object) -> None:
    """Add ``fields`` to the innermost ``bind`` scope, from here to its end (an exception
    propagating out of the caller still finds them where the scope logs it)."""
    _FIELDS.set({**_FIELDS.get(), **fields})


def bound() -> Mapping[str, object]:
    """The fields bound here and now (read-only)."""
    return MappingProxyType(dict(_FIELDS.get()))


def cut(text: str, limit: int = CUT_CHARS) -> str:
    """A client's id as a log line carries it: itself, or its first ``limit`` characters and its
    length (whatever a client sent, the line stays short)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"
