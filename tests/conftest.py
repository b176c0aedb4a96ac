"""Fixtures shared by the test tiers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import short_tempdir
from tests.pip_wheels import build_wheelhouse

# Each session gets a private temp dir that must be empty at its end (see tests/tmpguard.py).
pytest_plugins = ["tests.tmpguard"]


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory (unix socket paths fit in it) for roots, sockets and logs, removed
    afterwards."""
    path = short_tempdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pip tests' offline wheelhouse, built once per session in pytest's own tmp_path
    folders (an atexit removal came after the temp-dir guard's check)."""
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))
