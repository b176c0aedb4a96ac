"""Removing a folder of many small files (the demo's workdir: the agent's root, a folder per
package): with its unlinks spread over threads, or, for a run that was stopped, in a process of
its own that outlives the run.

Where each unlink waits on the disk for about a millisecond (this project's VM, busy), a serial
``shutil.rmtree`` of the 12,600 files a 1,000-task run over 100,000 envs cached took 12 s, at the
end of the run or after a Ctrl-C. Spread over 16 threads, the removal of 12,000 such files went
from 14 s to 1.5 s (on the machine less busy, from 2.2 s to 1.3 s).

That is still seconds, and it grows with the run: after 90 s of a run over 100,000 envs, 2.6 s of
its 3.1 s stop after SIGTERM went to removing 10,000 files. A stop must be prompt, so
``remove_detached`` makes the removal O(1) for the run: it renames the folder to a trash name
beside it (atomic, the same file system; the folder's name is free at once, and what is left of
it, should the removal not finish, is plainly trash), and removes it in a child process in a
session of its own (a terminal's Ctrl-C or hang-up does not reach it), with no stdin, stdout or
stderr (a reader waiting for the run's output to end is not kept waiting for it), in ``/`` (it
holds no folder busy), and bounded in time (``REMOVER_DEADLINE_S``).

    python -I -m raylet_sim.removal TRASH   # exits 0 once TRASH is gone, 1 if it is not
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_THREADS = 16
TRASH_SUFFIX = ".removing"
# the remover's bound: SIGALRM ends it (what is left stays in its trash folder). 10,000 files
# took it 2.6 s on a busy 2-core VM; this leaves a hundred times that.
REMOVER_DEADLINE_S = 300


def _listing(root: Path) -> tuple[list[str], list[list[str]]]:
    """Every file (or link) under ``root``, and its folders level by level, ``root`` first."""
    files: list[str] = []
    levels: list[list[str]] = []
    level = [str(root)]
    while level:
        levels.append(level)
        deeper: list[str] = []
        for folder in level:
            with contextlib.suppress(OSError), os.scandir(folder) as entries:
                for entry in entries:
                    (deeper if entry.is_dir(follow_symlinks=False) else files).append(entry.path)
        level = deeper
    return files, levels


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _rmdir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def remove_tree(root: Path) -> None:
    """Remove ``root`` and everything under it, as ``shutil.rmtree(root, ignore_errors=True)``
    does: what cannot be removed is left, quietly. Blocking: call it in a thread."""
    if root.is_symlink() or not root.is_dir():
        _unlink(str(root))
        return
    files, levels = _listing(root)
    with ThreadPoolExecutor(_THREADS, thread_name_prefix="remove") as pool:
        list(pool.map(_unlink, files))
        for level in reversed(levels):  # the deepest folders first, each level at once
            list(pool.map(_rmdir, level))


def remove_detached(root: Path) -> subprocess.Popen[bytes] | None:
    """Rename ``root`` to a trash name beside it and start a detached process that removes it
    (see the module's docstring); return that process, or None if there was nothing to remove or
    no process could be started, in which case ``root`` was removed here (blocking: call it in a
    thread)."""
    if not root.exists() and not root.is_symlink():
        return None
    trash = root.with_name(f".{root.name}{TRASH_SUFFIX}")
    try:
        root.rename(trash)
    except OSError:  # a trash folder of that name is left from before, say: remove it in place
        trash = root
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-m", "raylet_sim.removal", str(trash)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )
    except OSError:  # no process to be had (out of memory or of processes): remove it here
        remove_tree(trash)
        return None


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m raylet_sim.removal FOLDER", file=sys.stderr)
        return 2
    signal.alarm(REMOVER_DEADLINE_S)  # SIGALRM's default action ends the process
    folder = Path(argv[0])
    remove_tree(folder)
    return 1 if folder.exists() or folder.is_symlink() else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
