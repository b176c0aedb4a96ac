"""Disk space under test: a small tmpfs, the free bytes on it, a floor, zips of incompressible
data, a folder's bytes as Ray's tools count them."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.install.disk.root import DiskFloor
from tests.harness.packages import make_zip
from tests.harness.tempdirs import short_tempdir

MiB = 1024**2


TMPFS_BYTES = 8 * MiB


@contextmanager
def tmpfs(size_bytes: int = TMPFS_BYTES, *, required_in_ci: bool = False) -> Iterator[Path]:
    """A fresh tmpfs of ``size_bytes``, unmounted afterwards; skip the test if none can be had
    (needs root), or, with ``required_in_ci`` under ``CI=true`` (which runs as root), fail it:
    there a test that never ran would pass unseen."""
    mount_point = short_tempdir()
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except FileNotFoundError as exc:
        result = subprocess.CompletedProcess([], 1, "", str(exc))
    if result.returncode != 0:
        shutil.rmtree(mount_point, ignore_errors=True)
        why = f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}"
        if required_in_ci and os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI runs as root, so this test must run there")
        pytest.skip(why)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, timeout=30)
        mount_point.rmdir()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def noise_zip(size: int) -> bytes:
    """A working_dir zip unpacking to ``size`` bytes of incompressible data."""
    return make_zip({"proj/data.bin": os.urandom(size)}, compression=zipfile.ZIP_STORED)


def floor(bytes_: int) -> DiskFloor:
    return DiskFloor(bytes_=bytes_, percent=None)


def rays_size(path: Path) -> int:
    """A folder's bytes as Ray's ``get_directory_size_bytes`` adds them up (files; symlinks
    and .pyc skipped): what Ray's cache tests measure in its folders."""
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            file = os.path.join(top, name)
            if not os.path.islink(file) and not name.endswith(".pyc"):
                total += os.path.getsize(file)
    return total
