"""The staging folder's blocking steps around an install, each one thread hop for the store.

``prepare_staging``: the private (0700) folder an install builds in. ``place_package``: a
leftover at the package's final path that no record claims (a crash between steps) moved to
trash, then the one rename of the complete package into ``uris/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.crash import crash_point
from agent.install.disk import move_to_trash


def prepare_staging(staging: Path) -> None:
    """Make the install's staging folder: private, nobody else may touch a package being built."""
    staging.mkdir(mode=0o700)


def place_package(root: Path, unpacked: Path, final: Path) -> Path | None:
    """Rename ``unpacked`` to ``final``; return the leftover moved out of the way (in trash, to
    be deleted), if there was one. Blocking: one thread hop."""
    leftover = move_to_trash(root, final) if final.exists() else None
    crash_point("before_rename")
    os.rename(unpacked, final)
    return leftover
