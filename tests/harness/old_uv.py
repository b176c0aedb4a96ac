"""A real uv wheel of another version than the agent's, for the ``uv_version`` tests: uv
``OLD_UV`` (the version Ray's own test pins, ``test_uv_with_version_and_check``), as PyPI
serves it for this machine.

The tests stay on loopback: they serve this wheel from a package index on 127.0.0.1 and never
download it. It is fetched once per machine user, outside the tests, into a folder of the
user's own (``$RTENV_WHEELHOUSE_BASE`` or ``/tmp/rtenv-wheelhouse-<uid>``, the Ray wheelhouse's
base: ``tests/harness/ray_wheelhouse.py``), ``uv-<OLD_UV>/``: by ``.ci/run`` before its test
command, or by hand::

    python3 tests/harness/old_uv.py

which runs ``pip download`` (PyPI, or the index pip is configured with) into a temporary folder
beside it and renames it into place, so a folder that is there is complete. A test finding none
skips, saying this command. Standard library only: ``.ci/run`` runs it with a bare venv's python.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

OLD_UV = "0.4.0"
_DOWNLOAD_TIMEOUT_S = 600
FILL = "python3 tests/harness/old_uv.py"  # how to fill the folder, for a skip's reason


def base() -> Path:
    """The user's wheelhouse base, made 0700 if missing; refused when it is not this user's own
    folder closed to others (the rule of ``ray_wheelhouse.user_base``, restated here: this
    module runs where ``packaging`` is not installed)."""
    path = Path(os.environ.get("RTENV_WHEELHOUSE_BASE") or f"/tmp/rtenv-wheelhouse-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{path} is not a folder of this user's closed to others: remove it, or set "
            "RTENV_WHEELHOUSE_BASE"
        )
    return path


def folder() -> Path:
    return base() / f"uv-{OLD_UV}"


def old_uv_wheel() -> Path | None:
    """The uv ``OLD_UV`` wheel for this machine, if the folder was filled."""
    found = sorted(folder().glob(f"uv-{OLD_UV}-*.whl")) if folder().is_dir() else []
    return found[0] if found else None


def fill() -> Path:
    """Download the wheel once (``pip download``, binary only, no dependencies: uv has none);
    return it. A folder already there is kept."""
    found = old_uv_wheel()
    if found is not None:
        return found
    final = folder()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(staging), f"uv=={OLD_UV}"],
            check=True,
            timeout=_DOWNLOAD_TIMEOUT_S,
        )  # fmt: skip
        if not list(staging.glob(f"uv-{OLD_UV}-*.whl")):
            raise RuntimeError(f"pip download left no uv {OLD_UV} wheel in {staging}")
        try:
            staging.rename(final)  # atomic: complete, or not there
        except OSError:
            if not final.is_dir():  # not a concurrent fill's win: a real failure
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    wheel = old_uv_wheel()
    if wheel is None:
        raise RuntimeError(f"{final} holds no uv {OLD_UV} wheel")
    return wheel


if __name__ == "__main__":
    print(fill())
