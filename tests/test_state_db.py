"""``agent.state_db.StateDB`` on a real SQLite file, read back through a second connection."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.core.errors import StateDBError
from agent.state.state_db import SCHEMA_VERSION, EnvRow, StateDB, UriRow
from tests.helpers import wait_until

X = UriRow("working_dir", "https://h/x.zip", "working_dir-x", 10, None, 1_000)
Y = UriRow("py_modules", "https://h/y.zip", "py_modules-y", 20, "ab" * 32, 2_000)
NEVER = 3600.0  # a flush window that never closes within a test


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Run SQL on a fresh connection of its own: it sees exactly what is committed."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def counts(path: Path) -> dict[str, tuple[int, int]]:
    rows = query(path, "SELECT uri, refcount, last_used_ms FROM uris")
    return {uri: (count, used) for uri, count, used in rows}


@asynccontextmanager
async def opened(path: Path, **kwargs: Any) -> AsyncIterator[StateDB]:
    db = StateDB(path, **kwargs)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


async def test_a_new_file_is_migrated_from_version_0_to_the_schema_in_wal_mode(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with opened(path):
        assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(1,)]
        assert query(path, "PRAGMA journal_mode") == [("wal",)]
        columns = [row[1] for row in query(path, "PRAGMA table_info(uris)")]
        assert columns == [
            "kind", "uri", "dir", "size", "digest", "last_used_ms", "refcount", "installed_ms"
        ]  # fmt: skip
        assert query(path, "SELECT count(*) FROM envs") == [(0,)]
    async with opened(path) as db:  # a second open finds the schema and changes nothing
        assert await db.load() == ([], [])


async def test_record_install_and_record_env_are_committed_when_they_return(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        await db.record_install(X)
        assert counts(path) == {X.uri: (0, X.last_used_ms)}
        await db.record_env(EnvRow("e1", "{}", (("working_dir", X.uri),), 5), refcount=1)
        assert query(path, "SELECT env_id, refcount FROM envs") == [("e1", 1)]
        uris, envs = await db.load()
        assert uris == [X]
        assert [(e.env_id, e.keys) for e in envs] == [("e1", (("working_dir", X.uri),))]


async def test_noted_counts_are_not_written_until_flush(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        await db.record_install(X)
        db.note_uri(X.kind, X.uri, 3, 7_000)
        assert db.pending() == 1
        assert counts(path) == {X.uri: (0, X.last_used_ms)}, "a note was written before a flush"
        await db.flush()
        assert counts(path) == {X.uri: (3, 7_000)}
        assert db.pending() == 0
        db.note_uri(X.kind, X.uri, 4, 7_500)
        await db.record_install(Y)  # a durable write carries what was noted before it
        assert counts(path) == {X.uri: (4, 7_500), Y.uri: (0, Y.last_used_ms)}


async def test_flush_every_changes_writes_the_batch_without_waiting_for_the_window(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER, flush_every=2) as db:
        await db.record_install(X)
        await db.record_install(Y)
        db.note_uri(X.kind, X.uri, 1, 8_000)
        assert counts(path)[X.uri] == (0, X.last_used_ms)
        db.note_uri(Y.kind, Y.uri, 2, 9_000)
        await wait_until(
            lambda: counts(path) == {X.uri: (1, 8_000), Y.uri: (2, 9_000)},
            timeout_s=10,
            what="the batch of two written at once",
        )


async def test_notes_are_written_behind_when_the_window_closes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=0.05) as db:
        await db.record_install(X)
        db.note_uri(X.kind, X.uri, 4, 8_000)
        await wait_until(
            lambda: counts(path)[X.uri] == (4, 8_000), timeout_s=10, what="written behind"
        )


async def test_a_drop_noted_before_a_later_install_of_the_key_never_deletes_its_new_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    again = UriRow(X.kind, X.uri, "working_dir-x2", 11, None, 5_000)
    async with opened(path, flush_interval_s=NEVER) as db:
        await db.record_install(X)
        db.note_uri_dropped(X.kind, X.uri)  # evicted, written behind...
        await db.record_install(again)  # ...and installed again before any flush
        assert query(path, "SELECT dir FROM uris") == [("working_dir-x2",)]
        db.note_uri_dropped(X.kind, X.uri)
        await asyncio.gather(db.flush(), db.record_install(again))  # a flush in flight
        assert query(path, "SELECT dir FROM uris") == [("working_dir-x2",)]
        db.note_uri_dropped(Y.kind, Y.uri)
        db.note_uri_dropped(X.kind, X.uri)
        db.note_uri(X.kind, X.uri, 1, 6_000)  # installed again meanwhile: the drop is void
        await db.flush()
        assert query(path, "SELECT dir, size, refcount FROM uris") == [("working_dir-x2", 11, 1)]


async def test_reset_after_recovery_drops_rows_zeroes_counts_and_forgets_envs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        for row in (X, Y):
            await db.record_install(row)
        await db.record_env(EnvRow("e1", "{}", ((X.kind, X.uri),), 5), refcount=2)
        db.note_uri(X.kind, X.uri, 2, 8_000)
        await db.flush()
        await db.reset_after_recovery([(Y.kind, Y.uri)])
        assert counts(path) == {X.uri: (0, 8_000)}
        assert query(path, "SELECT count(*) FROM envs") == [(0,)]


async def test_close_writes_what_is_still_noted(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        await db.record_install(X)
        db.note_uri(X.kind, X.uri, 5, 9_000)
    assert counts(path) == {X.uri: (5, 9_000)}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"garbage, not SQLite\n" * 100, "is unreadable (file is not a database)"),
        (None, f"has schema version 99, newer than this agent's {SCHEMA_VERSION}"),
    ],
)
async def test_an_unusable_file_raises_state_db_error_and_is_left_as_it_was(
    tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "state.db"
    if content is None:
        async with opened(path):
            pass
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version=99")
        conn.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    db = StateDB(path)
    with pytest.raises(StateDBError) as raised:
        await db.open()
    await db.close()
    assert expected in raised.value.message
    assert "--reset-state" in raised.value.message
    assert path.read_bytes() == before
