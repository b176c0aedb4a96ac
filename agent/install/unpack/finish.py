"""The last step of a zip extraction, once every share is written: the symlinks, made last so
no entry is ever written through one, each checked lexically before it is made and with
``realpath`` after (a target absolute or resolving outside the package is refused), then all
once more; then the final modes, deepest first, opening up the private tree (``modes.py``).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from agent.core.errors import UnsafeArchive, echo
from agent.install.disk.modes import DIR_MODE, harden_tree, modes_settable
from agent.install.unpack.plan import DRIVE, Entry, Plan
from agent.install.unpack.stop import Halted, stop_if_halted
from agent.install.unpack.write import unwritable

_MAX_SYMLINK_TARGET = 4096


def finish(zf: zipfile.ZipFile | None, plan: Plan, root: Path, label: str, halted: Halted) -> int:
    """After every share is written: the links (each checked before and after it is made, then
    all once more), then the final modes, deepest first: the planned folders (the files have
    theirs), or, when links were made, a walk of the whole tree (``harden_tree``). Returns the
    bytes the links hold. ``zf`` may be None when the plan has no links (the archive is not
    read again)."""
    written = 0
    for entry in plan.links:
        assert zf is not None, "a plan with links is finished from its archive"
        stop_if_halted(halted)
        with unwritable(entry, label):
            written += _link(zf, entry, root, label)
    for entry in plan.links:  # a later link can redirect an earlier one: check them all again
        if not _inside(root, Path(os.path.realpath(root.joinpath(*entry.rel.parts)))):
            _unlink_all(root, plan.links)
            raise UnsafeArchive(
                f"{label}: symlink {echo(entry.info.filename)} resolves outside the package "
                "through another link"
            )
    stop_if_halted(halted)
    if plan.links:
        harden_tree(root, label)
        return written
    with modes_settable(label):
        for folder in reversed(plan.dirs):  # no link in the tree: each path is the folder
            os.chmod(os.path.join(root, *folder), DIR_MODE)
        os.chmod(root, DIR_MODE)
    return written


def _link(zf: zipfile.ZipFile, entry: Entry, root: Path, label: str) -> int:
    name = entry.info.filename
    if entry.info.file_size > _MAX_SYMLINK_TARGET:
        raise UnsafeArchive(f"{label}: symlink {echo(name)} has an oversized target")
    try:
        target = zf.read(entry.info).decode()
    except UnicodeDecodeError as exc:
        raise UnsafeArchive(f"{label}: symlink {echo(name)} has an undecodable target") from exc
    if not target or "\x00" in target or target.startswith("/") or DRIVE.match(target):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} points to {echo(target)}, outside the package"
        )
    lexical = os.path.normpath(os.path.join(str(entry.rel.parent), target))
    if lexical == ".." or lexical.startswith("../"):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} points to {echo(target)}, outside the package"
        )
    link = root.joinpath(*entry.rel.parts)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not _inside(root, Path(os.path.realpath(link.parent))):
        raise UnsafeArchive(
            f"{label}: symlink {echo(name)} lies under a link that leaves the package"
        )
    if link.is_symlink() or link.exists():
        raise UnsafeArchive(f"{label}: symlink {echo(name)} collides with another entry")
    os.symlink(target, link)
    if not _inside(root, Path(os.path.realpath(link))):
        link.unlink()
        raise UnsafeArchive(f"{label}: symlink {echo(name)} resolves outside the package")
    return len(target.encode())


def _unlink_all(root: Path, links: tuple[Entry, ...]) -> None:
    """Leave no way out behind, even in a staging tree: remove the links, shallowest first, and
    only where the link's folder still resolves inside ``root`` (never unlink through a link)."""
    for entry in sorted(links, key=lambda e: len(e.rel.parts)):
        path = root.joinpath(*entry.rel.parts)
        if _inside(root, Path(os.path.realpath(path.parent))):
            path.unlink(missing_ok=True)


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents
