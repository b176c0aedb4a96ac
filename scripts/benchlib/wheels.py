"""Wheels the pip and uv workloads install offline: pure python, version 1.0, made here."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path


def write_wheel(
    directory: Path, name: str, data: Mapping[str, bytes], deps: tuple[str, ...] = ()
) -> Path:
    """``<name>-1.0-py3-none-any.whl`` in ``directory``: the module ``name`` (its VALUE is its
    name), the files ``data`` beside its ``__init__.py`` (stored as is), ``Requires-Dist`` each
    of ``deps``, and a RECORD that pip and uv verify."""
    info = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {dep}\n" for dep in deps)
    files = {
        f"{name}/__init__.py": f"VALUE = {name!r}\n".encode(),
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
