"""Holders of a root's shared index as the index sees them: open one, install through it, let it die
(kill -9), read its rows; a lock file a holder cannot open."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agent.state.index import Found
from agent.state.state_db import StateDB, UriRow

KEY = ("py_modules", "http://127.0.0.1:1/a.zip")


async def holder(root: Path) -> StateDB:
    db = StateDB(root / "state.db", root=root)
    await db.open()
    for own in (db.staging, db.trash):
        own.mkdir(parents=True, exist_ok=True)
    return db


def die(db: StateDB) -> None:
    """kill -9 as the index sees it: the lock goes with the process, the rows stay."""
    db.lose_lock()


async def install(db: StateDB, key: tuple[str, str], size: int = 100, used: int = 1) -> Path:
    """Claim, place a folder, commit: what an install does in the index."""
    got = await db.obtain(key, f"dir-{key[1][-5]}", take_ref=True)
    assert got.found is Found.CLAIMED, got
    folder = db.root / "uris" / f"dir-{key[1][-5]}"
    folder.mkdir()
    await db.record_install(UriRow(key[0], key[1], folder.name, size, used))
    return folder


def rows(root: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(root / "state.db") as conn:
        return conn.execute(sql, args).fetchall()


def make_untestable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make a lock file this user cannot open: mode 000, and, as root (whom modes do not stop),
    holders' open of that path refused as the kernel refuses another user's 0600 file."""
    path.chmod(0)
    if os.geteuid() != 0:
        return
    real_open = os.open

    def refusing_open(name: object, flags: int, *args: int, **kwargs: object) -> int:
        if str(name) == str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
        return real_open(name, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("agent.state.holders.os.open", refusing_open)
