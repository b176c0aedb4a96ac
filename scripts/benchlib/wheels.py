"""Wheels the pip and uv workloads install offline (pure python, version 1.0, made here), and the
baseline both measure against: one venv per job, built as a user without the agent would."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_wheel(
    directory: Path,
    name: str,
    data: Mapping[str, bytes],
    deps: Sequence[str] = (),
    *,
    value: str | None = None,
) -> Path:
    """``<name>-1.0-py3-none-any.whl`` in ``directory``: the module ``name`` (its VALUE
    ``value``, or its name), the files ``data`` beside its ``__init__.py`` (stored as is),
    ``Requires-Dist`` each of ``deps``, and a RECORD that pip and uv verify. The uv tests write
    their wheels with it too (``tests/harness/uv_wheels.py``)."""
    info = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {dep}\n" for dep in deps)
    files = {
        f"{name}/__init__.py": f"VALUE = {name if value is None else value!r}\n".encode(),
        **{f"{name}/{file}": body for file, body in data.items()},
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, body in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(body)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, body in files.items():
            zf.writestr(path, body)
    return wheel


async def per_job_venv(target: Path, wheelhouse: Path, packages: Sequence[str]) -> None:
    """``python -m venv --without-pip`` filled by this python's pip through ``--python``,
    offline from ``wheelhouse``, with no pip configuration of this machine."""
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
