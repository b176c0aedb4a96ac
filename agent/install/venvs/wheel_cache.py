"""The root's one wheel cache, shared by every venv uv builds there: ``<root>/wheel-cache``.

uv installs each venv from it with ``--link-mode hardlink``: a file of an unpacked wheel is one
inode, linked into the cache and into every venv that installed it, so ten venvs that share a
large dependency hold about one copy of it on disk. The cache lives under the root (the same
file system as the staging folders and ``uris/``, which hardlinks need).

How it is counted (the budget's rule): a venv counts every file it holds, each inode once,
whole (``disk.root.du``): what the venv is, and the most its eviction may free. The cache counts
only its *own* bytes: the inodes under it that nothing else links (``st_nlink`` 1), the bytes
clearing it would free. A byte on disk is so counted at least once; one a venv shares with the
cache, by that venv. The cache's own bytes are unused bytes of the root: a pass over the index
evicts unused packages first (least recently used first), and when what is left unused plus the
cache's own bytes is still over the budget, the cache is cleared (``uv cache clean``, which
waits for the uv processes using the cache: uv's own lock). The disk floor does the same when
evicting packages would not make the room. A cleared cache costs the next install a fresh unpack
of its wheels (and their download, from an index), nothing else: no installed venv loses a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path

from agent.install.venvs.build import installer_environ
from agent.install.venvs.spawn import run

log = logging.getLogger(__name__)

CACHE_DIR = "wheel-cache"
_CLEAN_TIMEOUT_S = 120.0  # uv cache clean waits for the installs using the cache; at most this
_VERSION_TIMEOUT_S = 30.0  # for ``uv --version``


def find_uv() -> str | None:
    """The uv binary: the one beside this interpreter (the venv the agent runs from, where the
    ``uv`` extra installs it), else the first on PATH; None when there is none."""
    beside = Path(sys.executable).parent / "uv"
    if os.access(beside, os.X_OK) and beside.is_file():
        return str(beside)
    return shutil.which("uv")


async def version_of(uv: str | None) -> str:
    """The version a uv binary tells (``uv --version``: "uv 0.13.9 (...)" -> "0.13.9"); "" when
    there is no uv, or it tells none within ``_VERSION_TIMEOUT_S`` (a ``uv_version`` is then
    never taken as satisfied by it)."""
    if uv is None:
        return ""
    try:
        done = await run([uv, "--version"], env=installer_environ(), timeout_s=_VERSION_TIMEOUT_S)
    except (TimeoutError, OSError):
        return ""
    words = done.output.decode(errors="replace").split() if done.code == 0 else []
    return words[1] if len(words) > 1 and words[0] == "uv" else ""


def own_bytes(cache: Path) -> int:
    """Bytes of the distinct files under ``cache`` that nothing else links (``st_nlink`` 1;
    links not followed). Blocking: call it in a thread."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, names in os.walk(cache):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if st.st_nlink == 1 and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


class WheelCache:
    """The cache folder and the uv that clears it (the agent's: ``version`` is what it tells,
    "" if unknown)."""

    def __init__(self, root: Path, uv: str | None, version: str = "") -> None:
        self.path = root / CACHE_DIR
        self.uv = uv
        self.version = version
        self.own_bytes = 0  # as of the last measure
        self.clears = 0

    async def measure(self) -> int:
        self.own_bytes = await asyncio.to_thread(own_bytes, self.path)
        return self.own_bytes

    async def clear(self) -> bool:
        """Clear the cache with ``uv cache clean`` (bounded in time; a uv that overstays is
        killed); True if it ran to success. Without uv there is no cache to clear."""
        if self.uv is None or not await asyncio.to_thread(self.path.is_dir):
            return False
        try:
            done = await run(
                [self.uv, "cache", "clean", "--quiet", "--cache-dir", str(self.path)],
                env=installer_environ(),
                timeout_s=_CLEAN_TIMEOUT_S,
            )
        except TimeoutError:  # the uv that overstayed was killed
            log.warning(
                "uv cache clean of %s did not finish; the cache is kept",
                self.path,
                extra={"path": str(self.path)},
            )
            return False
        if done.code != 0:
            log.warning(
                "uv cache clean of %s exited with %s: %s",
                self.path,
                done.code,
                done.output.decode(errors="replace")[-500:],
                extra={"path": str(self.path), "exit_code": done.code},
            )
            return False
        self.clears += 1
        log.info(
            "cleared the wheel cache (%d bytes of its own)",
            self.own_bytes,
            extra={"path": str(self.path), "bytes": self.own_bytes},
        )
        self.own_bytes = 0
        return True


def pip_installer_for(setting: str, uv: str | None) -> str:
    """What installs a pip env: the ``pip-installer`` setting, with ``auto`` resolved to uv when
    there is one (the venvs then share the wheel cache) and to pip when there is none."""
    if setting == "auto":
        return "uv" if uv is not None else "pip"
    return setting
