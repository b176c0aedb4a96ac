"""shared-wheels: N jobs, each with its own requirement set (a small package of its own and one
large dependency they all share), through the agent (N ``uv`` envs: N venvs, linked from one
wheel cache) against one venv per job built the way a user without the agent would (``python -m
venv`` and the same pip, offline), all at once in both cases.

Offline: the wheels are written here (the large one holds random bytes), every install names
``--no-index --find-links``, and every proxy variable points at a closed port of 127.0.0.1 for
the run. The per-job venvs are made ``--without-pip`` and filled by the bench's own pip through
``--python``: no ensurepip copy in each (a cheaper baseline than a plain ``python -m venv``, so
the ratios do not owe anything to pip's own files). Figures: disk bytes (``du -sb``: each
hardlinked inode once; the agent's whole root, its cache and index included) and wall time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc

from benchlib import rpc
from benchlib.config import Sizes
from benchlib.figures import Goal, Measure, WorkloadResult
from benchlib.procs import AgentProcess
from rtenv.v1 import agent_pb2

_BIG = "benchbigdep"
_CLOSED = "http://127.0.0.1:9"  # nothing listens on the discard port


def _wheel(directory: Path, name: str, payload: bytes, deps: tuple[str, ...] = ()) -> None:
    """A pure-python wheel, version 1.0, its module beside ``payload`` (stored as is)."""
    info = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {dep}\n" for dep in deps)
    files = {
        f"{name}/__init__.py": f"VALUE = {name!r}\n".encode(),
        f"{name}/payload.bin": payload,
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)


def _du(*paths: Path) -> int:
    """``du -sbc``: apparent bytes, each inode once across all the paths."""
    done = subprocess.run(
        ["du", "-sbc", *map(str, paths)], capture_output=True, text=True, timeout=300, check=True
    )
    return int(done.stdout.splitlines()[-1].split()[0])


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """No pip configuration of this machine, every proxy at a closed loopback port (the agent
    process and the per-job pips inherit it), restored after."""
    keys = ("PIP_CONFIG_FILE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "no_proxy")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update({"PIP_CONFIG_FILE": os.devnull, "HTTP_PROXY": _CLOSED,
                       "HTTPS_PROXY": _CLOSED, "ALL_PROXY": _CLOSED})  # fmt: skip
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _per_job_venv(target: Path, wheelhouse: Path, packages: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    for args in (
        [sys.executable, "-m", "venv", "--without-pip", str(target)],
        [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install",
         "--disable-pip-version-check", "--no-input", "--no-index", "--find-links",
         str(wheelhouse), *packages],
    ):  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{args[2:5]} failed: {err.decode()[-500:]}")


async def bench_shared_wheels(work: Path, sizes: Sizes) -> WorkloadResult:
    result = WorkloadResult("shared-wheels")
    wheelhouse = work / "wheelhouse"
    wheelhouse.mkdir()
    big = sizes.shared_wheel_bytes
    _wheel(wheelhouse, _BIG, os.urandom(big))
    jobs = sizes.shared_wheel_sets
    sets = [[_BIG, f"benchown{i}"] for i in range(jobs)]
    for i in range(jobs):
        _wheel(wheelhouse, f"benchown{i}", os.urandom(1024))
    options = ["--no-index", "--find-links", str(wheelhouse)]

    agent_m = Measure("agent: one uv venv per set, one wheel cache")
    per_job = Measure("one venv per job (python -m venv, pip install)")
    with _offline():
        root = work / "root"
        async with AgentProcess(root) as agent:
            async with grpc.aio.insecure_channel(agent.address) as channel:
                stub = rpc.stub(channel)

                async def job(packages: list[str]) -> None:
                    env = {"uv": {"packages": packages, "uv_pip_install_options": options}}
                    t0 = time.perf_counter()
                    await stub.CreateRuntimeEnv(
                        agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=json.dumps(env)),
                        timeout=sizes.phase_timeout_s,
                    )
                    agent_m.latencies_s.append(time.perf_counter() - t0)

                started = time.perf_counter()
                await asyncio.gather(*(job(packages) for packages in sets))
                agent_m.wall_s = time.perf_counter() - started
                agent_m.requests = jobs
                info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest())
            agent_m.extractions = info.cache.extractions
            venvs = [u for u in info.uris if u.kind == "uv"]
            agent_bytes = _du(root)

        started = time.perf_counter()
        targets = [work / f"job{i}" for i in range(jobs)]
        await asyncio.gather(
            *(_per_job_venv(t, wheelhouse, s) for t, s in zip(targets, sets, strict=True))
        )
        per_job.wall_s = time.perf_counter() - started
        per_job.requests = jobs
        per_job_bytes = _du(*targets)

    result.measures += [agent_m, per_job]
    result.figure(
        f"disk bytes, {jobs} sets sharing a {big / 2**20:g} MiB wheel", float(agent_bytes),
        float(per_job_bytes), f"{jobs} per-job venvs", "bytes", Goal("ratio", "<=", 0.2),
    )  # fmt: skip
    result.figure(
        f"wall, {jobs} concurrent jobs, distinct sets", agent_m.wall_s, per_job.wall_s,
        f"{jobs} per-job venvs built at once", "s", Goal("ratio", "<=", 0.5),
    )  # fmt: skip
    result.notes.append(
        f"{len(venvs)} venv(s) built by the agent's uv for {jobs} distinct sets "
        f"({agent_m.extractions} install(s)); the agent's bytes are its whole root (du -sb: "
        "each hardlinked inode once), the per-job venvs' du -sbc over them all"
    )
    return result
