"""The agent's expected errors, each carrying the gRPC status a client receives.

Two tiers. An ``AgentError`` is an expected outcome of bad input or a bad world (a 404, a
checksum mismatch, a zip bomb): it carries a status code and a message that says what was wrong
and what the limit or the way out is, and the agent keeps serving. Anything else that escapes a
handler is a bug: it is logged with its traceback and answered INTERNAL.

Foreign exceptions (``OSError``, ``zipfile.BadZipFile``, ``aiohttp.ClientError``...) never cross
a module boundary raw: the module that meets them converts them with ``raise ... from exc``.

A message that quotes client input quotes it through ``echo`` (truncated, with its length), or,
for a package's URI used as the prefix of its messages, through ``echo_label`` once; the one
function that turns errors into statuses caps every message with ``cap_message`` before it
sends or logs it (gRPC carries the message in a trailer of at most 16 KiB, percent-encoded).

    AgentError                      (status set by each subclass)
    ├── InvalidArgument             INVALID_ARGUMENT    a request field out of bounds (request_id)
    │   └── InvalidRuntimeEnv                           bad JSON, unknown field, bad URI, too large
    ├── NotFound                    NOT_FOUND
    │   ├── EnvNotFound                                 unknown env, or no references left
    │   └── PackageNotFound                             the package's source answered 404 / no file
    ├── FailedPrecondition          FAILED_PRECONDITION
    │   ├── EnvBusy                                     delete of an env whose creates are in flight
    │   ├── RequestIdReused                             one request_id, two different requests
    │   ├── IntegrityError                              sha256 mismatch
    │   ├── UnsafeArchive                               zip-slip, symlink out, too many entries,
    │   │                                               too large, ratio too high, not a zip
    │   └── PackageRejected                             the source refused (4xx other than 404),
    │                                                   or the download is larger than allowed
    ├── PermissionDenied            PERMISSION_DENIED   a file:// package outside the allowed roots
    ├── DownloadFailed              UNAVAILABLE         transient failures outlasted the retries
    ├── DiskExhausted               RESOURCE_EXHAUSTED  no room to install
    └── SetupTimeout                DEADLINE_EXCEEDED   the env's setup outlasted its timeout
"""

from __future__ import annotations

import grpc

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


class AgentError(Exception):
    """An expected failure with the gRPC status code the client should see."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.env_id = ""  # set where the env is known, for the log line


class InvalidArgument(AgentError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRuntimeEnv(InvalidArgument):
    pass


class NotFound(AgentError):
    code = grpc.StatusCode.NOT_FOUND


class EnvNotFound(NotFound):
    pass


class PackageNotFound(NotFound):
    pass


class FailedPrecondition(AgentError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class EnvBusy(FailedPrecondition):
    pass


class RequestIdReused(FailedPrecondition):
    pass


class IntegrityError(FailedPrecondition):
    pass


class UnsafeArchive(FailedPrecondition):
    pass


class PackageRejected(FailedPrecondition):
    pass


class PermissionDenied(AgentError):
    code = grpc.StatusCode.PERMISSION_DENIED


class DownloadFailed(AgentError):
    code = grpc.StatusCode.UNAVAILABLE


class DiskExhausted(AgentError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class SetupTimeout(AgentError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
