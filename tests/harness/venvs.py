"""The venvs the agent builds, seen from outside: probe what a worker's python sees, check that a
failed build left nothing behind and the agent still serves."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc

from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, listed
from tests.harness.packages import env_json
from tests.harness.pip_wheels import (
    processes_mentioning,
    run,
)
from tests.harness.polling import wait_until

BUILD_S = 60.0  # deadline for one venv build on a loaded machine


PROBE = """\
import importlib, importlib.util, json, sys
out = {"executable": sys.executable, "prefix": sys.prefix, "path": sys.path,
       "grpc": importlib.util.find_spec("grpc") is not None}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        out[name] = [module.VALUE, module.__file__]
    except ImportError:
        out[name] = None
print(json.dumps(out))
"""


async def probe(context: agent_pb2.RuntimeEnvContext, *modules: str) -> dict[str, Any]:
    """Start the context's python as a worker would be, and report what it sees."""
    env = {**os.environ, **context.env_vars}
    code, out, err = await run(
        context.py_executable, "-c", PROBE, *modules, env=env, cwd=context.cwd or None
    )
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def pip_dirs(ra: RunningAgent) -> list[str]:
    return [name for name in ra.uri_dirs() if name.startswith("pip-")]


def logs(ra: RunningAgent) -> list[Path]:
    folder = ra.root / "logs"
    return sorted(folder.iterdir()) if folder.exists() else []


async def nothing_left(ra: RunningAgent) -> None:
    """No venv anywhere, no staging, no installer process, and the books agree. (A create that
    timed out is answered at once; its cancelled install winds down after the answer.)"""
    staging = f"{ra.root / 'tmp'}/"
    store = ra.service.store
    await wait_until(lambda: store.installs_in_flight() == 0, what="the install wound down")
    await wait_until(lambda: not processes_mentioning(staging), what="installers gone")
    await ra.settle()
    assert listed(ra.root, "tmp") == []
    assert pip_dirs(ra) == []
    info = await ra.info()
    assert [u.uri for u in info.uris if u.kind == "pip"] == []
    assert info.total_envs == 0
    ra.service.check_invariants()


async def still_serves(ra: RunningAgent) -> None:
    reply = await ra.create(env_json(env_vars={"AFTER": "failure"}))
    assert await ra.delete(reply.runtime_env_id) == 0


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    assert isinstance(exc, grpc.aio.AioRpcError), exc
    return exc.code(), exc.details() or ""
