"""``rtenv-agent info --root``: the root's shared index, read from its state.db by a process of
its own while real agents (``rtenv-agent serve`` processes, each on its own socket) serve the
root, download from a real package server on 127.0.0.1, die by SIGKILL and reap each other."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.launcher import main as cli
from agent.ops.root_view import HolderView, PackageView, RootView, format_root, read_root
from agent.state.holders import lock_path
from agent.state.schema import SCHEMA_VERSION
from agent.state.state_db import StateDB
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import (
    NO_PROXY,
    STOP_S,
    Served,
    run_cli,
    serving,
    wait_health_serving,
)
from tests.harness.index_holders import KEY, holder, install, make_untestable
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.polling import wait_until

Json = dict[str, Any]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


async def info_json(root: Path) -> Json:
    code, out, err = await run_cli("info", "--root", str(root), "--json")
    assert code == 0, err
    doc: Json = json.loads(out)
    return doc


async def info_text(root: Path) -> str:
    code, out, err = await run_cli("info", "--root", str(root))
    assert code == 0, err
    return out


async def wait_info(root: Path, holds: Any, what: str, timeout_s: float = 30.0) -> Json:
    """Run info --root until its JSON satisfies ``holds``; the last JSON (fail at the deadline)."""
    last: Json = {}

    async def check() -> bool:
        nonlocal last
        last = await info_json(root)
        return bool(holds(last))

    try:
        await wait_until(check, timeout_s=timeout_s, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last info: {json.dumps(last, indent=1)}") from None
    return last


@dataclass
class Client:
    stub: agent_pb2_grpc.RuntimeEnvAgentStub

    async def create(self, serialized: str) -> str:
        reply = await self.stub.CreateRuntimeEnv(
            agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=serialized), timeout=30
        )
        env_id: str = reply.runtime_env_id
        return env_id


@asynccontextmanager
async def agent(base: Path, name: str, root: Path) -> AsyncIterator[tuple[Served, Client]]:
    """``rtenv-agent serve --root ROOT --address unix:BASE/NAME.sock``, healthy, and a client."""
    address = f"unix:{base / name}.sock"
    async with serving(base / f"{name}.log", "--root", str(root), "--address", address) as a:
        await wait_health_serving(a.address)
        async with grpc.aio.insecure_channel(a.address, options=NO_PROXY) as channel:
            yield a, Client(agent_pb2_grpc.RuntimeEnvAgentStub(channel))  # type: ignore[no-untyped-call]


def serve_packages(pkgs: PackageServer, *names: str) -> dict[str, str]:
    """Each name served as a working_dir zip of its own content: name -> URL."""
    return {n: pkgs.add(f"{n}.zip", workdir_zip({"f.txt": n * 1000}, top=n)) for n in names}


def by_pid(doc: Json) -> dict[int, Json]:
    return {h["pid"]: h for h in doc["holders"]}


def by_uri(doc: Json) -> dict[str, Json]:
    return {p["uri"]: p for p in doc["packages"]}


def _files(root: Path) -> dict[str, bytes | None]:
    """The root's top level: each file's bytes (None for a folder)."""
    return {p.name: None if p.is_dir() else p.read_bytes() for p in sorted(root.iterdir())}


def envs_noted(pids: dict[int, int]) -> Any:
    """info's JSON holds exactly these holders (by pid), with these live envs (written behind)."""
    return lambda doc: {pid: h["live_envs"] for pid, h in by_pid(doc).items()} == pids


# -- the shared index, shown --------------------------------------------------------------------


async def test_both_agents_of_a_root_are_shown_alive_with_their_references_and_envs(
    base: Path,
) -> None:
    """Two agents on one root, one env each, sharing one package: each holder alive with its
    pid, its 2 references and its env; the shared package referenced by 2 live holders, each
    other by 1; nothing unused. A package whose download is held is shown installing, by the
    agent whose claim it is."""
    root = base / "root"
    async with package_server() as pkgs:
        url = serve_packages(pkgs, "a", "b", "shared", "held")
        gate = pkgs.hold("held.zip")
        async with agent(base, "one", root) as (one, c1), agent(base, "two", root) as (two, c2):
            await c1.create(env_json(url["a"], py_modules=[url["shared"]]))
            await c2.create(env_json(url["b"], py_modules=[url["shared"]]))
            pid1, pid2 = one.proc.pid, two.proc.pid
            doc = await wait_info(root, envs_noted({pid1: 1, pid2: 1}), "both envs noted")
            holders = by_pid(doc)
            for pid in (pid1, pid2):
                h = holders[pid]
                assert (h["alive"], h["references"], h["live_envs"]) == (True, 2, 1), h
                assert len(h["id"]) == 32, h
                assert h["started_ms"] > 0, h
            packages = by_uri(doc)
            assert {u: p["references"] for u, p in packages.items()} == {
                url["a"]: 1, url["b"]: 1, url["shared"]: 2,
            }  # fmt: skip
            assert all(p["state"] == "ready" and p["size_bytes"] > 0 for p in packages.values())
            total = sum(p["size_bytes"] for p in packages.values())
            assert doc["summary"] == {
                "holders_alive": 2, "holders_dead": 0, "holders_unknown": 0, "packages": 3,
                "bytes": total, "unused_bytes": 0,
            }  # fmt: skip
            assert sum(pkgs.gets.values()) == 3, "the shared package was downloaded once"

            text = await info_text(root)
            lines = text.splitlines()
            assert lines[0].split() == ["HOLDER", "PID", "STATE", "REFS", "ENVS", "STARTED"]
            for pid in (pid1, pid2):
                [line] = [x for x in lines if x.startswith(holders[pid]["id"])]
                assert line.split()[1:5] == [str(pid), "alive", "2", "1"], text
            [shared] = [x for x in lines if x.endswith(url["shared"])]
            assert shared.split()[:3] == ["py_modules", "2", "ready"], text
            assert shared.split()[-2] == packages[url["shared"]]["dir"], text
            assert lines[-1].startswith("holders: 2 alive, 0 dead; 3 packages, "), text
            assert lines[-1].endswith("; unused 0 B (ready, no live holder references them)")

            creating = asyncio.create_task(c1.create(env_json(url["held"])))
            try:
                await asyncio.wait_for(pkgs.requested("held.zip").wait(), 30)
                doc = await info_json(root)
                held = by_uri(doc)[url["held"]]
                assert held["state"] == "installing", held
                assert held["installer"] == holders[pid1]["id"], held
                text = await info_text(root)
                [line] = [x for x in text.splitlines() if x.startswith(" " * 64)]
                assert line.strip() == f"installing by holder {holders[pid1]['id']} (alive)"
                [row] = [x for x in text.splitlines() if x.endswith(url["held"])]
                assert row.split()[2:4] == ["installing", "-"], text  # no size, and
                assert row.split()[-2] == "-", text  # no folder yet
            finally:
                gate.set()
                await asyncio.wait_for(creating, 30)


async def test_info_root_and_info_address_name_a_package_alike_by_uri_folder_and_state(
    base: Path,
) -> None:
    """The same package was ``ready`` in info --root (any installed row) and ``unused`` in info
    --address, and shown by its URI alone while its folder has another hash: both views now say
    ready (in use) or unused (cached, evictable) alike, in text and JSON, and show the folder
    under uris/ beside the URI."""
    root = base / "root"
    async with package_server() as pkgs:
        url = serve_packages(pkgs, "used", "released")
        async with agent(base, "one", root) as (one, c1):
            await c1.create(env_json(url["used"]))
            released = await c1.create(env_json(url["released"]))
            await c1.stub.DeleteRuntimeEnv(
                agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=released), timeout=30
            )
            want = {url["used"]: "ready", url["released"]: "unused"}
            # a lone agent writes its released reference behind, within about a second
            doc = await wait_info(
                root,
                lambda d: {p["uri"]: p["state"] for p in d["packages"]} == want,
                "the released reference written behind",
            )
            folders = {p["uri"]: p["dir"] for p in doc["packages"]}
            assert all((root / "uris" / f).is_dir() for f in folders.values()), folders
            assert doc["summary"]["unused_bytes"] == by_uri(doc)[url["released"]]["size_bytes"]
            code, out, err = await run_cli("info", "--address", one.address, "--json")
            assert code == 0, err
            uris = {u["uri"]: u for u in json.loads(out)["uris"]}
            assert {u: p["state"] for u, p in uris.items()} == want
            assert {u: Path(p["local_path"]).name for u, p in uris.items()} == folders
            root_text = await info_text(root)
            code, address_text, err = await run_cli("info", "--address", one.address)
            assert code == 0, err
            for text in (root_text, address_text):
                lines = text.splitlines()
                table = lines[lines.index(next(x for x in lines if x.startswith("KIND"))) :]
                assert table[0].split()[-2:] == ["FOLDER", "URI"], text
                for uri, state in want.items():
                    [line] = [x for x in table if x.endswith(uri)]
                    assert line.split()[2] == state, text
                    assert line.split()[-2] == folders[uri], text


async def test_an_agent_killed_is_shown_dead_then_gone_after_a_pass_of_the_survivor(
    base: Path,
) -> None:
    """SIGKILL one of two agents while the other is stopped (SIGSTOP: no pass of it can reap
    anything meanwhile): info shows it dead, its references no longer counted (its own package
    unused); once the survivor runs a pass (after an install), it is gone from the index."""
    root = base / "root"
    async with package_server() as pkgs:
        url = serve_packages(pkgs, "a", "b", "shared", "later")
        async with agent(base, "one", root) as (one, c1), agent(base, "two", root) as (two, c2):
            await c1.create(env_json(url["a"], py_modules=[url["shared"]]))
            await c2.create(env_json(url["b"], py_modules=[url["shared"]]))
            pid1, pid2 = one.proc.pid, two.proc.pid
            before = await wait_info(root, envs_noted({pid1: 1, pid2: 1}), "both envs noted")
            victim = by_pid(before)[pid2]["id"]
            size_b = by_uri(before)[url["b"]]["size_bytes"]

            os.kill(pid1, signal.SIGSTOP)
            try:
                two.proc.send_signal(signal.SIGKILL)
                assert await asyncio.wait_for(two.proc.wait(), STOP_S) == -signal.SIGKILL
                doc = await info_json(root)
            finally:
                os.kill(pid1, signal.SIGCONT)
            holders = by_pid(doc)
            assert (holders[pid1]["alive"], holders[pid2]["alive"]) == (True, False), doc
            assert holders[pid2]["references"] == 2, "reaped already: the test proves nothing"
            assert {u: p["references"] for u, p in by_uri(doc).items()} == {
                url["a"]: 1, url["b"]: 0, url["shared"]: 1,
            }  # fmt: skip
            assert (doc["summary"]["holders_alive"], doc["summary"]["holders_dead"]) == (1, 1)
            assert doc["summary"]["unused_bytes"] == size_b, doc["summary"]
            text = await info_text(root)
            [line] = [x for x in text.splitlines() if x.startswith(victim)]
            assert line.split()[1:5] == [str(pid2), "dead", "2", "1"], text
            assert text.splitlines()[-1].startswith("holders: 1 alive, 1 dead; 3 packages"), text

            await c1.create(env_json(url["later"]))  # an install, then a pass
            doc = await wait_info(
                root, lambda d: pid2 not in by_pid(d), "the survivor's pass to reap it"
            )
            assert list(by_pid(doc)) == [pid1], doc
            assert by_pid(doc)[pid1]["references"] == 3, doc
            assert by_uri(doc)[url["b"]]["references"] == 0, "kept, unused, within the budget"
            assert doc["summary"]["unused_bytes"] == size_b, doc["summary"]
            assert f"reaped holder {victim}" in one.log_text()


async def test_a_root_no_agent_serves_is_read_without_making_a_file_in_it(base: Path) -> None:
    """After the last agent stopped cleanly (its row gone, the WAL folded in and removed): no
    holder, the package kept and unused; and info creates no file (a read-only WAL reader would
    make state.db-wal and -shm, owned by whoever runs info, which an agent could not write)."""
    root = base / "root"
    async with package_server() as pkgs:
        url = serve_packages(pkgs, "a")
        async with agent(base, "one", root) as (_, c1):
            await c1.create(env_json(url["a"]))
    before = _files(root)
    assert "state.db-wal" not in before, "the agent left its WAL: the test proves nothing"
    doc = await info_json(root)
    assert doc["holders"] == [], doc
    [package] = doc["packages"]
    assert (package["uri"], package["state"], package["references"]) == (url["a"], "unused", 0)
    assert doc["summary"]["unused_bytes"] == package["size_bytes"] > 0, doc["summary"]
    assert _files(root) == before, "info changed the root"


# -- what info cannot show: one line, exit 1 ----------------------------------------------------


async def test_a_root_without_state_db_has_no_index_and_is_left_as_it_was(base: Path) -> None:
    """No state.db: said in one line, pointing --no-state-db agents to --address; exit 1, and
    no file is made (in an existing root or for a root that does not exist)."""
    root = base / "root"
    root.mkdir()
    for where in (root, base / "nowhere"):
        code, out, err = await run_cli("info", "--root", str(where))
        assert (code, out) == (1, ""), err
        line = one_line(err)
        assert line.startswith(f"rtenv-agent info: {where} has no index: there is no "), line
        assert "--no-state-db keeps its index in memory: use info --address" in line, line
    assert list(root.iterdir()) == []
    assert not (base / "nowhere").exists()


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (2, "an older agent wrote it (an agent of this version migrates it at start)"),
        (SCHEMA_VERSION + 1, "a newer agent wrote it (run that version's rtenv-agent info)"),
        (0, "it is not an index an agent wrote"),
    ],
)
async def test_a_database_of_another_schema_is_one_line_exit_1_and_never_migrated(
    base: Path, version: int, said: str
) -> None:
    root = base / "root"
    root.mkdir()
    with sqlite3.connect(root / "state.db") as conn:
        conn.execute("CREATE TABLE uris (kind TEXT, uri TEXT)")
        conn.execute(f"PRAGMA user_version={version}")
    conn.close()
    before = _files(root)
    code, out, err = await run_cli("info", "--root", str(root))
    assert (code, out) == (1, ""), err
    line = one_line(err)
    assert line == (
        f"rtenv-agent info: {root / 'state.db'} has schema version {version}, and this info "
        f"reads version {SCHEMA_VERSION}: {said}"
    ), line
    assert _files(root) == before, "info changed the root"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"this is not SQLite\n" * 300, "file is not a database"),
        (None, "not a regular file"),  # a folder named state.db
    ],
    ids=["not-sqlite", "folder"],
)
async def test_a_state_db_sqlite_cannot_read_is_one_line_exit_1(
    base: Path, content: bytes | None, said: str
) -> None:
    root = base / "root"
    root.mkdir()
    if content is None:
        (root / "state.db").mkdir()
    else:
        (root / "state.db").write_bytes(content)
    code, out, err = await run_cli("info", "--root", str(root))
    assert (code, out) == (1, ""), err
    line = one_line(err)
    assert line == f"rtenv-agent info: cannot read {root / 'state.db'}: {said}", line
    assert [p.name for p in root.iterdir()] == ["state.db"], "info made files in the root"


async def test_a_row_of_the_wrong_type_is_an_unreadable_file_not_a_traceback(base: Path) -> None:
    """SQLite columns take any value: a size that is text is reported, in one line."""
    root = base / "root"
    async with agent(base, "one", root):
        pass  # a real schema-3 index, written and left by a clean stop
    with sqlite3.connect(root / "state.db") as conn:
        conn.execute(
            "INSERT INTO uris (kind, uri, dir, size, last_used_ms) VALUES"
            " ('working_dir', 'https://x/y.zip', 'd', 'big', 0)"
        )
    conn.close()
    code, out, err = await run_cli("info", "--root", str(root))
    assert (code, out) == (1, ""), err
    line = one_line(err)
    assert line == (
        f"rtenv-agent info: cannot read {root / 'state.db'}: a row holds str where the schema "
        "says an integer"
    ), line


@pytest.mark.parametrize(
    "extra", [("--token-file", "/tmp/t"), ("--timeout", "5"), ("--limit", "3")]
)
async def test_address_only_flags_with_root_are_a_usage_mistake(
    base: Path, extra: tuple[str, str]
) -> None:
    code, out, err = await run_cli("info", "--root", str(base), *extra)
    assert (code, out) == (2, ""), err
    line = one_line(err)
    assert line.startswith(f"rtenv-agent info: {extra[0]} applies to --address only"), line


async def test_a_root_that_is_a_file_is_a_usage_mistake(base: Path) -> None:
    (base / "file").write_text("x")
    code, out, err = await run_cli("info", "--root", str(base / "file"))
    assert (code, out) == (2, ""), err
    assert one_line(err) == f"rtenv-agent info: --root {base / 'file'} is not a folder"


async def test_a_holder_whose_lock_file_this_user_cannot_open_is_shown_unknown(
    base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """info run by a user who can read state.db but not an agent's 0600 lock file (the CLI's
    main, in this process: as root the open is refused by a patch): that holder's liveness is
    unknown, its references counted as a pass counts them (kept), exit 0, no traceback."""
    root = base / "root"
    for sub in ("uris", "tmp", "trash"):
        (root / sub).mkdir(parents=True)
    db = await holder(root)
    try:
        await install(db, KEY, size=2048)
        make_untestable(monkeypatch, lock_path(root, db.holder_id))
        assert cli.main(["info", "--root", str(root)]) == 0
        text, err = capsys.readouterr()
        assert err == ""
        [row] = [line for line in text.splitlines() if line.startswith(db.holder_id)]
        assert row.split()[1:4] == [str(os.getpid()), "unknown", "1"], text
        assert text.splitlines()[-1].startswith(
            "holders: 0 alive, 0 dead, 1 unknown (lock files this user cannot open: run info "
            "as their owner); 1 package, 2.0 KiB; unused 0 B"
        ), text
        assert cli.main(["info", "--root", str(root), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [h["alive"] for h in doc["holders"]] == [None], doc
        assert [p["references"] for p in doc["packages"]] == [1], doc
        assert doc["summary"]["holders_unknown"] == 1, doc
    finally:
        await db.close()


# -- the table, from values (no process) --------------------------------------------------------


def test_the_table_quotes_what_a_terminal_would_act_on_and_cuts_long_uris() -> None:
    """The index's text is anyone's who could write the file: a URI, a folder or a holder id
    with a control character is quoted, a very long URI cut, as info --address shows a job id."""
    forged = "\x1b[2Jhttps://x/\nforged"
    holder = HolderView("h\x07" * 3, 12, True, 1, 0, 1_000)
    view = RootView(
        Path("/r"),
        (holder,),
        (
            PackageView("working_dir", forged, "\x1b[1md", "ready", None, 2048, 1, 1_000),
            PackageView("py_modules", "https://x/" + "y" * 5000, "e", "installing",
                        holder.id, 0, 0, 0),
        ),
    )  # fmt: skip
    text = format_root(view)
    assert "\x1b" not in text, text
    assert "\x07" not in text, text
    assert "'\\x1b[2Jhttps://x/\\nforged'" in text, text
    assert "... (5010 characters)" in text, text
    assert len(text.splitlines()) == 9, text  # header, 1 holder, blank, header, 2 + 1, blank, sum
    assert text.splitlines()[-1] == (
        "holders: 1 alive, 0 dead; 2 packages, 2.0 KiB; unused 0 B (ready, no live holder "
        "references them)"
    )


async def test_a_holder_named_only_by_references_never_opens_a_fifo_nor_a_file_outside_holders(
    tmp_path: Path,
) -> None:
    """Its pid is read from its lock file: an id that is a FIFO there (an open would block
    for ever) or is no id (``../x`` names ``ROOT/x.lock``) gives no pid, and info returns."""
    root = tmp_path
    db = StateDB(root / "state.db")
    await db.open()
    await db.close()
    fifo = "f" * 32
    os.mkfifo(root / "holders" / f"{fifo}.lock")
    (root / "x.lock").write_text("4242")
    with sqlite3.connect(root / "state.db") as conn:
        conn.executemany(
            "INSERT INTO refs (holder, kind, uri) VALUES (?, 'py_modules', 'u')",
            [(fifo,), ("../x",)],
        )
    conn.close()
    reading = asyncio.ensure_future(asyncio.to_thread(read_root, root))
    try:
        view = await asyncio.wait_for(asyncio.shield(reading), 10)
    finally:  # a reader blocked on the FIFO gets its end of file: a failure never hangs
        with contextlib.suppress(OSError):
            os.close(os.open(root / "holders" / f"{fifo}.lock", os.O_WRONLY | os.O_NONBLOCK))
        await asyncio.gather(reading, return_exceptions=True)
    assert sorted((h.id, h.pid) for h in view.holders) == [("../x", None), (fifo, None)]
