"""Each field's parser of a runtime env, and the policies a door's dialect picks among.

Pure: no I/O, no asyncio. Every rejection is an ``InvalidRuntimeEnv`` naming the field, what was
wrong, and the limit where one applies; ``agent.core.runtime_env`` holds the table that maps each
field to its parser.

``py_executable`` is Ray's: a command line, not only a path (``python -X faulthandler``, a
wrapper script and its arguments); Ray's worker runs ``exec <py_executable> <worker args>``
under ``bash -c``. Checked here: a string of at most ``MAX_PY_EXECUTABLE_CHARS``, one line (no
control character but a tab), and shell words ``shlex`` can split (no unclosed quote), at least
one.

A ``py_modules`` entry that names a ``.whl`` is a wheel, pip-installed into its folder as Ray
installs it (kind ``py_modules_wheel``); any other is a zip.

``java_jars`` is Ray's too: URIs of ``.jar`` files (kept whole, in a folder of their own) or
``.zip`` archives (unpacked, as Ray does), installed and counted as ``py_modules`` are.

Fields of Ray's this agent cannot serve on any node it runs on (``conda``, ``image_uri``,
``container``, ``_nsight``, ``_rocprof_sys``: ``NEEDS_ON_NODE``) are refused by name with
``UnsupportedOnNode`` (FAILED_PRECONDITION), saying what the node would need.

Ray's own spellings parse, as its driver serialises them: the extension keys ``_ray_commit``,
``_ray_release`` (strings), ``_inject_current_ray`` (a boolean) and ``excludes`` (a list of
strings: what the driver left out of its uploads, already applied to the package) are checked for
their type and are not part of identity; nor is ``config`` (with Ray's ``log_files``, a list of
strings, accepted). Any other unknown field is refused by name, or ignored where the dialect
says so (``UnknownFields.IGNORE``: Ray's agent warns that it will raise in the future), at most
``MAX_IGNORED_FIELDS`` of them, each named in the env's identity and in a warning on each create.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.core.dialect import Dialect, UnknownFields
from agent.core.errors import InvalidRuntimeEnv, UnsupportedOnNode, echo, type_name
from agent.core.uris import SCHEMES, ParsedUri, UriKind, is_wheel, parse_uri

MAX_PY_EXECUTABLE_CHARS = 4096
_JAVA_JAR_SUFFIXES = (".jar", ".zip")
# Ray's driver adds these; each is checked for its type and is not part of identity.
# Ray's keys the agent has nothing to do for: versions, upload filters, and the setup hook (the
# worker runs it, fetching it from the GCS by the key this field holds). Never identity.
RAY_EXTRAS = (
    "_ray_commit",
    "_ray_release",
    "_inject_current_ray",
    "excludes",
    "worker_process_setup_hook",
)
# Ray 2.60's fields this agent refuses by name (FAILED_PRECONDITION): what each needs on the node.
NEEDS_ON_NODE: dict[str, str] = {
    "conda": "a conda installation on the node, which this agent does not manage (it makes pip "
    "venvs: list the packages under 'pip' instead)",
    "image_uri": "a container runtime (podman) on the node and Ray's image support (the worker "
    "started inside the image), which this agent does not provide",
    "container": "a container runtime (podman) on the node and Ray's container support (the "
    "worker started inside the container), which this agent does not provide",
    "_nsight": "NVIDIA Nsight Systems (nsys) on the node to run the worker under, which this "
    "agent does not do",
    "_rocprof_sys": "ROCm's rocprof-sys on the node to run the worker under, which this agent "
    "does not do",
}
MAX_IGNORED_FIELDS = 16  # unknown fields the Ray door ignores in one env; more are refused
MAX_IGNORED_NAME_CHARS = 100  # each one's name; a longer one is refused
# Spellings of Ray's fields without their underscore: the unknown-field message names Ray's.
_RAY_SPELLS = {"nsight": "_nsight", "rocprof_sys": "_rocprof_sys"}


def load_json_object(text: str) -> dict[str, Any]:
    def no_duplicates(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InvalidRuntimeEnv(f"key {echo(key)} appears twice in the runtime env JSON")
            out[key] = value
        return out

    if not text.strip():
        raise InvalidRuntimeEnv("serialized_runtime_env is empty; send a JSON object ({} for none)")
    try:
        obj = json.loads(text, object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as exc:
        raise InvalidRuntimeEnv(f"serialized_runtime_env is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise InvalidRuntimeEnv(
            f"serialized_runtime_env must be a JSON object, got {type_name(obj)}"
        )
    try:  # "\ud800" is valid JSON but no valid text: refuse it here, not deep inside
        json.dumps(obj, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise InvalidRuntimeEnv(
            f"serialized_runtime_env holds an unpaired UTF-16 surrogate escape: {exc.reason}"
        ) from exc
    return obj


def unknown_fields(
    obj: Mapping[str, Any], supported: Sequence[str], policy: UnknownFields
) -> tuple[str, ...]:
    """Fields of ``obj`` not ``supported`` are refused as invalid (naming them), or, under
    ``UnknownFields.IGNORE`` (Ray's agent warns and ignores them), returned (at most
    ``MAX_IGNORED_FIELDS``, each at most ``MAX_IGNORED_NAME_CHARS``); Ray's fields that need
    what this agent does not manage on the node are refused as unsupported there (saying what
    they need)."""
    ignore_unknown = policy is UnknownFields.IGNORE
    unknown = sorted(set(obj) - set(supported) - set(RAY_EXTRAS) - set(NEEDS_ON_NODE))
    too_many = len(unknown) > MAX_IGNORED_FIELDS
    too_long = any(len(name) > MAX_IGNORED_NAME_CHARS for name in unknown)
    if ignore_unknown and not too_many and not too_long:
        _check_needs_on_node(obj)
        return tuple(unknown)
    if unknown:
        hints = [f"Ray spells {n!r} as {_RAY_SPELLS[n]!r}" for n in unknown if n in _RAY_SPELLS]
        hint = f" ({'; '.join(hints)})" if hints else ""
        raise InvalidRuntimeEnv(
            f"unknown runtime_env field(s) {listed(unknown)}{hint}; "
            f"supported: {', '.join(supported)} (and Ray's {', '.join(RAY_EXTRAS)})"
            + (
                f"; through the Ray door, unknown fields are ignored up to {MAX_IGNORED_FIELDS} "
                f"of at most {MAX_IGNORED_NAME_CHARS} characters each"
                if ignore_unknown
                else ""
            )
        )
    _check_needs_on_node(obj)
    return ()


def _check_needs_on_node(obj: Mapping[str, Any]) -> None:
    refused = [name for name in NEEDS_ON_NODE if name in obj]
    if refused:
        raise UnsupportedOnNode(
            "; ".join(
                f"runtime_env field {name!r} cannot be used on this node: it needs "
                f"{NEEDS_ON_NODE[name]}"
                for name in refused
            )
        )


def parse_py_executable(value: object) -> str | None:
    """Ray's command a worker runs under (empty or null: the agent's python)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRuntimeEnv(
            "py_executable must be a string: the command the worker runs under (a python, or "
            "a program and its arguments, such as 'python -X faulthandler'), got "
            f"{type_name(value)}"
        )
    if len(value) > MAX_PY_EXECUTABLE_CHARS:
        raise InvalidRuntimeEnv(
            f"py_executable is {len(value)} characters long; the limit is {MAX_PY_EXECUTABLE_CHARS}"
        )
    if any((ord(ch) < 0x20 and ch != "\t") or ch == "\x7f" for ch in value):
        raise InvalidRuntimeEnv(
            f"py_executable {echo(value)} contains a control character (a newline, a NUL): it "
            "is one command line"
        )
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise InvalidRuntimeEnv(
            f"py_executable {echo(value)} is not a command in shell words: {exc}"
        ) from exc
    if not words:
        raise InvalidRuntimeEnv("py_executable holds only whitespace; give a command or omit it")
    return value


def parse_java_jars(value: object) -> dict[str, ParsedUri]:
    """Each distinct jar or zip URI, parsed, in the order of its first occurrence."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InvalidRuntimeEnv(
            f"java_jars must be a list of URIs of .jar or .zip files, got {type_name(value)}"
        )
    seen: dict[str, ParsedUri] = {}
    for index, uri in enumerate(value):
        name = f"java_jars[{index}]"
        parsed = parse_uri(name, uri)
        if not parsed.path.lower().endswith(_JAVA_JAR_SUFFIXES):
            raise InvalidRuntimeEnv(
                f"{name} {echo(uri)}: a java_jars URI names a .jar (kept as it is) or a .zip "
                "(unpacked)"
            )
        seen.setdefault(uri, parsed)
    return seen


def parse_py_modules(value: object) -> dict[str, ParsedUri]:
    """Each distinct URI, parsed, in the order of its first occurrence."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InvalidRuntimeEnv(f"py_modules must be a list of URIs, got {type_name(value)}")
    seen: dict[str, ParsedUri] = {}
    for index, uri in enumerate(value):
        parsed = parse_uri(f"py_modules[{index}]", uri, wheel_ok=True)
        seen.setdefault(uri, parsed)
    return seen


def module_kind(uri: ParsedUri, dialect: Dialect) -> UriKind:
    """A py_modules entry is a zip, unpacked, or a wheel, pip-installed (as Ray does). A zip
    from a scheme whose zips do not keep their single top folder (not a gcs:// upload) is of
    the dialect's ``py_modules_zip`` kind: Ray's agent drops that folder, the gRPC door keeps
    it, so they are other packages."""
    if is_wheel(uri):
        return UriKind.PY_MODULES_WHEEL
    if SCHEMES[uri.scheme].keeps_top_level:
        return UriKind.PY_MODULES
    return dialect.py_modules_zip


def parse_env_vars(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRuntimeEnv(
            f"env_vars must be an object of string to string, got {type_name(value)}"
        )
    for key, val in value.items():
        if not key or "=" in key or "\x00" in key:
            raise InvalidRuntimeEnv(
                f"env_vars: {echo(key)} is not a valid variable name "
                "(empty, or contains '=' or NUL)"
            )
        if not isinstance(val, str):
            raise InvalidRuntimeEnv(f"env_vars[{echo(key)}] must be a string, got {type_name(val)}")
        if "\x00" in val:
            raise InvalidRuntimeEnv(f"env_vars[{echo(key)}] contains a NUL byte")
    return dict(sorted(value.items()))


def parse_config(value: object) -> tuple[int | None, bool | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise InvalidRuntimeEnv(f"config must be an object, got {type_name(value)}")
    unknown = sorted(set(value) - {"setup_timeout_seconds", "eager_install", "log_files"})
    if unknown:
        raise InvalidRuntimeEnv(
            f"unknown config field(s) {listed(unknown)}; "
            "supported: setup_timeout_seconds, eager_install, log_files"
        )
    log_files = value.get("log_files")
    if log_files is not None and not _strings(log_files):
        raise InvalidRuntimeEnv(
            f"config.log_files must be a list of strings, got {type_name(log_files)}"
        )
    timeout = value.get("setup_timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int) or timeout == 0 or timeout < -1
    ):
        raise InvalidRuntimeEnv(
            f"config.setup_timeout_seconds must be a positive integer (or -1 for the agent's "
            f"maximum), got {echo(timeout)}"
        )
    eager = value.get("eager_install")
    if eager is not None and not isinstance(eager, bool):
        raise InvalidRuntimeEnv(f"config.eager_install must be a boolean, got {type_name(eager)}")
    return timeout, eager


def check_ray_extras(obj: Mapping[str, Any]) -> None:
    """Ray's extension keys: accepted when of Ray's type; none is part of the env's identity."""
    for name in ("_ray_commit", "_ray_release", "worker_process_setup_hook"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidRuntimeEnv(f"{name} must be a string, got {type_name(value)}")
    inject = obj.get("_inject_current_ray")
    if inject is not None and not isinstance(inject, bool):
        raise InvalidRuntimeEnv(f"_inject_current_ray must be a boolean, got {type_name(inject)}")
    excludes = obj.get("excludes")
    if excludes is not None and not _strings(excludes):
        raise InvalidRuntimeEnv(
            f"excludes must be a list of strings (paths left out of uploads), got "
            f"{type_name(excludes)}"
        )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def listed(names: list[str], most: int = 8) -> str:
    """Names for a message: the first few, quoted with ``echo``, and how many more."""
    shown = ", ".join(echo(name) for name in names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
