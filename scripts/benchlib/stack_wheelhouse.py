"""The uv-scale workload's real many-file stack, as binary wheels in a folder filled ONCE from
the package index and offline from then on.

``LIGHT`` pins numpy, scipy, pandas and scikit-learn at versions with cp311 manylinux wheels
(thousands of files once installed); ``HEAVY`` adds torch, whose CUDA build pulls the nvidia-*
wheels (gigabytes). ``stack_wheelhouse`` runs ``pip download --only-binary=:all:`` for this
interpreter (its dependencies too) into a folder of this user's beside Ray's repacked
wheelhouse (``tests/harness/ray_wheelhouse.user_base()``), named by the pins and this python's
tag: downloaded into a temporary folder beside it and renamed into place, so the folder is
complete or absent. Found there, it is used as it is: nothing more is downloaded. Before a
download, the free space of the folder's file system is checked against what the stack needs
plus ``KEEP_FREE`` (the machine stays above it).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib.procs import BenchError

LIGHT = ("numpy==2.3.5", "scipy==1.16.3", "pandas==2.3.3", "scikit-learn==1.9.1")
HEAVY = (*LIGHT, "torch==2.14.1")
MODULES = ("numpy", "scipy", "pandas", "sklearn")  # what the light stack's tasks import
HEAVY_MODULES = (*MODULES, "torch")
KEEP_FREE = 20 * 2**30  # the machine keeps this much free
# the download and what the run makes of it, about: with --heavy (hardlinked: uv_scale.py) the
# 3 GB of wheels, each agent's uv cache (5.7 GB) and this agent's root (its wheel cache, linked
# into its one venv), and the projects' venvs, linked
_NEEDS = {False: 4 * 2**30, True: 36 * 2**30}


@dataclass(frozen=True)
class StackHouse:
    path: Path  # the find-links folder
    pins: tuple[str, ...]
    wheels: tuple[str, ...]
    filled_s: float | None  # how long this call took to download it (None: found ready)


def key(pins: Sequence[str]) -> str:
    """The folder's name: this python's tag and a digest of the pins."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}"
    return f"stack-{tag}-{hashlib.sha256(' '.join(sorted(pins)).encode()).hexdigest()[:12]}"


def stack_wheelhouse(base: Path, heavy: bool) -> StackHouse:
    """The wheels of ``HEAVY`` (``heavy``) or ``LIGHT`` and their dependencies in a folder under
    ``base``: found, or downloaded once. Blocking (minutes for the heavy stack)."""
    pins = HEAVY if heavy else LIGHT
    final = base / key(pins)
    if final.is_dir():
        return StackHouse(final, pins, _names(final), None)
    free = shutil.disk_usage(base).free
    if free < _NEEDS[heavy] + KEEP_FREE:
        raise BenchError(
            f"{base}'s file system has {free / 2**30:.1f} GiB free: the stack needs about "
            f"{_NEEDS[heavy] / 2**30:.0f} GiB and the machine keeps {KEEP_FREE / 2**30:.0f} free"
        )
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=base))
    try:
        command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", str(staging), *pins]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
        if done.returncode != 0:
            raise BenchError(f"pip download {' '.join(pins)}: {done.stderr[-2000:]}")
        try:
            staging.rename(final)  # the folder is complete, or it is not there
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return StackHouse(final, pins, _names(final), time.monotonic() - started)


def _names(folder: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in folder.iterdir() if p.name.endswith(".whl")))
