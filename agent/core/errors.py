"""The agent's expected errors, each with a protocol-neutral kind.

Two tiers. An ``AgentError`` is an expected outcome of bad input or a bad world (a 404, a
checksum mismatch, a zip bomb): it carries a kind (``ErrorKind``: what sort of failure, in
words any door can map) and a message that says what was wrong and what the limit or the way
out is, and the agent keeps serving. Anything else that escapes a handler is a bug: it is
logged with its traceback and answered as an internal error. A door turns a kind into its own
answer through one table (``agent/doors/grpc_errors.py`` for gRPC, ``agent/doors/http_errors.py``
for HTTP, ``agent/doors/ray_errors.py`` for Ray's protocol); nothing below the doors knows a
status code.

A ``CancelledError`` is no error: the caller went away, and it passes through. One that
reaches a door while nobody cancelled the handler's task (``stray_cancellation``) is a bug
below (an awaited future cancelled by someone else): it is answered as a bug, never passed on,
since a cancelled handler sends no answer and its client would wait until its deadline.

Foreign exceptions (``OSError``, ``zipfile.BadZipFile``, ``aiohttp.ClientError``...) never cross
a module boundary raw: the module that meets them converts them with ``raise ... from exc``.

A message that quotes client input quotes it through ``echo`` (truncated, with its length), or,
for a package's URI used as the prefix of its messages, through ``echo_label`` once; the one
function that turns errors into statuses caps every message with ``cap_message`` before it
sends or logs it (gRPC carries the message in a trailer of at most 16 KiB, percent-encoded).

Every expected error is defined here, and named in this tree (a test keeps them in step). The
kind is set by each branch under ``AgentError`` and inherited by its leaves.

    AgentError                      (kind set by each branch)
    ├── InvalidArgument             INVALID          a request field out of bounds (request_id)
    │   └── InvalidRuntimeEnv                        bad JSON, unknown field, bad URI, too large
    ├── NotFound                    NOT_FOUND
    │   ├── EnvNotFound                              unknown env, or no references left
    │   └── PackageNotFound                          the package's source answered 404 / no file
    ├── FailedPrecondition          REFUSED          the request is well formed; what it names
    │   │                                            cannot be used
    │   ├── IntegrityError                           sha256 mismatch
    │   ├── UnsafeArchive                            zip-slip, symlink out, too many entries,
    │   │                                            too large, ratio too high, not a zip
    │   ├── PackageRejected                          the source refused (4xx other than 404),
    │   │                                            or the download is larger than allowed
    │   ├── ObjectStoreSetup                         an object store cannot be reached as the
    │   │                                            agent is set up: obstore not installed,
    │   │                                            an AWS file or profile, no Azure account
    │   ├── InstallerFailed                          pip / uv failed to install a pip or uv spec
    │   └── UnsupportedOnNode                        a field (conda, image_uri, _nsight...)
    │                                                needs what this node's agent does not have
    ├── Conflict                    CONFLICT         the request clashes with another one
    │   ├── EnvBusy                                  delete of an env whose creates are in flight
    │   └── RequestIdReused                          one request_id, two different requests
    ├── PermissionDenied            DENIED           a file:// package outside the allowed roots,
    │                                                or a store that refused the credentials
    ├── Unauthenticated             UNAUTHENTICATED  the call's token is missing or wrong
    ├── Unavailable                 UNAVAILABLE      try again later
    │   ├── DownloadFailed                           transient failures outlasted the retries
    │   ├── IndexUnavailable                         the root's shared index stayed locked by
    │   │                                            another agent, or failed (disk, I/O)
    │   └── PluginFailed                             a Ray runtime env plugin's hook raised
    ├── DiskExhausted               EXHAUSTED        no room to install
    │   └── RayStringsFull                           the Ray door counts as many bytes of
    │                                                serialized strings as it may hold
    ├── SetupTimeout                TIMEOUT          the env's setup outlasted its timeout
    └── Misconfigured               MISCONFIGURED    the agent cannot start as configured (met at
        │                                            start, before any client is served)
        ├── ConfigError                              a setting's value is not valid
        ├── StartupError                             address, socket folder, root, lock, parent
        ├── StateDBError                             state.db unreadable, or of a newer schema
        └── TokenError                               the token file is unreadable or empty
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

ECHO_CHARS = 120  # of one quoted input
LABEL_CHARS = 256  # of a package's label (its kind and URI), the prefix of its messages
MAX_MESSAGE_BYTES = 2048  # UTF-8 bytes of a status message; percent-encoded, at most 3x that


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters with the input's length said:
    a client's 200 KB name is quoted as its first characters and "(200000 characters)"."""
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    if not isinstance(value, str | bytes | int | float | bool | None):
        value = type(value).__name__  # containers are named, not dumped
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return "a very large number"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def echo_label(text: str, limit: int = LABEL_CHARS) -> str:
    """A client's name for something that prefixes many messages and log lines (a package's
    ``kind:URI``), computed once where the name is made: as is when it is short and printable
    (a parsed URI holds no whitespace nor control character), else as ``echo`` quotes it."""
    if len(text) <= limit and text.isprintable():
        return text
    return echo(text, limit)


def type_name(value: object) -> str:
    """A JSON value's type as a message names it: "an object", "a list", "null"..."""
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def cap_message(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """The message cut to at most ``limit`` UTF-8 bytes, saying it was cut: the last guard,
    applied where a status is sent and logged."""
    data = message.encode("utf-8", "backslashreplace")  # a lone surrogate cannot be sent
    if len(data) <= limit:
        return data.decode()
    tail = f"... (message cut; {len(data)} bytes in all)"
    return data[: limit - len(tail)].decode("utf-8", "ignore") + tail


class ErrorKind(Enum):
    """What sort of failure an expected error is, in words every door can map to its own
    answer (a gRPC status, an HTTP status). The value is the name logs and metrics use."""

    INVALID = "invalid"  # the request itself is malformed or out of bounds
    NOT_FOUND = "not_found"  # what it names does not exist
    REFUSED = "refused"  # well formed, but what it names cannot be used (a bad package)
    CONFLICT = "conflict"  # it clashes with another request (in flight, or under its id)
    DENIED = "denied"  # the caller may not have what it asks for
    UNAUTHENTICATED = "unauthenticated"  # the caller did not prove who it is
    UNAVAILABLE = "unavailable"  # a source failed for a while; the same request may succeed
    EXHAUSTED = "exhausted"  # a resource of the node (disk) is used up
    TIMEOUT = "timeout"  # the work outlasted its time limit
    MISCONFIGURED = "misconfigured"  # the agent's own settings or files; the operator's to fix


class AgentError(Exception):
    """An expected failure: its kind (set by each branch of the tree) and a message saying what
    was wrong and the limit or the way out."""

    kind: ClassVar[ErrorKind]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "kind", None), ErrorKind):
            raise TypeError(f"{cls.__name__} has no ErrorKind: set kind on its branch")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(AgentError):
    kind = ErrorKind.INVALID


class InvalidRuntimeEnv(InvalidArgument):
    pass


class NotFound(AgentError):
    kind = ErrorKind.NOT_FOUND


class EnvNotFound(NotFound):
    pass


class PackageNotFound(NotFound):
    pass


class FailedPrecondition(AgentError):
    kind = ErrorKind.REFUSED


class IntegrityError(FailedPrecondition):
    pass


class UnsafeArchive(FailedPrecondition):
    pass


class PackageRejected(FailedPrecondition):
    pass


class ObjectStoreSetup(FailedPrecondition):
    """An s3://, gs://, azure:// or abfss:// package cannot be fetched as the agent is set up
    (its optional obstore, its credentials files or variables); the message says the way out."""


class InstallerFailed(FailedPrecondition):
    pass


class UnsupportedOnNode(FailedPrecondition):
    """A well-formed runtime env field that needs something this agent does not manage on the
    node (a conda installation, a container runtime, a profiler); the message says what."""


class Conflict(AgentError):
    kind = ErrorKind.CONFLICT


class EnvBusy(Conflict):
    pass


class RequestIdReused(Conflict):
    pass


class PermissionDenied(AgentError):
    kind = ErrorKind.DENIED


class Unauthenticated(AgentError):
    kind = ErrorKind.UNAUTHENTICATED


class Unavailable(AgentError):
    kind = ErrorKind.UNAVAILABLE


class DownloadFailed(Unavailable):
    pass


class IndexUnavailable(Unavailable):
    pass


class PluginFailed(Unavailable):
    """A Ray runtime env plugin's hook raised (its traceback in the message, as Ray's agent
    reports it)."""


class DiskExhausted(AgentError):
    kind = ErrorKind.EXHAUSTED


class RayStringsFull(DiskExhausted):
    """The Ray door holds its limit of serialized strings' bytes (``RayFront``): memory of the
    node used up, of a full disk's kind (EXHAUSTED)."""


class SetupTimeout(AgentError):
    kind = ErrorKind.TIMEOUT


class Misconfigured(AgentError):
    kind = ErrorKind.MISCONFIGURED


class ConfigError(Misconfigured):
    """A setting's value is not valid; the message names the setting and where it came from."""


class StartupError(Misconfigured):
    """The agent cannot start as configured (address, root, lock)."""


class StateDBError(Misconfigured):
    """The state database cannot be used as it is; the message says the way out."""


class TokenError(Misconfigured):
    """The token file cannot be read, or holds no token."""


def stray_cancellation() -> bool:
    """Whether a ``CancelledError`` met now is stray: the current task was not asked to cancel
    (``Task.cancelling``), so a future it awaited was cancelled by someone else (a bug)."""
    import asyncio  # here: the unpack workers import this module and never run a loop

    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0
