"""The disk that fills anyway (issue 39 item 2): a real ``serve`` process whose root is on a
small tmpfs made by the test, ``uv run`` envs built by the real uv, offline, over gRPC.

The tmpfs holds one project venv but not two. K creates of lock A share one venv; a create of
lock B, which does not fit beside it, fails fast with RESOURCE_EXHAUSTED naming the bytes
needed, the bytes free, the floor and the setting, never uv's ENOSPC; nothing of B is left and
A's venv is untouched. A uv env whose size nobody knows ahead is stopped by the guard before the
floor is crossed. Once A's envs are gone (unused), B's create evicts A and succeeds.

Needs root (mount): skipped otherwise, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path

import grpc
import pytest

from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import serving
from tests.harness.disk import MiB, free_bytes, tmpfs
from tests.harness.in_process import listed
from tests.harness.packages import make_zip
from tests.harness.polling import wait_until
from tests.harness.ray_wheelhouse import big_wheel
from tests.harness.rpc import rpc_refused
from tests.harness.tempdirs import short_tempdir
from tests.harness.uv_wheels import have_uv, uv_env, write_wheel

pytestmark = pytest.mark.skipif(not have_uv(), reason="no uv beside the python nor on PATH")

FS_BYTES = 200 * MiB  # the tmpfs: A's venv (72 MiB) or B's (140 MiB), never both
FLOOR = "48M"  # min-free-disk: more than the guard lets an installer write between two polls
A_MIB, B_MIB = 72, 140
HOOK_LINE = f"/usr/local/bin/uv run --python {platform.python_version()} python"  # Ray's form
K = 3
FAST_S = 10.0  # a refusal by the estimate comes well within this (no byte of B written)
NO_ENOSPC = ("No space left", "os error 28", "Errno 28", "ENOSPC")


def lock_folder(base: Path, wheels: Path, name: str, big_version: str) -> dict[str, str]:
    """A project's pyproject.toml and the uv.lock the real uv makes of it, offline."""
    project = base / f"lock-{name}"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "exp"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        f'dependencies = ["alpha", "bigdep=={big_version}"]\n'
        f"[tool.uv]\nfind-links = [{json.dumps(str(wheels))}]\nno-index = true\n"
    )
    done = subprocess.run(
        [str(Path(sys.executable).parent / "uv"), "lock", "--offline", "--quiet"],
        cwd=project, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "UV_CACHE_DIR": str(base / "uv-cache"),
             "HOME": str(base), "TMPDIR": str(base)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {n: (project / n).read_text() for n in ("pyproject.toml", "uv.lock")}


def working_dir(base: Path, name: str, files: dict[str, str]) -> str:
    path = base / f"{name}.zip"
    path.write_bytes(make_zip({**files, "experiment.txt": name}))
    return path.as_uri()


def env_of(working_dir_uri: str) -> str:
    return json.dumps({"working_dir": working_dir_uri, "py_executable": HOOK_LINE})


def payload_digest(venv: Path) -> str:
    (payload,) = venv.glob("lib/python*/site-packages/bigdep/payload.bin")
    return hashlib.sha256(payload.read_bytes()).hexdigest()


def imported_size(venv: Path) -> int:
    """The worker's view: the venv's python imports bigdep and reads its payload's size."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import bigdep; print(bigdep.size())"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def project_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "uris").iterdir() if p.name.startswith("uv_project-"))


async def test_a_lock_that_cannot_fit_fails_fast_with_the_figures_and_runs_once_a_is_unused() -> (
    None
):
    base = short_tempdir()
    try:
        await _one_then_the_other(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _one_then_the_other(base: Path) -> None:
    wheels = base / "wheels"
    write_wheel(wheels, "alpha")
    big_wheel(wheels, A_MIB, version="1.0", seed=1)
    big_wheel(wheels, B_MIB, version="2.0", seed=2)
    lock_a = lock_folder(base, wheels, "a", "1.0")
    lock_b = lock_folder(base, wheels, "b", "2.0")
    a_envs = [env_of(working_dir(base, f"a{i}", lock_a)) for i in range(K)]
    b_env = env_of(working_dir(base, "b", lock_b))
    unknown = uv_env(["bigdep==2.0"], wheels)  # a set: nothing says its size ahead
    with tmpfs(FS_BYTES, required_in_ci=True) as fs:
        root = fs / "root"
        args = ("--root", str(root), "--min-free-disk", FLOOR)
        async with (
            serving(base / "agent.log", *args) as agent,
            grpc.aio.insecure_channel(agent.address) as channel,
        ):
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]

            def create(env: str) -> Awaitable[agent_pb2.CreateRuntimeEnvReply]:
                request = agent_pb2.CreateRuntimeEnvRequest(
                    serialized_runtime_env=env,
                    config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=120),
                )
                reply: Awaitable[agent_pb2.CreateRuntimeEnvReply] = stub.CreateRuntimeEnv(
                    request, timeout=150
                )
                return reply

            async def delete(env_id: str) -> int:
                reply = await stub.DeleteRuntimeEnv(
                    agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id), timeout=30
                )
                return int(reply.remaining_references)

            # K experiments on lock A: one venv
            replies = [await create(env) for env in a_envs]
            (a_dir,) = project_dirs(root)
            a_venv = root / "uris" / a_dir
            assert {r.context.py_executable for r in replies} == {f"{a_venv}/bin/python"}
            a_digest = payload_digest(a_venv)
            assert imported_size(a_venv) == A_MIB * MiB

            # lock B does not fit beside A: refused fast, by the estimate, with the figures
            free_before = free_bytes(fs)
            started = time.monotonic()
            details = await rpc_refused(
                create(b_env),
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"needs about {B_MIB}.0 MiB",
                "48.0 MiB",  # the floor
                "min-free-disk",
                "are free",
            )
            assert time.monotonic() - started < FAST_S, details
            assert not any(word in details for word in NO_ENOSPC), details
            await wait_until(lambda: not listed(root, "tmp"), what="staging removed")
            assert project_dirs(root) == [a_dir], "a half-built venv of B was left"
            assert free_before - free_bytes(fs) < MiB, "B wrote before it was refused"

            # a set of unknown size: the guard stops uv before the floor, with the figures
            details = await rpc_refused(
                create(unknown), grpc.StatusCode.RESOURCE_EXHAUSTED, "min-free-disk", "MiB"
            )
            assert not any(word in details for word in NO_ENOSPC), details
            await wait_until(lambda: not listed(root, "tmp"), what="staging removed")
            assert not [p for p in (root / "uris").iterdir() if p.name.startswith("uv-")]
            assert free_bytes(fs) > 0

            # A's venv untouched; the agent keeps serving it
            assert payload_digest(a_venv) == a_digest
            assert imported_size(a_venv) == A_MIB * MiB
            again = await create(a_envs[0])
            assert again.context.py_executable == f"{a_venv}/bin/python"

            # A's experiments end: its venv is unused, evicted when B is relaunched, which runs
            ids = {r.runtime_env_id for r in [*replies, again]}
            for env_id in ids:
                for _ in range(K + 1):  # one reference per create of that env
                    if await delete(env_id) == 0:
                        break
            b_reply = await create(b_env)
            (b_dir,) = project_dirs(root)
            assert b_dir != a_dir
            assert b_reply.context.py_executable == f"{root / 'uris' / b_dir}/bin/python"
            assert imported_size(root / "uris" / b_dir) == B_MIB * MiB
            info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30)
            assert info.cache.evictions >= 1
            log = agent.log_text()
            assert not any(word in log for word in NO_ENOSPC[:2]), log[-3000:]
