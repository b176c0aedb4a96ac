"""The error tree: every expected error is defined in agent/core/errors.py and drawn in its
docstring, each has a protocol-neutral kind, each door maps every kind through one table (the
gRPC codes clients have always seen; the HTTP statuses; the Ray door's replies), and nothing
below the doors knows gRPC."""

from __future__ import annotations

import ast
import asyncio
import importlib
import pkgutil
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

import agent
from agent.core import errors
from agent.core.errors import AgentError, ErrorKind, stray_cancellation
from agent.doors import http_errors, ray_errors
from agent.doors.grpc_errors import STATUS, status_of

AGENT = Path(agent.__file__).parent
# The modules that speak gRPC: the doors, the server that builds them, and the info command
# (a gRPC client).
# ... and the GCS client (gcs:// packages), a client of Ray's GCS as transport.py is of HTTP
GRPC_ALLOWED = ("doors/", "ops/server.py", "ops/info_address.py", "install/fetch/gcs_source.py")
_GRPC_MODULES = ("grpc", "rtenv.")  # grpc, grpc_health, grpc_reflection...; the generated stubs


def _subclasses(cls: type[AgentError]) -> set[type[AgentError]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def _agent_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages([str(AGENT)], "agent.")
        if info.name != "agent.__main__"  # runs the command line
    ]
    assert {"agent.doors.access", "agent.install.venvs.build", "agent.ops.startup"} <= set(names)
    return names


def _sources() -> dict[str, ast.Module]:
    return {
        path.relative_to(AGENT).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(AGENT.rglob("*.py"))
    }


def _tree_names() -> set[str]:
    """The class names the docstring's tree draws."""
    doc = errors.__doc__ or ""
    names = set(re.findall(r"[├└]── (\w+)", doc))
    assert re.search(r"^    AgentError ", doc, re.MULTILINE), "the tree has no root"
    return names | {"AgentError"}


def test_every_agent_error_is_defined_in_errors_py_and_drawn_in_its_tree() -> None:
    for name in _agent_modules():
        importlib.import_module(name)
    defined: set[type[AgentError]] = {AgentError, *_subclasses(AgentError)}
    elsewhere = sorted(
        f"{c.__module__}.{c.__name__}" for c in defined if c.__module__ != errors.__name__
    )
    assert elsewhere == [], "AgentError subclasses outside agent/core/errors.py"
    assert {c.__name__ for c in defined} == _tree_names()

    # Classes that importing cannot reveal (defined in a function): by their base's name.
    names = {c.__name__ for c in defined}
    for path, module in _sources().items():
        if path == "core/errors.py":
            continue
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases}
                assert not bases & names, f"{path}: class {node.name} is an AgentError"


def test_every_error_has_a_kind_as_the_tree_draws_and_a_subclass_without_one_is_refused() -> None:
    for cls in _subclasses(AgentError):
        assert isinstance(cls.kind, ErrorKind), cls
    drawn = dict(re.findall(r"[├└]── (\w+) +([A-Z_]{3,})\b", errors.__doc__ or ""))
    assert len(drawn) == len(ErrorKind), drawn  # one branch per kind
    assert {name: getattr(errors, name).kind.name for name in drawn} == drawn
    with pytest.raises(TypeError, match="Stray has no ErrorKind"):

        class Stray(AgentError):
            pass


def test_every_kind_has_one_grpc_code_and_clients_see_the_codes_they_always_saw() -> None:
    assert set(STATUS) == set(ErrorKind)
    seen = {
        name: status_of(getattr(errors, name).kind)
        for name in sorted(_tree_names() - {"AgentError"})
    }
    code = grpc.StatusCode
    assert seen == {
        "InvalidArgument": code.INVALID_ARGUMENT,
        "InvalidRuntimeEnv": code.INVALID_ARGUMENT,
        "NotFound": code.NOT_FOUND,
        "EnvNotFound": code.NOT_FOUND,
        "PackageNotFound": code.NOT_FOUND,
        "FailedPrecondition": code.FAILED_PRECONDITION,
        "IntegrityError": code.FAILED_PRECONDITION,
        "UnsafeArchive": code.FAILED_PRECONDITION,
        "PackageRejected": code.FAILED_PRECONDITION,
        "ObjectStoreSetup": code.FAILED_PRECONDITION,
        "InstallerFailed": code.FAILED_PRECONDITION,
        "UnsupportedOnNode": code.FAILED_PRECONDITION,
        "Conflict": code.FAILED_PRECONDITION,
        "EnvBusy": code.FAILED_PRECONDITION,
        "RequestIdReused": code.FAILED_PRECONDITION,
        "PermissionDenied": code.PERMISSION_DENIED,
        "Unauthenticated": code.UNAUTHENTICATED,
        "Unavailable": code.UNAVAILABLE,
        "DownloadFailed": code.UNAVAILABLE,
        "IndexUnavailable": code.UNAVAILABLE,  # the root's shared index stayed locked, or failed
        "PluginFailed": code.UNAVAILABLE,  # a Ray runtime env plugin's hook raised
        "DiskExhausted": code.RESOURCE_EXHAUSTED,
        "RayStringsFull": code.RESOURCE_EXHAUSTED,  # never sent over gRPC: the Ray door's
        "SetupTimeout": code.DEADLINE_EXCEEDED,
        # met at start, never sent: as they were before kinds
        "Misconfigured": code.FAILED_PRECONDITION,
        "ConfigError": code.FAILED_PRECONDITION,
        "StartupError": code.FAILED_PRECONDITION,
        "StateDBError": code.FAILED_PRECONDITION,
        "TokenError": code.FAILED_PRECONDITION,
    }


def test_each_door_maps_every_kind_in_its_one_table() -> None:
    """The gRPC door's table (kind -> status code), the HTTP doors' (kind -> status) and the
    Ray door's (kind, and each refusal of its own -> HTTP status and words): each whole."""
    tables: dict[str, Mapping[Any, object]] = {
        "grpc": STATUS, "http": http_errors.STATUS, "ray": ray_errors.REPLY,
    }  # fmt: skip
    for door, table in tables.items():
        missing = [kind.name for kind in ErrorKind if kind not in table]
        assert missing == [], f"{door} door: no answer for {missing}"
    assert set(ray_errors.REPLY) == set(ErrorKind) | set(ray_errors.Refusal)
    for kind in ErrorKind:  # a request's failure is Ray's FAILED reply, its message prefixed
        answer = ray_errors.REPLY[kind]
        assert (answer.status, answer.failed) == (200, True), kind
        assert answer.text(prefix="[p] ", message="m") == "[p] m"
    refusals = {r: (a.status, a.failed) for r, a in ray_errors.REPLY.items() if r not in ErrorKind}
    Refusal = ray_errors.Refusal
    assert refusals == {  # what is not a request: an HTTP error with one line
        Refusal.NOT_A_MESSAGE: (400, False), Refusal.TOO_LARGE: (413, False),
        Refusal.NO_TOKEN: (401, False), Refusal.WRONG_TOKEN: (403, False),
        Refusal.STARTING: (503, False), Refusal.START_FAILED: (503, False),
    }  # fmt: skip
    starting = ray_errors.REPLY[Refusal.STARTING].text(seconds=30.0)
    assert starting == "the agent is still starting after 30s; retry later\n"


def _imports_grpc(module: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(_GRPC_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_GRPC_MODULES):
            found.append(node.module or "")
    return found


def test_nothing_below_the_doors_imports_grpc() -> None:
    """core, install, state and app are free of gRPC (and of its generated messages); in ops,
    only the server that builds the doors and the info command's client speak it (and, in
    install, the client of a Ray node's GCS)."""
    offenders = {
        path: names
        for path, module in _sources().items()
        if not path.startswith(GRPC_ALLOWED) and (names := _imports_grpc(module))
    }
    assert offenders == {}
    assert _imports_grpc(_sources()["doors/grpc_errors.py"]) == ["grpc"], "the check sees imports"


def test_no_exception_is_decorated_after_it_is_raised() -> None:
    """Facts for the log line (the env id) travel as bound log fields, not as attributes set on
    a caught exception (``except ... as exc: exc.env_id = ...``)."""
    decorated = []
    for path, module in _sources().items():
        for handler in ast.walk(module):
            if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
                continue
            for node in ast.walk(handler):
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                decorated += [
                    f"{path}:{t.lineno} {ast.unparse(t)}"
                    for t in targets
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == handler.name
                ]
    assert decorated == []


async def test_a_cancellation_is_stray_only_when_nobody_cancelled_the_task_that_meets_it() -> None:
    """``stray_cancellation``: a cancelled future awaited by a task nobody cancelled is stray
    (a bug below); the task's own cancellation is not."""
    seen: list[bool] = []

    async def awaits_a_cancelled_future() -> None:
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        cancelled.cancel()
        try:
            await cancelled
        except asyncio.CancelledError:
            seen.append(stray_cancellation())

    async def is_cancelled(started: asyncio.Event) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append(stray_cancellation())
            raise

    await awaits_a_cancelled_future()
    started = asyncio.Event()
    task = asyncio.create_task(is_cancelled(started))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [True, False]
