"""Whole-process tests of an unusable ``state.db``: a clear error, exit 2, the file untouched;
``--reset-state`` moves it aside (kept) and rebuilds from an empty cache.

Each test builds a real root first: a clean agent installs X (working_dir) and Y (py_modules)
from a package server on 127.0.0.1, releases them and stops on SIGTERM.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.state.schema import SCHEMA_VERSION
from tests.harness.agent_process import refused
from tests.harness.crashing_agent import (
    ZIPS,
    agent_process,
    check_recovered,
    create_each,
    env_of,
    leftovers,
    listing,
    read_index,
)
from tests.harness.package_server import PackageServer, package_server
from tests.harness.polling import wait_until

RESET_NAME = re.compile(r"state\.db\.reset-\d{8}T\d{6}")


async def build_root(root: Path, log: Path, pkgs: PackageServer) -> None:
    """A clean agent installs X and Y, releases both (cached, unused), and stops on SIGTERM."""
    for name, body in ZIPS.items():
        pkgs.add(name, body)
    async with agent_process(root, log) as agent:
        for name in ZIPS:
            reply = await agent.create(env_of(pkgs, name))
            assert await agent.delete(reply.runtime_env_id) == 0
        await agent.sigterm()
    assert len(listing(root / "uris")) == 2
    assert not (root / "state.db-wal").exists(), "a clean stop checkpoints the WAL"


# -- ways to break a real state.db -----------------------------------------------------------


def garbage(db: Path) -> None:
    db.write_bytes(b"this is not an SQLite database\n" * 200)


def header_only(db: Path) -> None:
    db.write_bytes(db.read_bytes()[:100])


def first_page_only(db: Path) -> None:
    data = db.read_bytes()
    assert len(data) > 4096, len(data)
    db.write_bytes(data[:4096])


def half(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def bad_magic(db: Path) -> None:
    data = db.read_bytes()
    assert data.startswith(b"SQLite format 3\x00")
    db.write_bytes(b"SQLite format 9\x00" + data[16:])


def newer_schema(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA user_version=99")
    finally:
        conn.close()


BREAKERS: dict[str, Callable[[Path], None]] = {
    "garbage": garbage,
    "header_only": header_only,
    "first_page_only": first_page_only,
    "half": half,
    "bad_magic": bad_magic,
    "newer_schema": newer_schema,
}
MESSAGES = {"newer_schema": f"schema version 99, newer than this agent's {SCHEMA_VERSION}"}


@pytest.mark.parametrize("how", sorted(BREAKERS))
async def test_unusable_state_db_exits_2_naming_it_and_reset_state_and_is_left_unchanged(
    base: Path, how: str
) -> None:
    root = base / "root"
    async with package_server() as pkgs:
        await build_root(root, base / "build.log", pkgs)
    db = root.resolve() / "state.db"
    BREAKERS[how](db)
    broken, packages = db.read_bytes(), listing(root / "uris")

    started = time.monotonic()
    code, err = await refused(base / "refused.log", "--root", str(root))
    assert code == 2, err
    assert time.monotonic() - started < 15, "it took too long to refuse"
    assert f"rtenv-agent: {db} " in err, err
    assert "--reset-state" in err, err
    assert MESSAGES.get(how, "is unreadable") in err, err
    assert db.read_bytes() == broken, "the unusable state.db was changed"
    assert listing(root / "uris") == packages, "packages were touched by a refused start"


@pytest.mark.parametrize("how", sorted(BREAKERS))
async def test_reset_state_keeps_the_unusable_db_aside_and_rebuilds_from_an_empty_cache(
    base: Path, how: str
) -> None:
    root = base / "root"
    async with package_server() as pkgs:
        await build_root(root, base / "build.log", pkgs)
        db = root / "state.db"
        BREAKERS[how](db)
        broken = db.read_bytes()

        async with agent_process(root, base / "reset.log", "--reset-state") as agent:
            aside = sorted(p.name for p in root.iterdir() if p.name.startswith("state.db.reset"))
            assert len(aside) == 1, aside
            assert RESET_NAME.fullmatch(aside[0]), aside
            assert (root / aside[0]).read_bytes() == broken, "the file set aside is not the old one"
            r = await check_recovered(agent, root, pkgs, frozenset())
            assert (r.orphans_deleted, r.rows_kept, r.rows_dropped) == (2, 0, 0), r
            assert listing(root / "uris") == [], "the packages of the old index were kept"
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
            finally:
                conn.close()
            await create_each(agent, root, pkgs, set(ZIPS), set(ZIPS))


async def test_state_db_that_lost_its_wal_recovers_to_its_last_checkpoint(base: Path) -> None:
    """SQLite still reads a state.db whose WAL is gone: the agent starts from the older index,
    deletes the package that index does not vouch for and downloads it again."""
    root = base / "root"
    async with package_server() as pkgs:
        await build_root(root, base / "build.log", pkgs)  # X and Y: checkpointed
        pkgs.add("z.zip", ZIPS["y.zip"])
        async with agent_process(root, base / "killed.log") as agent:
            await agent.create(env_of(pkgs, "z.zip"))  # Z's row: in the WAL only
            agent.proc.send_signal(signal.SIGKILL)
            assert await agent.died() == -signal.SIGKILL
        assert (root / "state.db-wal").stat().st_size > 0
        for suffix in ("-wal", "-shm"):
            (root / f"state.db{suffix}").unlink()

        async with agent_process(root, base / "restart.log") as agent:
            r = await check_recovered(agent, root, pkgs, frozenset(ZIPS))
            assert (r.rows_kept, r.rows_dropped, r.orphans_deleted) == (2, 0, 1), r
            assert r.envs_forgotten == 0, r
            gets = pkgs.gets["z.zip"]
            await agent.create(env_of(pkgs, "z.zip"))
            assert pkgs.gets["z.zip"] == gets + 1
            await wait_until(lambda: not leftovers(root), timeout_s=10, what="leftovers deleted")
            assert len(read_index(root).uris) == len(listing(root / "uris")) == 3


async def test_reset_state_never_overwrites_the_file_an_earlier_reset_kept(base: Path) -> None:
    """Two resets in the same second (a supervisor restarting with --reset-state) must keep
    both old databases: a reset-<stamp> name already taken is never replaced."""
    root = base / "root"
    async with package_server() as pkgs:
        await build_root(root, base / "build.log", pkgs)
    garbage(root / "state.db")
    now = int(time.time())
    earlier: dict[Path, bytes] = {}
    for second in range(now - 1, now + 60):  # whatever second the agent stamps, it is taken
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(second))
        path = root / f"state.db.reset-{stamp}"
        earlier[path] = f"kept by an earlier reset at {stamp}".encode()
        path.write_bytes(earlier[path])
    broken = (root / "state.db").read_bytes()

    async with agent_process(root, base / "reset.log", "--reset-state") as agent:
        assert agent.address, agent.log_text()
        for path, data in earlier.items():
            assert path.read_bytes() == data, f"{path.name} was overwritten by the reset"
        kept = [p for p in root.iterdir() if p.name.startswith("state.db.reset")]
        assert any(p.read_bytes() == broken for p in kept), "the reset lost the unusable file"


async def test_foreign_sqlite_file_at_schema_0_exits_2_and_is_left_unchanged(base: Path) -> None:
    """A valid SQLite file that is not the agent's (schema 0, a conflicting ``uris`` table) is
    refused like an unreadable one: exit 2, no traceback, the way out named, the file untouched."""
    root = base / "root"
    root.mkdir()
    db = root.resolve() / "state.db"
    conn = sqlite3.connect(db)
    try:
        conn.execute("CREATE TABLE uris (something TEXT)")
        conn.execute("INSERT INTO uris VALUES ('not the agent''s')")
        conn.commit()
    finally:
        conn.close()
    before = db.read_bytes()

    code, err = await refused(base / "refused.log", "--root", str(root))
    assert code == 2, err
    assert str(db) in err, err
    assert "--reset-state" in err, err
    assert db.read_bytes() == before, "the agent changed a database it could not use"
