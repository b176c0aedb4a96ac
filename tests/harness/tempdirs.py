"""Short temp dirs: a unix socket path (107 bytes at most) must fit inside them."""

from __future__ import annotations

import tempfile
from pathlib import Path


def short_tempdir() -> Path:
    """A new directory in the temp dir (under test, the session's private one, whose path is
    kept short enough for a unix socket inside it); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix="rtenv-"))
