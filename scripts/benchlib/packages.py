"""The zips the workloads install. Deterministic (seeded); building is blocking: run it in a
thread. Each builder returns the bytes the package unpacks to (what the agent counts as size)."""

from __future__ import annotations

import random
import zipfile
from dataclasses import dataclass
from pathlib import Path

_SOURCE = bytes((b" abcdefghijklmnopqrstuvwxyz_().:\n"[i % 33]) for i in range(256))
_NIBBLE = bytes((b"0123456789abcdef"[i % 16]) for i in range(256))


@dataclass(frozen=True)
class BigSpec:
    """Thousands of small files plus a few large ones (the cold-large package)."""

    small_files: int = 4000
    small_max_bytes: int = 8000
    large_random_mb: tuple[int, ...] = (14, 12)  # incompressible: stored nearly as is
    large_text_mb: tuple[int, ...] = (40,)  # hex-like text: deflates to about half


def build_big_zip(path: Path, spec: BigSpec, seed: int = 1) -> int:
    rng = random.Random(seed)
    unpacked = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(spec.small_files):
            size = rng.randint(200, spec.small_max_bytes)
            raw = rng.randbytes(size)
            data = raw if i % 3 == 0 else raw.translate(_SOURCE)
            zf.writestr(f"bigproj/pkg{i // 100}/mod{i}.py", data)
            unpacked += size
        for n, mb in enumerate(spec.large_random_mb):
            data = rng.randbytes(mb * 2**20)
            zf.writestr(f"bigproj/data/random{n}.bin", data)
            unpacked += len(data)
        for n, mb in enumerate(spec.large_text_mb):
            data = rng.randbytes(mb * 2**20).translate(_NIBBLE)
            zf.writestr(f"bigproj/data/table{n}.txt", data)
            unpacked += len(data)
    return unpacked


def build_small_zip(path: Path, module: str, payload_bytes: int, seed: int) -> int:
    """A py_modules zip: ``<module>/__init__.py`` and a data file of ``payload_bytes``."""
    rng = random.Random(seed)
    init = f"VALUE = {seed}\n".encode()
    data = rng.randbytes(payload_bytes)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{module}/__init__.py", init)
        zf.writestr(f"{module}/data.bin", data)
    return len(init) + len(data)


def build_workdir_zip(path: Path, name: str, seed: int) -> int:
    """A working_dir zip with a top-level folder, a module and a data file."""
    rng = random.Random(seed)
    files = {
        f"{name}/task.py": b"def run():\n    return 1\n",
        f"{name}/data/input.txt": f"{name}\n".encode(),
        f"{name}/data/blob.bin": rng.randbytes(4096),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for entry, data in files.items():
            zf.writestr(entry, data)
    return sum(len(v) for v in files.values())
