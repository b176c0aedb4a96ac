"""Runtime env parsing: Ray's ``runtime_env`` JSON in, a validated, canonical value out.

One concept: one text in, one validated env out; each field's own parser lives beside its
kind (``uris``, ``pip_spec``, ``uv_spec``, ``uv_run``), and this module is their table of fields.

Pure: no I/O, no asyncio. Every rejection is an ``InvalidRuntimeEnv`` naming the field, what was
wrong, and the limit where one applies.

Identity: the env id is a hash of the canonical JSON (sorted keys, no whitespace, ``config``
removed, empty fields dropped, ``py_modules`` and ``java_jars`` de-duplicated keeping first
occurrence), so key order or an empty ``env_vars`` never makes two envs. ``py_executable`` (the
command the worker runs under) changes the worker, so it is part of identity, as written.

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
strings, accepted). Any other unknown field is refused by name over gRPC; the Ray door ignores
it, as Ray's agent does (which warns that it will raise in the future), at most
``MAX_IGNORED_FIELDS`` of them, each named in the env's identity and in a warning on each create.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.core.errors import InvalidRuntimeEnv, UnsupportedOnNode, echo, type_name
from agent.core.packages import Package, venv_package
from agent.core.pip_spec import PipSpec, parse_pip
from agent.core.roots import FileRoots
from agent.core.uris import SCHEMES, ParsedUri, UriKey, UriKind, is_wheel, parse_uri
from agent.core.uv_run import Passthrough, UvRun, is_uv_run, parse_uv_run
from agent.core.uv_spec import UvSpec, parse_uv
from agent.core.wd_requirements import WdRequirements, of_fields

# Linux's MAX_ARG_STRLEN: one "KEY=value\0" string handed to execve may not exceed it.
MAX_ARG_STRLEN = 128 * 1024
_POINTER_BYTES = 8
_SUPPORTED_FIELDS = (
    "working_dir", "py_modules", "py_executable", "java_jars", "env_vars", "pip", "uv", "config",
)  # fmt: skip
MAX_PY_EXECUTABLE_CHARS = 4096
_JAVA_JAR_SUFFIXES = (".jar", ".zip")
# Ray's driver adds these; each is checked for its type and is not part of identity.
# Ray's keys the agent has nothing to do for: versions, upload filters, and the setup hook (the
# worker runs it, fetching it from the GCS by the key this field holds). Never identity.
_RAY_EXTRAS = (
    "_ray_commit", "_ray_release", "_inject_current_ray", "excludes", "worker_process_setup_hook",
)  # fmt: skip
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


@dataclass(frozen=True)
class EnvLimits:
    """Limits on one runtime env; each is a named setting of the agent."""

    max_json_bytes: int = 1024 * 1024
    max_uris: int = 256
    max_env_var_bytes: int = 1024 * 1024  # all "K=V\0" strings plus pointers; ARG_MAX is ~2 MiB


@dataclass(frozen=True, slots=True)
class RuntimeEnv:
    working_dir: str | None
    py_modules: tuple[str, ...]
    env_vars: Mapping[str, str]
    setup_timeout_seconds: int | None
    eager_install: bool | None
    canonical: str
    env_id: str
    packages: tuple[Package, ...] = ()  # distinct keys: working_dir, py_modules, pip/uv, java_jars
    py_executable: str | None = None  # the command the worker runs under; None: the agent's
    java_jars: tuple[str, ...] = ()  # distinct URIs, in order
    # py_executable as a ``uv run`` line (``agent.core.uv_run``): built by the agent at create
    # (a UvRun), or left to uv and why (a Passthrough); None: not a uv run line
    uv_run: UvRun | Passthrough | None = None
    # fields of Ray's runtime env plugins configured on the node (``agent.plugins``), as
    # canonical JSON text by name: part of the env's identity, run by the plugin host
    plugins: tuple[tuple[str, str], ...] = ()
    # a pip or uv field reading requirements files of the working dir (the Ray door's): its
    # create derives the venv once the working dir is installed (``agent.app.project_venvs``)
    wd_requirements: WdRequirements | None = None
    # unknown fields the Ray door ignores, as Ray's agent does (it warns on each create)
    ignored: tuple[str, ...] = ()
    # a pip or uv set naming files or folders of the node: its create reads their bytes into
    # its venv's key (``agent.app.project_venvs``); it is then none of ``packages``
    local_venv: PipSpec | UvSpec | None = None
    uri_keys: tuple[UriKey, ...] = field(init=False, repr=False, compare=False)  # packages' keys

    def __post_init__(self) -> None:
        object.__setattr__(self, "uri_keys", tuple(p.key for p in self.packages))

    @property
    def derives_venv(self) -> bool:
        """Whether its create makes its venv from its working dir's files, once installed."""
        return (
            self.uv_run is not None
            or self.wd_requirements is not None
            or self.local_venv is not None
        )

    @property
    def pip(self) -> PipSpec | None:
        """The pip set the env names, if it names one."""
        for package in self.packages:
            if isinstance(package.recipe, PipSpec):
                return package.recipe
        return None


def env_var_bytes(env_vars: Mapping[str, str]) -> int:
    """Bytes these variables take in a process's environment block, as execve counts them."""
    return sum(len(k.encode()) + len(v.encode()) + 2 + _POINTER_BYTES for k, v in env_vars.items())


def check_env_var_size(env_vars: Mapping[str, str], limits: EnvLimits) -> None:
    """Refuse variables a worker process could not be started with (execve's E2BIG)."""
    for key, value in env_vars.items():
        size = len(key.encode()) + len(value.encode()) + 2
        if size > MAX_ARG_STRLEN:
            raise InvalidRuntimeEnv(
                f"env_vars[{echo(key)}] is {size} bytes as 'KEY=value'; one variable may not "
                f"exceed {MAX_ARG_STRLEN} bytes (the kernel's MAX_ARG_STRLEN)"
            )
    total = env_var_bytes(env_vars)
    if total > limits.max_env_var_bytes:
        raise InvalidRuntimeEnv(
            f"env_vars take {total} bytes in a process environment; the limit is "
            f"{limits.max_env_var_bytes} bytes (max_env_var_bytes, kept well under ARG_MAX)"
        )


def parse_runtime_env(
    text: str,
    limits: EnvLimits,
    *,
    file_roots: Sequence[str] | FileRoots = (),
    node_site: bool = False,
    node_python: str = "",
    plugin_fields: frozenset[str] = frozenset(),
) -> RuntimeEnv:
    """Parse and validate a serialized runtime env; raise ``InvalidRuntimeEnv`` naming the field.
    Each package is parsed here, once, into its key and its recipe (``Package``). ``node_site``
    (the Ray door's): a pip or uv venv with Ray's semantics (``PipSpec.node_site``), another
    package and another env than the same text's over gRPC; ``node_python``: the node's python
    whose site folders such a venv sees (part of its key). ``plugin_fields``: the fields of
    the node's runtime env plugins, accepted as they are (their plugin validates them) and part
    of the env's identity."""
    size = len(text.encode())
    if size > limits.max_json_bytes:
        raise InvalidRuntimeEnv(
            f"serialized_runtime_env is {size} bytes; the limit is {limits.max_json_bytes}"
        )
    obj = _load_json_object(text)
    plugins = tuple(
        (name, json.dumps(obj[name], sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        for name in sorted(plugin_fields & set(obj))
        if obj[name] is not None
    )
    ignored = _check_fields(
        {k: v for k, v in obj.items() if k not in plugin_fields}, ignore_unknown=node_site
    )
    _check_ray_extras(obj)
    packages: list[Package] = []
    working_dir = None
    if obj.get("working_dir") is not None:
        working_dir = obj["working_dir"]
        wd_uri = parse_uri("working_dir", working_dir)
        packages.append(Package(UriKey(UriKind.WORKING_DIR, working_dir), wd_uri))
    modules = _parse_py_modules(obj.get("py_modules"))
    py_modules = tuple(modules)
    packages.extend(
        Package(UriKey(_module_kind(p, node_site=node_site), u), p) for u, p in modules.items()
    )
    py_executable = _parse_py_executable(obj.get("py_executable"))
    jars = _parse_java_jars(obj.get("java_jars"))
    env_vars = _parse_env_vars(obj.get("env_vars"))
    check_env_var_size(env_vars, limits)
    timeout, eager = _parse_config(obj.get("config"))
    if obj.get("pip") is not None and obj.get("uv") is not None:
        raise InvalidRuntimeEnv(
            "the pip and uv fields cannot both be set (as Ray says): one env has one venv; "
            "list every requirement in one of them"
        )
    wd_requirements = of_fields(
        obj, node_site=node_site, node_python=node_python, file_roots=file_roots
    )
    pip = None if wd_requirements else parse_pip(obj.get("pip"), file_roots=file_roots)
    uv = None if wd_requirements else parse_uv(obj.get("uv"), file_roots=file_roots)
    if node_site:
        if pip is not None:
            pip = dataclasses.replace(pip, node_site=True, node_python=node_python)
        if uv is not None:
            uv = dataclasses.replace(uv, node_site=True, node_python=node_python)
    # a set naming files or folders of the node: its venv is keyed by their bytes, at create
    local_venv = pip if pip is not None and pip.sources else uv if uv and uv.sources else None
    if pip is not None and local_venv is None:
        packages.append(venv_package(pip))
    packages.extend(Package(UriKey(UriKind.JAVA_JARS, u), p) for u, p in jars.items())
    if uv is not None and local_venv is None:
        packages.append(venv_package(uv))
    uv_run = _uv_run(py_executable, working_dir, env_vars)
    reads_files = "reads a requirements file of the working dir" if wd_requirements else ""
    if local_venv is not None:
        reads_files = "names a file or folder of the node"
    if uv_run is not None and reads_files:
        tool = "pip" if obj.get("pip") is not None else "uv"
        raise InvalidRuntimeEnv(
            f"{tool}.packages {reads_files}, and py_executable is a uv run line: uv run makes "
            f"the worker's venv from the project (add it to the project's dependencies); "
            f"leave {tool} out"
        )
    if len(packages) > limits.max_uris:
        raise InvalidRuntimeEnv(
            f"the env names {len(packages)} distinct URIs; the limit is {limits.max_uris}"
        )

    identity: dict[str, Any] = {}
    if working_dir is not None:
        identity["working_dir"] = working_dir
    if py_modules:
        identity["py_modules"] = list(py_modules)
    if env_vars:
        identity["env_vars"] = dict(env_vars)
    if pip is not None:
        identity["pip"] = pip.canonical()
    if py_executable is not None:
        identity["py_executable"] = py_executable
    if jars:
        identity["java_jars"] = list(jars)
    if uv is not None:
        identity["uv"] = uv.canonical()
    if wd_requirements is not None:
        identity[wd_requirements.tool] = wd_requirements.identity()
    if node_site and (pip is not None or uv is not None or wd_requirements is not None):
        identity["venv"] = "node-site"
    if any(p.key.kind is UriKind.RAY_PY_MODULES for p in packages):
        identity["py_modules_top"] = "dropped"  # other packages than the gRPC door's: another env
    if plugins:
        identity["plugins"] = {name: json.loads(value) for name, value in plugins}
    if ignored:
        identity["ignored"] = list(ignored)  # another text than Ray counts: another env
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return RuntimeEnv(
        working_dir=working_dir,
        py_modules=py_modules,
        env_vars=env_vars,
        setup_timeout_seconds=timeout,
        eager_install=eager,
        canonical=canonical,
        env_id=env_id_of(canonical),
        packages=tuple(packages),
        py_executable=py_executable,
        java_jars=tuple(jars),
        uv_run=uv_run,
        plugins=plugins,
        wd_requirements=wd_requirements,
        ignored=ignored,
        local_venv=local_venv,
    )


def _uv_run(
    py_executable: str | None, working_dir: str | None, env_vars: Mapping[str, str]
) -> UvRun | Passthrough | None:
    """The env's ``uv run`` line, parsed (``parse_uv_run``); None when it is not one. A line
    naming no ``--python`` (Ray 2.51's hook's) takes the env's ``UV_PYTHON``, which ``uv run``
    in the worker would read (Ray 2.60's hook puts it in the line)."""
    if py_executable is None or not is_uv_run(py_executable):
        return None
    if working_dir is None:
        return Passthrough("the env has no working_dir, where uv run would find the project")
    run = parse_uv_run(py_executable)
    if isinstance(run, UvRun) and run.python is None and env_vars.get("UV_PYTHON", "").strip():
        return replace(run, python=env_vars["UV_PYTHON"].strip())
    return run


def env_id_of(canonical: str) -> str:
    """The env id: 32 hex digits of the SHA-256 of the canonical JSON."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _load_json_object(text: str) -> dict[str, Any]:
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


def _check_fields(obj: Mapping[str, Any], *, ignore_unknown: bool) -> tuple[str, ...]:
    """Unknown fields are refused as invalid (naming them), or, ``ignore_unknown`` (the Ray
    door: Ray's agent warns and ignores them), returned (at most ``MAX_IGNORED_FIELDS``, each
    at most ``MAX_IGNORED_NAME_CHARS``); Ray's fields that need what this agent does not manage
    on the node are refused as unsupported there (saying what they need)."""
    unknown = sorted(set(obj) - set(_SUPPORTED_FIELDS) - set(_RAY_EXTRAS) - set(NEEDS_ON_NODE))
    too_many = len(unknown) > MAX_IGNORED_FIELDS
    too_long = any(len(name) > MAX_IGNORED_NAME_CHARS for name in unknown)
    if ignore_unknown and not too_many and not too_long:
        _check_needs_on_node(obj)
        return tuple(unknown)
    if unknown:
        hints = [f"Ray spells {n!r} as {_RAY_SPELLS[n]!r}" for n in unknown if n in _RAY_SPELLS]
        hint = f" ({'; '.join(hints)})" if hints else ""
        raise InvalidRuntimeEnv(
            f"unknown runtime_env field(s) {_listed(unknown)}{hint}; "
            f"supported: {', '.join(_SUPPORTED_FIELDS)} (and Ray's {', '.join(_RAY_EXTRAS)})"
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


def _parse_py_executable(value: object) -> str | None:
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


def _parse_java_jars(value: object) -> dict[str, ParsedUri]:
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


def _parse_py_modules(value: object) -> dict[str, ParsedUri]:
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


def _module_kind(uri: ParsedUri, *, node_site: bool) -> UriKind:
    """A py_modules entry is a zip, unpacked, or a wheel, pip-installed (as Ray does). Read as
    Ray reads it (``node_site``, the Ray door), a zip that loses its single top folder as a
    working dir does (not a gcs:// upload) is another package than the gRPC door's, which keeps
    it."""
    if is_wheel(uri):
        return UriKind.PY_MODULES_WHEEL
    if node_site and not SCHEMES[uri.scheme].keeps_top_level:
        return UriKind.RAY_PY_MODULES
    return UriKind.PY_MODULES


def _parse_env_vars(value: object) -> dict[str, str]:
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


def _parse_config(value: object) -> tuple[int | None, bool | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise InvalidRuntimeEnv(f"config must be an object, got {type_name(value)}")
    unknown = sorted(set(value) - {"setup_timeout_seconds", "eager_install", "log_files"})
    if unknown:
        raise InvalidRuntimeEnv(
            f"unknown config field(s) {_listed(unknown)}; "
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


def _check_ray_extras(obj: Mapping[str, Any]) -> None:
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


def _listed(names: list[str], most: int = 8) -> str:
    """Names for a message: the first few, quoted with ``echo``, and how many more."""
    shown = ", ".join(echo(name) for name in names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
