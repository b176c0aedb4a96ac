"""Runtime envs: Ray's ``runtime_env`` JSON in, a validated, canonical value out.

Pure: no I/O, no asyncio. ``parse_runtime_env`` reads the text as a door's ``Dialect`` says
(``agent.core.dialect``) through ``FIELDS``, the table from each field to its parser
(``agent.core.env_fields``, ``uris``, ``pip_spec``, ``uv_spec``, ``wd_requirements``), then
applies the rules between fields and makes the env's identity. Every rejection is an
``InvalidRuntimeEnv`` naming the field, what was wrong, and the limit where one applies.

Identity: the env id is a hash of the canonical JSON (sorted keys, no whitespace, ``config``
removed, empty fields dropped, ``py_modules`` and ``java_jars`` de-duplicated keeping first
occurrence), so key order or an empty ``env_vars`` never makes two envs. ``py_executable`` (the
command the worker runs under) changes the worker, so it is part of identity, as written. What a
dialect reads otherwise than the gRPC door (a venv that sees the node's packages, a py_modules
zip whose top folder is dropped, ignored fields) is marked in the identity: another env.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.core.dialect import GRPC, Dialect, PluginFields
from agent.core.env_fields import (
    check_ray_extras,
    load_json_object,
    module_kind,
    parse_config,
    parse_env_vars,
    parse_java_jars,
    parse_py_executable,
    parse_py_modules,
    unknown_fields,
)
from agent.core.errors import InvalidRuntimeEnv, echo
from agent.core.kinds import Build, NodeSite, row_of, sees_node
from agent.core.packages import Package, tool_package, venv_package
from agent.core.pip_spec import PipSpec, parse_pip
from agent.core.roots import FileRoots
from agent.core.uris import ParsedUri, UriKey, UriKind, parse_uri
from agent.core.uv_run import Passthrough, UvRun, is_uv_run, parse_uv_run
from agent.core.uv_spec import UvSpec, parse_uv
from agent.core.wd_requirements import WdRequirements, wd_requirements_of

# Linux's MAX_ARG_STRLEN: one "KEY=value\0" string handed to execve may not exceed it.
MAX_ARG_STRLEN = 128 * 1024
_POINTER_BYTES = 8


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
    # fields of Ray's runtime env plugins configured on the node (``agent.core.plugin_config``), as
    # canonical JSON text by name: part of the env's identity, run by the plugin host
    plugins: tuple[tuple[str, str], ...] = ()
    # a pip or uv field reading requirements files of the working dir (``Dialect``'s
    # ``wd_requirements``): its create derives the venv once the working dir is installed
    # (``agent.app.project_venvs``)
    wd_requirements: WdRequirements | None = None
    # unknown fields the dialect ignored (``UnknownFields.IGNORE``: Ray's agent warns on each
    # create)
    ignored: tuple[str, ...] = ()
    # a pip or uv set naming files or folders of the node: its create reads their bytes into
    # its venv's key (``agent.app.project_venvs``); it is then none of ``packages``
    local_venv: PipSpec | UvSpec | None = None
    dialect: Dialect = GRPC  # how its door read it (``agent.core.dialect``)
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


@dataclass
class _Draft:
    """What the fields read so far make of one env (``parse_runtime_env``'s working state)."""

    obj: Mapping[str, Any]  # the JSON object
    dialect: Dialect
    limits: EnvLimits
    file_roots: Sequence[str] | FileRoots
    node_python: str
    agent_uv: str = ""  # the version of the agent's uv: whether a uv_version needs another
    working_dir: str | None = None
    wd_uri: ParsedUri | None = None
    py_modules: dict[str, ParsedUri] = field(default_factory=dict)
    py_executable: str | None = None
    java_jars: dict[str, ParsedUri] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    config: tuple[int | None, bool | None] = (None, None)
    venv: tuple[UriKind, PipSpec | UvSpec] | None = None  # the pip or uv set and its kind
    wd_requirements: WdRequirements | None = None


def _working_dir(draft: _Draft, value: object) -> None:
    draft.wd_uri = parse_uri("working_dir", value)
    assert isinstance(value, str)  # parse_uri takes only a string
    draft.working_dir = value


def _py_modules(draft: _Draft, value: object) -> None:
    draft.py_modules = parse_py_modules(value)


def _py_executable(draft: _Draft, value: object) -> None:
    draft.py_executable = parse_py_executable(value)


def _java_jars(draft: _Draft, value: object) -> None:
    draft.java_jars = parse_java_jars(value)


def _env_vars(draft: _Draft, value: object) -> None:
    draft.env_vars = parse_env_vars(value)
    check_env_var_size(draft.env_vars, draft.limits)


def _config(draft: _Draft, value: object) -> None:
    draft.config = parse_config(value)


def _venv_field(tool: str) -> Callable[[_Draft, object], None]:
    """The parser of the ``pip`` or ``uv`` field: a set whose venv is of the dialect's kind (one
    that sees the node's packages gets the node's python in its key), or requirements files of
    the working dir, read at create."""
    parse = parse_pip if tool == "pip" else parse_uv

    def parse_field(draft: _Draft, value: object) -> None:
        if tool == "pip" and draft.obj.get("uv") is not None:
            raise InvalidRuntimeEnv(
                "the pip and uv fields cannot both be set (as Ray says): one env has one venv; "
                "list every requirement in one of them"
            )
        kind = draft.dialect.venv_kind(tool)
        sees = NodeSite(draft.node_python) if sees_node(kind) else None
        draft.wd_requirements = wd_requirements_of(
            tool, value, draft.obj, draft.dialect, kind, sees, draft.file_roots
        )
        if draft.wd_requirements is not None:
            return
        spec = parse(value, file_roots=draft.file_roots)
        if spec is not None:
            draft.venv = (kind, spec if sees is None else replace(spec, sees=sees))

    return parse_field


# Each field an env may name and its parser, in the order they are read (which error an env
# with several says first). The Ray extension keys (``env_fields.RAY_EXTRAS``), the node's
# plugin fields and the unknown ones are the dialect's to take or refuse.
FIELDS: dict[str, Callable[[_Draft, object], None]] = {
    "working_dir": _working_dir,
    "py_modules": _py_modules,
    "py_executable": _py_executable,
    "java_jars": _java_jars,
    "env_vars": _env_vars,
    "config": _config,
    "pip": _venv_field("pip"),
    "uv": _venv_field("uv"),
}


def parse_runtime_env(
    text: str,
    limits: EnvLimits,
    *,
    dialect: Dialect = GRPC,
    file_roots: Sequence[str] | FileRoots = (),
    node_python: str = "",
    plugin_fields: frozenset[str] = frozenset(),
    agent_uv: str = "",
) -> RuntimeEnv:
    """Parse and validate a serialized runtime env as ``dialect`` reads it; raise
    ``InvalidRuntimeEnv`` naming the field. Each package is parsed here, once, into its key and
    its recipe (``Package``). ``node_python``: the node's python whose site folders a venv that
    sees the node's packages adds (part of its key). ``plugin_fields``: the fields of the
    node's runtime env plugins, taken as they are (their plugin validates them) and part of the
    env's identity, where the dialect runs them. ``agent_uv``: the version of the agent's uv; a
    ``uv_version`` it does not satisfy (or any, when "") names the uv that does as a package of
    the env (``agent.core.uv_tool``)."""
    size = len(text.encode())
    if size > limits.max_json_bytes:
        raise InvalidRuntimeEnv(
            f"serialized_runtime_env is {size} bytes; the limit is {limits.max_json_bytes}"
        )
    obj = load_json_object(text)
    plugins = tuple(
        (name, json.dumps(obj[name], sort_keys=True, separators=(",", ":"), ensure_ascii=False))
        for name in sorted(plugin_fields & set(obj))
        if obj[name] is not None
    )
    ignored = unknown_fields(
        {k: v for k, v in obj.items() if k not in plugin_fields},
        tuple(FIELDS),
        dialect.unknown_fields,
    )
    check_ray_extras(obj)
    draft = _Draft(obj, dialect, limits, file_roots, node_python, agent_uv)
    for name, parse_field in FIELDS.items():
        value = obj.get(name)
        if value is not None:
            parse_field(draft, value)
    packages = _packages(draft)
    uv_run = _uv_run(draft.py_executable, draft.working_dir, draft.env_vars)
    local_venv = _local_venv(draft)
    _check_between_fields(draft, uv_run, local_venv)
    if len(packages) > limits.max_uris:
        raise InvalidRuntimeEnv(
            f"the env names {len(packages)} distinct URIs; the limit is {limits.max_uris}"
        )
    if plugins and dialect.plugin_fields is PluginFields.REFUSE:
        names = ", ".join(name for name, _ in plugins)
        raise InvalidRuntimeEnv(
            f"runtime env plugin field(s) {names} are run only for Ray (through the Ray "
            "door, whose raylet names the plugins); this door cannot run them"
        )
    canonical = _canonical(draft, plugins, ignored)
    timeout, eager = draft.config
    return RuntimeEnv(
        working_dir=draft.working_dir,
        py_modules=tuple(draft.py_modules),
        env_vars=draft.env_vars,
        setup_timeout_seconds=timeout,
        eager_install=eager,
        canonical=canonical,
        env_id=env_id_of(canonical),
        packages=packages,
        py_executable=draft.py_executable,
        java_jars=tuple(draft.java_jars),
        uv_run=uv_run,
        plugins=plugins,
        wd_requirements=draft.wd_requirements,
        ignored=ignored,
        local_venv=local_venv,
        dialect=dialect,
    )


def _local_venv(draft: _Draft) -> PipSpec | UvSpec | None:
    """A set naming files or folders of the node: its venv is keyed by their bytes, at create."""
    if draft.venv is None:
        return None
    _, spec = draft.venv
    return spec if spec.sources else None


def _packages(draft: _Draft) -> tuple[Package, ...]:
    """The env's packages in its order: the working dir, the py_modules, the pip venv, the
    jars, the uv that builds the uv venv when its uv_version asks for another than the agent's,
    the uv venv (a set naming files of the node is none of them: derived at create; the uv that
    builds it is named all the same)."""
    packages: list[Package] = []
    if draft.working_dir is not None and draft.wd_uri is not None:
        packages.append(Package(UriKey(UriKind.WORKING_DIR, draft.working_dir), draft.wd_uri))
    packages.extend(
        Package(UriKey(module_kind(parsed, draft.dialect), uri), parsed)
        for uri, parsed in draft.py_modules.items()
    )
    venv = tool = None
    if draft.venv is not None:
        tool = tool_package(draft.venv[1], draft.agent_uv)
        if not draft.venv[1].sources:
            venv = venv_package(*draft.venv)
    if venv is not None and isinstance(venv.recipe, PipSpec):
        packages.append(venv)
    packages.extend(Package(UriKey(UriKind.JAVA_JARS, u), p) for u, p in draft.java_jars.items())
    if tool is not None:
        packages.append(tool)
    if venv is not None and isinstance(venv.recipe, UvSpec):
        packages.append(venv)
    return tuple(packages)


def _check_between_fields(
    draft: _Draft, uv_run: UvRun | Passthrough | None, local_venv: PipSpec | UvSpec | None
) -> None:
    """A set whose venv is derived from files cannot go with a ``uv run`` line, which makes
    the worker's venv from the project."""
    reads_files = "reads a requirements file of the working dir" if draft.wd_requirements else ""
    if local_venv is not None:
        reads_files = "names a file or folder of the node"
    if uv_run is not None and reads_files:
        tool = "pip" if draft.obj.get("pip") is not None else "uv"
        raise InvalidRuntimeEnv(
            f"{tool}.packages {reads_files}, and py_executable is a uv run line: uv run makes "
            f"the worker's venv from the project (add it to the project's dependencies); "
            f"leave {tool} out"
        )


def _canonical(
    draft: _Draft,
    plugins: tuple[tuple[str, str], ...],
    ignored: tuple[str, ...],
) -> str:
    """The env's identity as canonical JSON (see the module docstring)."""
    identity: dict[str, Any] = {}
    if draft.working_dir is not None:
        identity["working_dir"] = draft.working_dir
    if draft.py_modules:
        identity["py_modules"] = list(draft.py_modules)
    if draft.env_vars:
        identity["env_vars"] = dict(draft.env_vars)
    if draft.py_executable is not None:
        identity["py_executable"] = draft.py_executable
    if draft.java_jars:
        identity["java_jars"] = list(draft.java_jars)
    if draft.venv is not None:
        _, spec = draft.venv
        identity["pip" if isinstance(spec, PipSpec) else "uv"] = spec.canonical()
    wd = draft.wd_requirements
    if wd is not None:
        identity[wd.tool] = wd.identity()
    venv_kind = draft.venv[0] if draft.venv is not None else wd.kind if wd is not None else None
    if venv_kind is not None and sees_node(venv_kind):
        identity["venv"] = "node-site"
    if any(
        row_of(module_kind(parsed, draft.dialect)).build is Build.ZIP_AS_WORKING_DIR
        for parsed in draft.py_modules.values()
    ):
        identity["py_modules_top"] = "dropped"  # other packages than the gRPC door's: another env
    if plugins:
        identity["plugins"] = {name: json.loads(value) for name, value in plugins}
    if ignored:
        identity["ignored"] = list(ignored)  # another text than Ray counts: another env
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
