"""Safe zip extraction, in three steps that several processes can share (``pool.py``):
``plan.plan_zip`` (every check the central directory allows, pure but for what ``zipfile``
read), ``write.write_share`` (one share of the files and folders, ``shares`` splitting
them by work), and ``finish.finish`` (the links, then the final modes), once every share is
written; ``stop`` is how they are told to stop. ``extract_zip`` here runs the three in one
call. Synchronous: run in a worker process or a thread.

What is refused (``UnsafeArchive``, FAILED_PRECONDITION), before a byte is written where it can be
known from the central directory, and while writing where it cannot:

- not a zip, a corrupt or encrypted one, an entry of an unsupported kind (device, fifo);
- more entries than ``max_entries``; more declared or written bytes than
  ``max_uncompressed_bytes``; a total uncompressed size over ``max_ratio`` times the archive's;
- a name that is absolute, has a drive letter, a NUL byte, or a ``..`` component;
- a symlink whose target is absolute or resolves outside the destination, checked lexically
  before it is made and with ``realpath`` after. Symlinks are made last, after every regular
  file and directory, so no entry is ever written through one.

``strip_top_level`` (working_dir): when every entry lies under one top-level folder, that folder
is dropped, as Ray does, so ``proj/main.py`` lands at ``<dest>/main.py``.

Modes are the agent's, not the archive's nor the umask's (``modes.py``: a file 0644, or 0755 if
the entry has any execute bit; a folder 0755). The tree is built private (0700 at its top, files
created 0600) and opened up deepest first once complete.
"""

from __future__ import annotations

import threading
from pathlib import Path

from agent.install.unpack.finish import finish
from agent.install.unpack.plan import ArchiveLimits, opened_zip, plan_zip
from agent.install.unpack.write import write_share


def extract_zip(
    archive: Path,
    dest: Path,
    *,
    strip_top_level: bool,
    limits: ArchiveLimits,
    label: str,
    stop: threading.Event | None = None,
) -> int:
    """Extract ``archive`` into the new directory ``dest``; return the bytes written.

    ``label`` names the package in errors (its URI, already cut: ``UriKey.label``). On error
    ``dest`` may hold a partial tree: the caller extracts into a staging directory and removes
    it. ``stop``, once set, ends the extraction (``Stopped``) at its next entry or chunk, so a
    cancelled install's thread stops writing before its staging folder is removed.

    The same steps as the unpack pool's workers take (``worker``), in one call: plan,
    write every entry (one share), finish (links, then the final modes).
    """
    halted = (stop or threading.Event()).is_set
    with opened_zip(archive, label) as zf:
        plan = plan_zip(zf, archive.stat().st_size, strip_top_level, limits, label)
        dest.mkdir(mode=0o700, parents=True)  # 0700 or tighter, whatever the umask
        root = dest.resolve()
        written = write_share(zf, plan.entries, root, limits.max_uncompressed_bytes, label, halted)
        written += finish(zf, plan, root, label, halted)
    return written
