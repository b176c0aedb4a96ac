"""The allowed roots (the allow-file-root setting): where local packages may come from.

One check for every reader of local paths: ``file://`` packages
(``agent.install.fetch.file_source``, the fetcher's origin check) and the places pip reads from
(``agent.core.pip_spec``). Pure but for ``FileRoots.of``, which resolves the roots' links (a few
system calls, once).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FileRoots:
    """The allow-file-root folders, as given (normalized) and as the kernel names them (links
    resolved). Both the name a URI gives and the file opened must lie under one. None: any."""

    given: tuple[str, ...] = ()
    real: tuple[str, ...] = ()

    @classmethod
    def of(cls, roots: Sequence[str]) -> FileRoots:
        """Resolve the roots once, at start (a few system calls). An empty one names none."""
        named = [root for root in roots if root]
        return cls(
            tuple(os.path.normpath(os.path.abspath(root)) for root in named),
            tuple(os.path.realpath(root) for root in named),
        )

    def __bool__(self) -> bool:
        return bool(self.given)

    def allow_name(self, path: str) -> bool:
        """The pure check on a URI's path: no file is looked at (the store repeats it on every
        create naming a cached package). A root configured through a link holds its files."""
        return not self or within_roots(os.path.normpath(path), self.given + self.real)

    def allow_opened(self, real_path: str) -> bool:
        """The check on where a file really is (an opened file's, or a ``realpath``)."""
        return not self or within_roots(real_path, self.real)

    def __str__(self) -> str:
        return ", ".join(self.given)


NO_ROOTS = FileRoots()  # the setting unset: every path may be read


def within_roots(path: str, roots: Sequence[str]) -> bool:
    """``path`` (absolute, normalized) is one of ``roots`` or lies under one. ``/`` holds all."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
