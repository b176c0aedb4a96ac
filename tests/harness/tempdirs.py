"""Short temp dirs: a unix socket path (107 bytes at most) must fit inside them."""

from __future__ import annotations

import tempfile
from pathlib import Path


def short_tempdir() -> Path:
    """A new directory in the temp dir (under test, the session's private one, whose path is
    kept short enough for a unix socket inside it); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix="rtenv-"))


def ray_tempdir() -> Path:
    """A new directory directly under /tmp (``rs-*``), for a test that runs Ray nodes inside it
    (their ``RAY_TMPDIR``): Ray's socket paths under it (``<RAY_TMPDIR>/ray/session_<date>_<pid>/
    sockets/plasma_store``, ~70 bytes more) must fit in 107 bytes, which the session's private
    temp dir does not leave room for when CI's own is long. The caller removes it."""
    return Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
