"""``agent.state.state_db.StateDB`` on a real SQLite file, read back through a second connection."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.errors import IndexUnavailable, StateDBError
from agent.state import index_file, write_behind
from agent.state.batch import Batch
from agent.state.holders import is_alive, lock_path
from agent.state.index import Found
from agent.state.schema import SCHEMA_VERSION
from agent.state.state_db import Loaded, StateDB, UriRow
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until

X = UriRow("working_dir", "https://h/x.zip", "working_dir-x", 10, 1_000)
Y = UriRow("py_modules", "https://h/y.zip#sha256=" + "ab" * 32, "py_modules-y", 20, 2_000)
NEVER = 3600.0  # a flush window that never closes within a test


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Run SQL on a fresh connection of its own: it sees exactly what is committed."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def last_used(path: Path) -> dict[str, int]:
    return {uri: used for uri, used in query(path, "SELECT uri, last_used_ms FROM uris")}


def live_envs(path: Path, holder: str) -> int:
    """The envs a holder's row says it holds (written behind)."""
    [(count,)] = query(path, f"SELECT live_envs FROM holders WHERE id = '{holder}'")
    return int(count)


def holders(path: Path) -> list[str]:
    return [holder for (holder,) in query(path, "SELECT id FROM holders ORDER BY id")]


async def installed(db: StateDB, row: UriRow) -> None:
    """An install as the store makes it: the claim, then the commit."""
    assert (await db.obtain((row.kind, row.uri), row.dir, take_ref=False)).found is Found.CLAIMED
    assert await db.record_install(row)


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
    """And the opener registers as a holder of the root (its row, its locked file), both gone
    at its clean stop."""
    path = tmp_path / "state.db"
    async with opened(path) as db:
        assert query(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)] == [(3,)]
        assert query(path, "PRAGMA journal_mode") == [("wal",)]
        columns = [row[1] for row in query(path, "PRAGMA table_info(uris)")]
        assert columns == ["kind", "uri", "dir", "size", "last_used_ms", "state", "holder"]
        tables = query(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")
        assert tables == [("changes",), ("holders",), ("refs",), ("sqlite_sequence",), ("uris",)]
        assert holders(path) == [db.holder_id]
        assert live_envs(path, db.holder_id) == 0
        assert is_alive(tmp_path, db.holder_id)
        first = db.holder_id
    assert holders(path) == []
    assert not lock_path(tmp_path, first).exists()
    async with opened(path) as db:  # a second open finds the schema and changes nothing
        assert await db.load() == Loaded([])
        assert db.holder_id != first, "a holder's id is fresh at every start"


# The schema version 1 as the agent wrote it (up to 2026-12), with rows of a stopped agent.
V1_SCHEMA = """
CREATE TABLE uris (
    kind TEXT NOT NULL, uri TEXT NOT NULL, dir TEXT NOT NULL, size INTEGER NOT NULL,
    digest TEXT, last_used_ms INTEGER NOT NULL, refcount INTEGER NOT NULL DEFAULT 0,
    installed_ms INTEGER NOT NULL, PRIMARY KEY (kind, uri)
);
CREATE TABLE envs (
    env_id TEXT PRIMARY KEY, canonical TEXT NOT NULL, keys TEXT NOT NULL,
    refcount INTEGER NOT NULL DEFAULT 0, created_ms INTEGER NOT NULL
);
INSERT INTO uris VALUES ('working_dir', 'https://h/x.zip', 'working_dir-x', 10, NULL, 1000, 2, 900);
INSERT INTO uris VALUES ('py_modules', 'https://h/y.zip#sha256={ab}', 'py_modules-y', 20, '{ab}',
                         2000, 0, 1900);
INSERT INTO envs VALUES ('e1', '{{}}', '[["working_dir", "https://h/x.zip"]]', 2, 950);
INSERT INTO envs VALUES ('e2', '{{}}', '[]', 1, 960);
PRAGMA user_version = 1;
PRAGMA journal_mode = WAL;
""".format(ab="ab" * 32)


async def test_a_version_1_file_opens_as_version_3_keeping_its_packages(tmp_path: Path) -> None:
    """The migration keeps every package's row (key, directory, size, last use) as ready,
    turns the env rows into the live envs of a holder standing for the agent that wrote the
    file (dead: the first pass reaps it, and its envs are the ones forgotten), and drops the
    columns and tables nothing reads."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(V1_SCHEMA)
    finally:
        conn.close()
    async with opened(path, flush_interval_s=NEVER) as db:
        assert query(path, "PRAGMA user_version") == [(3,)]
        assert await db.load() == Loaded([X, Y])
        assert query(path, "SELECT state, holder FROM uris") == [("ready", None)] * 2
        assert query(path, "SELECT name FROM sqlite_master WHERE name IN ('envs', 'live')") == []
        assert live_envs(path, "schema-v2") == 2
        await installed(db, UriRow("working_dir", "https://h/z.zip", "z", 1, 3_000))
    async with opened(path) as db:  # migrated once: the second open is a plain open
        loaded = await db.load()
        assert [row.dir for row in loaded.uris] == ["working_dir-x", "py_modules-y", "z"]
        assert holders(path) == sorted([db.holder_id, "schema-v2"])
        swept = await db.sweep(budget_bytes=10**9)
        assert swept.reaped.holders == [("schema-v2", 2)]
        assert swept.reaped.envs == 2
        assert swept.evicted == []
        assert holders(path) == [db.holder_id]
    assert query(path, "PRAGMA integrity_check") == [("ok",)]


async def test_a_new_file_logs_once_that_it_was_created_and_an_old_one_each_migration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh root logged "state.db migrated to schema version N" three times (1, 2, 3),
    which read like an upgrade: one line says it was created at the schema's version; a real
    upgrade (a version-1 file) logs each step, from and to; a plain open logs nothing."""
    caplog.set_level(logging.INFO, logger="agent.state.index_file")

    def said() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "agent.state.index_file"]
        caplog.clear()
        return lines

    (tmp_path / "new").mkdir()
    async with opened(tmp_path / "new" / "state.db"):
        pass
    assert said() == [f"state.db created at schema version {SCHEMA_VERSION}"]
    async with opened(tmp_path / "new" / "state.db"):
        pass
    assert said() == []
    (tmp_path / "old").mkdir()
    conn = sqlite3.connect(tmp_path / "old" / "state.db", isolation_level=None)
    try:
        conn.executescript(V1_SCHEMA)
    finally:
        conn.close()
    async with opened(tmp_path / "old" / "state.db"):
        pass
    assert said() == [
        "state.db migrated from schema version 1 to 2",
        "state.db migrated from schema version 2 to 3",
    ]


async def test_record_install_is_committed_when_it_returns(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        await installed(db, X)
        assert last_used(path) == {X.uri: X.last_used_ms}
        assert await db.load() == Loaded([X])


async def test_noted_changes_are_not_written_until_flush(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER) as db:
        await installed(db, X)
        db.notes.note_uri(X.kind, X.uri, 7_000)
        db.notes.note_live_envs(3)
        assert db.notes.pending() == 2
        assert last_used(path) == {X.uri: X.last_used_ms}, "a note was written before a flush"
        assert live_envs(path, db.holder_id) == 0
        await db.notes.flush()
        assert last_used(path) == {X.uri: 7_000}
        assert live_envs(path, db.holder_id) == 3
        assert db.notes.pending() == 0
        db.notes.note_uri(X.kind, X.uri, 7_500)
        db.notes.note_live_envs(4)
        await installed(db, Y)  # a durable write carries what was noted before it
        assert last_used(path) == {X.uri: 7_500, Y.uri: Y.last_used_ms}
        assert live_envs(path, db.holder_id) == 4


async def test_flush_every_changes_writes_the_batch_without_waiting_for_the_window(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=NEVER, flush_every=2) as db:
        await installed(db, X)
        await installed(db, Y)
        db.notes.note_uri(X.kind, X.uri, 8_000)
        assert last_used(path)[X.uri] == X.last_used_ms
        db.notes.note_uri(Y.kind, Y.uri, 9_000)
        await wait_until(
            lambda: last_used(path) == {X.uri: 8_000, Y.uri: 9_000},
            timeout_s=10,
            what="the batch of two written at once",
        )


async def test_notes_are_written_behind_when_the_window_closes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=0.05) as db:
        await installed(db, X)
        db.notes.note_uri(X.kind, X.uri, 8_000)
        db.notes.note_live_envs(1)
        await wait_until(
            lambda: last_used(path)[X.uri] == 8_000 and live_envs(path, db.holder_id) == 1,
            timeout_s=10,
            what="written behind",
        )


# A holder killed (os._exit: no clean stop) after it referenced X, claimed Z and noted 2 envs.
_DIES = """
import asyncio, os, sys
from agent.state.state_db import StateDB

async def main():
    db = StateDB(sys.argv[1], flush_interval_s=3600.0)
    await db.open()
    await db.obtain(("working_dir", "https://h/x.zip"), "working_dir-x", take_ref=True)
    await db.obtain(("working_dir", "https://h/z.zip"), "working_dir-z", take_ref=True)
    db.notes.note_live_envs(2)
    await db.notes.flush()
    for own in (db.staging, db.trash):
        (own / "left").mkdir(parents=True)
    print(db.holder_id, flush=True)
    os._exit(0)

asyncio.run(main())
"""


async def test_a_pass_reaps_a_dead_holders_references_claims_folders_and_counts_its_envs(
    tmp_path: Path,
) -> None:
    """What recovery forgets of a dead agent: its references (the package becomes unused), its
    install claims (another holder may install), its staging and trash, its lock file, and its
    envs (reported forgotten); a live holder's own rows are untouched."""
    path = tmp_path / "state.db"
    (tmp_path / "uris" / X.dir).mkdir(parents=True)
    async with opened(path, flush_interval_s=NEVER) as db:
        await installed(db, X)
        db.trash.mkdir(parents=True)  # as the store makes it: where a pass sets things aside
        dead = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _DIES, str(path)], capture_output=True,
            text=True, timeout=60, check=True,
        )  # fmt: skip
        gone = dead.stdout.strip()
        assert query(path, "SELECT holder, uri FROM refs") == [
            (gone, X.uri), (gone, "https://h/z.zip"),
        ]  # fmt: skip
        assert query(path, "SELECT holder FROM uris WHERE state = 'installing'") == [(gone,)]
        assert not is_alive(tmp_path, gone)
        assert lock_path(tmp_path, gone).exists()
        assert (tmp_path / "tmp" / gone / "left").is_dir()
        assert (tmp_path / "trash" / gone / "left").is_dir()

        swept = await db.sweep(budget_bytes=10**9)
        assert swept.reaped.holders == [(gone, 2)]
        assert sorted(p.parent for p in swept.reaped.aside) == [db.trash] * 2
        assert holders(path) == [db.holder_id]
        assert query(path, "SELECT * FROM refs") == []
        assert query(path, "SELECT uri, state FROM uris") == [(X.uri, "ready")]
        assert swept.full
        assert swept.changes == [((X.kind, X.uri), X)]
        assert (swept.ready_bytes, swept.unused_bytes) == (X.size, X.size)
        assert not lock_path(tmp_path, gone).exists()
        assert not (tmp_path / "tmp" / gone).exists()
        assert not (tmp_path / "trash" / gone).exists()

        obtained = await db.obtain(("working_dir", "https://h/z.zip"), "z", take_ref=True)
        assert obtained.found is Found.CLAIMED, "the dead holder's claim still blocks others"


async def test_close_writes_what_is_still_noted_then_drops_the_holders_rows(
    tmp_path: Path,
) -> None:
    """A clean stop: the last-use times noted are written; this holder's references, claims,
    row and lock file go (nothing of it is left for a reaper)."""
    path = tmp_path / "state.db"
    (tmp_path / "uris" / X.dir).mkdir(parents=True)
    async with opened(path, flush_interval_s=NEVER) as db:
        await installed(db, X)
        assert (await db.obtain((X.kind, X.uri), X.dir, take_ref=True)).found is Found.READY
        claimed = await db.obtain((Y.kind, Y.uri), Y.dir, take_ref=True)  # being installed
        assert claimed.found is Found.CLAIMED
        db.notes.note_uri(X.kind, X.uri, 9_000)
        db.notes.note_live_envs(5)
        me = db.holder_id
        assert query(path, "SELECT count(*) FROM refs") == [(2,)]
    assert last_used(path) == {X.uri: 9_000}, "Y's claim was left, or X's last use lost"
    assert query(path, "SELECT * FROM refs") == []
    assert holders(path) == []
    assert not lock_path(tmp_path, me).exists()


Op = tuple[str, int, int]  # ("use" | "live" | "unref" | "unclaim", key, value)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["use", "live", "unref", "unclaim"]),
        st.integers(0, 3),
        st.integers(0, 9),
    )
)


def noted(ops: list[Op]) -> Batch:
    batch = Batch()
    for op, key, value in ops:
        if op == "use":
            batch.use(("py_modules", f"u{key}"), value)
        elif op == "unref":
            batch.refs_dropped.add(("py_modules", f"u{key}"))
        elif op == "unclaim":
            batch.claims_dropped.add(("py_modules", f"u{key}"))
        else:
            batch.live_envs = value
    return batch


@given(OPS, st.integers(0, 40))
def test_a_failed_batch_followed_by_newer_notes_is_the_same_as_one_batch_of_them_all(
    ops: list[Op], split: int
) -> None:
    """What a failed write leaves is merged with what was noted since (``_Batch.then``): the
    result must be what noting everything, in order, into one batch gives."""
    merged = noted(ops[:split]).then(noted(ops[split:]))
    assert merged == noted(ops)


def plant_failing_writes(path: Path) -> None:
    """A real SQLite error for every transaction that writes a holder's live envs, while
    ``fail`` has a row: a trigger that aborts."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE fail (x)")
        conn.execute(
            "CREATE TRIGGER failing BEFORE UPDATE ON holders WHEN EXISTS (SELECT 1 FROM fail) "
            "BEGIN SELECT RAISE(ABORT, 'planted failure'); END"
        )
        conn.execute("INSERT INTO fail VALUES (1)")
    finally:
        conn.close()


async def test_a_failed_write_behind_keeps_its_changes_and_is_retried_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    caplog.set_level(logging.INFO, logger="agent.state.write_behind")
    async with opened(path, flush_interval_s=0.02) as db:
        await installed(db, X)
        await installed(db, Y)
        plant_failing_writes(path)
        db.notes.note_uri(X.kind, X.uri, 7_000)
        db.notes.note_uri(Y.kind, Y.uri, 7_100)
        db.notes.note_live_envs(3)
        await wait_until(
            lambda: "writing behind" in caplog.text and "failed" in caplog.text,
            what="the failure logged",
        )
        failed = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(failed) == 1, "a failure is logged once, not at every retry"
        assert failed[0].exc_info is not None, "logged without its traceback"
        assert "planted failure" in caplog.text
        db.notes.note_uri(X.kind, X.uri, 7_500)  # newer than the failed batch: it wins
        db.notes.note_uri(Y.kind, Y.uri, 7_600)
        await wait_until(lambda: db.notes.pending() == 0, what="the new notes taken by a retry")
        with pytest.raises(sqlite3.IntegrityError):
            await db.notes.flush()  # still failing, and after the retry's write (one thread)
        assert last_used(path) == {X.uri: X.last_used_ms, Y.uri: Y.last_used_ms}
        assert live_envs(path, db.holder_id) == 0
        with sqlite3.connect(path) as conn:  # the disk has room again, say
            conn.execute("DELETE FROM fail")
        conn.close()
        await wait_until(
            lambda: (
                last_used(path) == {X.uri: 7_500, Y.uri: 7_600}
                and live_envs(path, db.holder_id) == 3
            ),
            what="the kept changes written by a retry, with nothing noted since",
        )
        await wait_until(lambda: "works again" in caplog.text, what="the recovery logged")


async def test_a_bug_in_the_write_behind_task_is_logged_and_raised_by_close_after_writing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an SQLite error: the task dies loudly (traceback logged at once), the changes it
    held are written at close all the same, and close() raises what it died of."""
    path = tmp_path / "state.db"
    calls = []

    def buggy_once(name: str) -> None:  # the crash point only the write-behind task's writes pass
        calls.append(name)
        if calls.count("mid_count_batch") == 1:
            raise KeyError("planted bug")

    monkeypatch.setattr(write_behind, "crash_point", buggy_once)
    db = StateDB(path, flush_interval_s=0.02)
    await db.open()
    try:
        await installed(db, X)
        await installed(db, Y)
        db.notes.note_uri(X.kind, X.uri, 7_000)
        await wait_until(lambda: "died" in caplog.text, what="the task's death logged")
        [record] = [r for r in caplog.records if "died" in r.getMessage()]
        assert record.levelno == logging.CRITICAL
        assert record.exc_info is not None
        assert "planted bug" in caplog.text
        db.notes.note_uri(Y.kind, Y.uri, 8_000)  # noted after the task died
    finally:
        with pytest.raises(RuntimeError, match="died earlier") as raised:
            await db.close()
    assert isinstance(raised.value.__cause__, KeyError)
    assert last_used(path)[X.uri] == 7_000, "the dead task's batch was lost"
    assert last_used(path)[Y.uri] == 8_000, "a note made after the task died was lost"


async def test_a_miss_awaits_only_its_installs_transactions_and_a_miss_of_cached_packages_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real agent: every transaction a create awaits is counted (the write-behind task's and
    the passes' are not: they run in tasks of their own). A cold miss awaits two: the one
    taking its reference and its install claim, and the install's commit. The live envs are
    written behind all the same."""
    awaited: list[str] = []
    real_transact = StateDB.transact
    background = {"state-db flush", "sweep", "sweeps"}

    async def counting(self: StateDB, fn: Any, *rest: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        if task.get_name() not in background:
            awaited.append(task.get_name())
        return await real_transact(self, fn, *rest, **kwargs)

    monkeypatch.setattr(StateDB, "transact", counting)
    async with package_server() as pkgs, running_agent() as agent:
        url = pkgs.add("x.zip", workdir_zip({"x.txt": "x"}))
        await agent.settle()  # recovery's pass
        awaited.clear()
        await agent.create(env_json(working_dir=url))
        label = f"working_dir:{url}"
        # the obtain (its reference and its claim) runs in the task that runs the obtains
        # queued together, one transaction for them all; the commit in the install's own
        assert awaited == ["state-db obtain", f"commit {label}"], f"a cold miss awaited {awaited}"
        awaited.clear()
        await agent.create(env_json(working_dir=url, env_vars={"OTHER": "1"}))  # X cached
        assert awaited == [], "a miss of cached packages awaited the database"
        db = agent.root / "state.db"
        me = agent.service.store.db.holder_id
        await wait_until(lambda: live_envs(db, me) == 2, what="2 live envs written behind")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"garbage, not SQLite\n" * 100, "is unreadable (file is not a database)"),
        (4, f"has schema version 4, newer than this agent's {SCHEMA_VERSION}"),
        (99, f"has schema version 99, newer than this agent's {SCHEMA_VERSION}"),
    ],
)
async def test_an_unusable_file_raises_state_db_error_and_is_left_as_it_was(
    tmp_path: Path, content: bytes | int, expected: str
) -> None:
    path = tmp_path / "state.db"
    if isinstance(content, int):
        async with opened(path):
            pass
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA user_version={content}")
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


async def test_a_failed_install_commit_wakes_the_write_behind_task_to_retry_what_it_carried(
    tmp_path: Path,
) -> None:
    """An install's commit carries the changes noted before it; when it fails they are kept,
    and the write-behind task retries them without waiting for another note."""
    path = tmp_path / "state.db"
    async with opened(path, flush_interval_s=0.02) as db:
        await installed(db, X)
        await db.obtain((Y.kind, Y.uri), Y.dir, take_ref=False)  # Y's claim
        plant_failing_writes(path)
        gate = threading.Event()
        blocker = asyncio.ensure_future(db.run(lambda _conn: gate.wait(10)))  # the thread busy
        db.notes.note_live_envs(3)
        install = asyncio.ensure_future(db.record_install(Y))  # takes the note, queued
        await wait_until(lambda: not db.notes.noted, what="the write-behind task idle again")
        gate.set()
        await blocker
        with pytest.raises(IndexUnavailable, match="planted failure"):
            await install
        with sqlite3.connect(path) as conn:  # the disk has room again, say
            conn.execute("DELETE FROM fail")
        conn.close()
        await wait_until(
            lambda: live_envs(path, db.holder_id) == 3, what="the carried note written behind"
        )


async def test_close_never_drops_a_write_the_write_behind_task_has_queued(tmp_path: Path) -> None:
    """close() ends the write-behind task after its write instead of cancelling it: a write
    queued behind another statement on the thread, its batch already taken, is not lost."""
    path = tmp_path / "state.db"
    db = StateDB(path, flush_interval_s=0.01)
    await db.open()
    await installed(db, X)
    gate = threading.Event()
    blocker = asyncio.ensure_future(db.run(lambda _conn: gate.wait(10)))  # the thread busy
    db.notes.note_uri(X.kind, X.uri, 42_000)
    await wait_until(lambda: db.notes.pending() == 0, what="the write-behind task took the batch")
    closing = asyncio.ensure_future(db.close())
    for _ in range(10):  # let close() begin and act on the task before the thread is free
        await asyncio.sleep(0)
    gate.set()
    await blocker
    await closing
    assert last_used(path) == {X.uri: 42_000}


async def test_obtains_asked_while_one_is_in_flight_run_together_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five creates' obtains asked at once (the thread busy meanwhile) take one transaction,
    each answered as if alone: claims of packages nobody had, the reference of one ready; the
    next obtain, asked alone, takes its own."""
    transactions: list[str] = []
    real_transact = StateDB.transact

    async def counting(self: StateDB, fn: Any, *rest: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        transactions.append(task.get_name() if task else "")
        return await real_transact(self, fn, *rest, **kwargs)

    path = tmp_path / "state.db"
    async with opened(path) as db:
        await installed(db, X)
        (tmp_path / "uris" / X.dir).mkdir(parents=True)
        monkeypatch.setattr(StateDB, "transact", counting)
        gate = threading.Event()
        blocker = asyncio.ensure_future(db.run(lambda _conn: gate.wait(10)))  # the thread busy
        keys = [(X.kind, X.uri), *((Y.kind, f"https://h/{n}.zip") for n in range(4))]
        asked = [asyncio.ensure_future(db.obtain(k, f"dir-{i}", take_ref=True)) for i, k in
                 enumerate(keys)]  # fmt: skip
        await asyncio.sleep(0.05)
        gate.set()
        await blocker
        got = await asyncio.wait_for(asyncio.gather(*asked), 10)
        assert [g.found for g in got] == [Found.READY] + [Found.CLAIMED] * 4
        assert transactions == ["state-db obtain"]
        with sqlite3.connect(path) as conn:
            refs = {uri for (uri,) in conn.execute("SELECT uri FROM refs")}
        conn.close()
        assert refs == {uri for _, uri in keys}
        assert (await db.obtain((Y.kind, Y.uri), Y.dir, take_ref=True)).found is Found.CLAIMED
        assert len(transactions) == 2


async def test_a_drop_a_failed_transaction_was_to_defer_is_noted_again_with_its_row_kept(
    tmp_path: Path,
) -> None:
    """Alone on the root, a pass takes a dropped reference to defer it, and fails: rolled back,
    the row is there and the drop is noted again (cancellable, as the reference is in the
    index); it is not written later behind anyone's back."""
    path = tmp_path / "state.db"
    (tmp_path / "uris" / X.dir).mkdir(parents=True)
    async with opened(path, flush_interval_s=NEVER) as db:
        await installed(db, X)
        assert (await db.obtain((X.kind, X.uri), X.dir, take_ref=True)).found is Found.READY
        plant_failing_writes(path)
        db.notes.note_live_envs(1)  # the write that carries it fails
        db.notes.note_ref_dropped(X.kind, X.uri)
        with pytest.raises(IndexUnavailable, match="planted failure"):
            await db.sweep(budget_bytes=10**9)
        assert len(db.notes.deferred()) == 0
        assert query(path, "SELECT uri FROM refs") == [(X.uri,)]
        assert db.notes.keep_ref(X.kind, X.uri), "the drop was lost, or is written anyway"
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM fail")
        conn.close()
        await db.notes.flush()
        assert query(path, "SELECT uri FROM refs") == [(X.uri,)], "a reference kept was dropped"
        assert live_envs(path, db.holder_id) == 1
        db.notes.note_ref_dropped(X.kind, X.uri)
        await db.notes.flush()
        assert query(path, "SELECT uri FROM refs") == []


# -- many agents opening one fresh shared root ---------------------------------------------------


async def test_eight_agents_opening_one_fresh_root_at_once_all_open_it(tmp_path: Path) -> None:
    """Found by the shared-root bench under load: an opener read the schema version (0) and
    then the tables another opener's migration had just made, apart, and refused the file as
    "an SQLite database this agent did not write"; another had the switch to WAL answered
    BUSY at once by a peer's switch. Each of 20 rounds: eight openers, all open it."""
    for r in range(20):
        path = tmp_path / f"root-{r}" / "state.db"
        path.parent.mkdir()
        dbs = [StateDB(path) for _ in range(8)]
        outcomes = await asyncio.gather(*(db.open() for db in dbs), return_exceptions=True)
        for db, outcome in zip(dbs, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                await db.close()
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert not failed, f"round {r}: {failed[0]!r}"


async def test_a_root_locked_past_the_busy_timeout_is_not_called_unreadable(
    tmp_path: Path,
) -> None:
    """A file another agent keeps locked is not damaged: the refusal says so and to start
    again, never to --reset-state (which would throw away every holder's index)."""
    path = tmp_path / "root" / "state.db"
    path.parent.mkdir()
    async with opened(path):
        pass  # the file made, in WAL mode
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")  # WAL mode: readers wait only on an exclusive lock
        db = StateDB(path, busy_timeout_s=0.2)
        with pytest.raises(StateDBError) as info:
            await db.open()
    finally:
        other.close()
    message = info.value.message
    assert "stayed locked by another agent of the root for 0.2s" in message, message
    assert "--reset-state" not in message


class _BusySwitch:
    """Answers ``PRAGMA journal_mode=WAL`` with BUSY ``busy`` times (as SQLite does at once
    while a peer switches the same fresh file), or with ``error``, then switches."""

    def __init__(self, busy: int, error: sqlite3.Error | None = None) -> None:
        self.busy, self.error, self.mode, self.tries = busy, error, "delete", 0

    def execute(self, sql: str) -> Any:
        if sql == "PRAGMA journal_mode=WAL":
            self.tries += 1
            if self.error is not None:
                raise self.error
            if self.tries <= self.busy:
                exc = sqlite3.OperationalError("database is locked")
                exc.sqlite_errorcode = 5
                raise exc
            self.mode = "wal"
        return self

    def fetchone(self) -> tuple[str]:
        return (self.mode,)


def test_the_switch_to_wal_is_retried_on_busy_only_and_only_until_the_busy_timeout() -> None:
    switch = _BusySwitch(busy=3)
    index_file.set_wal(switch, 5.0)  # type: ignore[arg-type]
    assert (switch.mode, switch.tries) == ("wal", 4)
    damaged = _BusySwitch(busy=0, error=sqlite3.DatabaseError("file is not a database"))
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        index_file.set_wal(damaged, 5.0)  # type: ignore[arg-type]
    assert damaged.tries == 1
    stuck = _BusySwitch(busy=10**9)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        index_file.set_wal(stuck, 0.05)  # type: ignore[arg-type]
    assert 2 <= stuck.tries < 1000
