"""The modes of what the agent keeps: its own, not an archive's nor the umask's.

Packages are shared between jobs, so a package others may write to is one job rewriting
another's code. A file is 0644, or 0755 if it came with any execute bit; a folder is 0755;
setuid, setgid and sticky bits never survive. ``harden_tree`` gives a whole tree these modes
(a pip venv, or an archive with links), ``make_dir`` makes one of the agent's own folders so,
and ``is_loose`` tells an entry someone else could have written to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.core.errors import FailedPrecondition, echo

DIR_MODE = 0o755
FILE_MODE = 0o644
EXEC_MODE = 0o755
LOOSE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022  # never on anything the agent keeps


def file_mode(mode: int) -> int:
    """The mode a package's regular file gets, from the mode it came with: 0755 if it had any
    execute bit, else 0644. Nothing else of the original survives (no group or other write, no
    setuid, setgid or sticky bit)."""
    return EXEC_MODE if mode & 0o111 else FILE_MODE


def harden_tree(top: Path, label: str) -> None:
    """Give every folder under ``top`` (``top`` too) mode 0755 and every other non-link entry
    ``file_mode`` of its own, whatever made them and under whatever umask. Deepest first: no
    folder opens up before what it holds has its final mode. Links are never followed, nor their
    own modes touched (Linux ignores them). Blocking: call it in a thread.

    The caller makes sure nobody else can write under ``top`` meanwhile (it lies in a 0700
    staging folder). A mode that cannot be set (a file owned by another user) is a
    FailedPrecondition: the tree must not be kept."""
    with modes_settable(label):
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in (*filenames, *dirnames):
                _harden(os.path.join(dirpath, name))
        _harden(str(top))


@contextlib.contextmanager
def refused_unless_disk_full(refusal: Callable[[OSError], Exception]) -> Iterator[None]:
    """An ``OSError`` inside is ``refusal(exc)``, raised from it, unless it is a full disk
    (ENOSPC, EDQUOT), which passes through to the store: that is the disk's fault, not the
    package's, and the store frees room and says so."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise refusal(exc) from exc


def modes_settable(label: str) -> contextlib.AbstractContextManager[None]:
    """A mode that cannot be set (a file owned by another user) is a FailedPrecondition: the
    tree must not be kept."""
    return refused_unless_disk_full(
        lambda exc: FailedPrecondition(
            f"{label}: cannot give {echo(exc.filename)} its mode ({exc.strerror}); the package "
            "is not kept"
        )
    )


def _harden(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    mode = DIR_MODE if stat.S_ISDIR(st.st_mode) else file_mode(st.st_mode)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def make_dir(path: Path) -> None:
    """Make one of the agent's own folders (its parent exists) with mode 0755 whatever the umask;
    one that exists loses group and other write, setuid, setgid and sticky bits (a root left by
    an agent started under ``umask 000``). One or two metadata calls."""
    try:
        os.mkdir(path, 0o700)  # never looser than 0700 before the chmod, whatever the umask
        mode = DIR_MODE
    except FileExistsError:
        if not path.is_dir():
            raise
        mode = stat.S_IMODE(path.stat().st_mode)
        if not mode & LOOSE:
            return
        mode &= ~LOOSE
    os.chmod(path, mode)


def is_loose(st: os.stat_result) -> bool:
    """An entry the agent did not make, or that others may have written to: another user's,
    group or other writable, or with a setuid, setgid or sticky bit."""
    return st.st_uid != os.getuid() or bool(st.st_mode & LOOSE)
