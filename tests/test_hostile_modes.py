"""What the agent keeps on disk is writable by nobody but its user, whatever the umask it was
started under and whatever modes a zip carries: a real ``python -m agent serve`` started by
``sh -c 'umask 000; exec ...'``, real zips with 0777, 0666, setuid and setgid entries served over
HTTP and file://, a real pip venv, then a walk of the whole root."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from agent.ops.startup import prepare_socket_path
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import REPO, START_S, stop
from tests.harness.in_process import listed
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, zip_with_infos
from tests.harness.pip_wheels import hermetic_pip_environ, isolate_pip, pip_env
from tests.harness.polling import wait_until

# "$0" is the python to run, "$@" serve's arguments: no quoting of paths in a shell string
UMASK_000 = 'umask 000; exec "$0" -m agent serve "$@"'
LOOSE = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022
CREATE_S = 30.0
PIP_CREATE_S = 120.0  # a venv built by real pip on a loaded machine
NO_PROXY = [("grpc.enable_http_proxy", 0)]


@pytest.fixture(autouse=True)
def hermetic_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agents and installers started here see no pip configuration of this machine."""
    isolate_pip(monkeypatch)


HOSTILE = [  # (name, unix mode with its type, data) under the one top folder "proj"
    ("proj/", stat.S_IFDIR | 0o777, b""),
    ("proj/main.py", stat.S_IFREG | 0o777, b"print('hi')\n"),
    ("proj/data.txt", stat.S_IFREG | 0o666, b"shared\n"),
    ("proj/bin/suid", stat.S_IFREG | 0o4755, b"#!/bin/sh\n"),
    ("proj/bin/sgid", stat.S_IFREG | 0o2777, b"#!/bin/sh\n"),
    ("proj/tmp/", stat.S_IFDIR | 0o1777, b""),
    ("proj/deep/er/mod.py", stat.S_IFREG | 0o666, b"X = 1\n"),
]


def module_entries(module: str) -> list[tuple[str, int, bytes]]:
    """A py_modules zip (no top folder stripped) with the same hostile modes."""
    return [(name.replace("proj", module, 1), mode, data) for name, mode, data in HOSTILE]


def _a_uv_lock_in(cache: Path, entry: str) -> bool:
    """A 'path mode' of ``loose_entries`` that is a lock file uv made 0666 in its cache."""
    path, mode = entry.rsplit(" ", 1)
    return path.startswith(f"{cache}/") and path.endswith(".lock") and mode == "666"


def loose_entries(root: Path) -> list[str]:
    """Every entry under ``root`` (itself too; links skipped, never followed) that is group or
    other writable or carries a setuid, setgid or sticky bit, as 'path mode'."""
    found = []
    paths = [str(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        paths += [os.path.join(dirpath, name) for name in (*dirnames, *filenames)]
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & LOOSE:
            found.append(f"{path} {stat.S_IMODE(st.st_mode):o}")
    return found


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def umask_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError(f"/proc/{pid}/status has no Umask line")


@asynccontextmanager
async def agent_process(
    root: Path, log: Path, *, umask_000: bool, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, agent_pb2_grpc.RuntimeEnvAgentStub]]:
    """``python -m agent serve --root ROOT`` (under ``umask 000`` if asked), once serving, and a
    stub on its socket; stopped by its PID."""
    args = ["--root", str(root)]
    command = ["sh", "-c", UMASK_000, sys.executable, *args] if umask_000 else [
        sys.executable, "-m", "agent", "serve", *args,
    ]  # fmt: skip
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO, env=env
        )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), START_S)).decode().strip()
        prefix = "rtenv-agent serving on "
        assert line.startswith(prefix), f"no serving line: {line!r}; log:\n{log.read_text()}"
        async with grpc.aio.insecure_channel(line.removeprefix(prefix), options=NO_PROXY) as ch:
            yield proc, agent_pb2_grpc.RuntimeEnvAgentStub(ch)  # type: ignore[no-untyped-call]
    finally:
        await stop(proc)


async def create(
    stub: agent_pb2_grpc.RuntimeEnvAgentStub, serialized: str, timeout_s: float = CREATE_S
) -> agent_pb2.CreateRuntimeEnvReply:
    request = agent_pb2.CreateRuntimeEnvRequest(serialized_runtime_env=serialized)
    reply: agent_pb2.CreateRuntimeEnvReply = await stub.CreateRuntimeEnv(request, timeout=timeout_s)
    return reply


async def info(stub: agent_pb2_grpc.RuntimeEnvAgentStub) -> agent_pb2.GetRuntimeEnvsInfoReply:
    reply: agent_pb2.GetRuntimeEnvsInfoReply = await stub.GetRuntimeEnvsInfo(
        agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=CREATE_S
    )
    return reply


async def test_an_agent_under_umask_000_keeps_nothing_others_may_write_and_no_setuid_bit(
    base: Path, wheels: Path
) -> None:
    """Zips with 0777/0666/setuid/setgid/sticky entries over HTTP and file://, and a pip venv:
    every file and folder under the root ends up neither group nor other writable, without a
    special bit; state.db, its WAL, the lock and the socket too; a package being fetched sits
    in a 0700 staging folder, in a 0600 file."""
    root = base / "root"
    pkgs = base / "pkgs"
    pkgs.mkdir()
    (pkgs / "mods.zip").write_bytes(zip_with_infos(module_entries("hostile_mod")))
    async with package_server() as server:
        wd_url = server.add("wd.zip", zip_with_infos(HOSTILE))
        held_url = server.add("held.zip", zip_with_infos(module_entries("held_mod")))
        gate = server.hold("held.zip")
        env = hermetic_pip_environ()
        async with agent_process(root, base / "agent.log", umask_000=True, env=env) as (proc, stub):
            assert umask_of(proc.pid) == 0, "the agent must really run under umask 000"
            await create(stub, env_json(wd_url, [f"file://{pkgs / 'mods.zip'}"]))

            # a package in flight: its staging folder is private, its download file 0600
            await wait_until(lambda: not listed(root, "tmp"), what="earlier staging gone")
            held = asyncio.create_task(create(stub, env_json(py_modules=[held_url])))
            await asyncio.wait_for(server.requested("held.zip").wait(), CREATE_S)
            staging = list((root / "tmp").glob("*/*"))  # tmp/<holder id>/<random>
            assert len(staging) == 1, staging
            assert mode_of(staging[0].parent) == 0o700  # the agent's own staging folder
            assert mode_of(staging[0]) == 0o700
            assert mode_of(staging[0] / "package.zip") == 0o600
            gate.set()
            await held

            await create(stub, pip_env(["alpha-pkg"], wheels), timeout_s=PIP_CREATE_S)
            await wait_until(lambda: not listed(root, "tmp"), what="staging deleted")

            names = set(os.listdir(root))
            expected = {"agent.lock", "agent.sock", "state.db", "state.db-wal", "state.db-shm"}
            assert expected | {"uris", "tmp", "trash", "logs", "holders"} <= names, names
            # the agent's holder lock (0600 like its pid) and its socket's note, 0600 too
            lock, note = sorted((root / "holders").iterdir(), key=lambda p: p.suffix)
            assert (lock.suffix, note.suffix) == (".lock", ".socket")
            assert mode_of(lock) == 0o600
            assert mode_of(note) == 0o600
            assert mode_of(root / "holders") == 0o755
            assert len(os.listdir(root / "uris")) == 4  # working dir, two modules, one venv
            assert mode_of(root / "agent.lock") == 0o600
            assert mode_of(root / "agent.sock") == 0o600
            for db in ("state.db", "state.db-wal", "state.db-shm"):
                assert mode_of(root / db) in (0o600, 0o644), db
            # the pip venv was built by uv (pip-installer auto): its wheel cache is private,
            # and what uv made there under the agent's umask 000 is not loose (the installer
            # runs under 022), but for uv's lock files, which uv itself makes 0666 (a cache
            # shared by users): harmless in a folder only the agent's user may enter
            cache = root / "wheel-cache"
            assert mode_of(cache) == 0o700
            loose = loose_entries(root)
            assert [e for e in loose if not _a_uv_lock_in(cache, e)] == [], loose
            kinds = {p.name.split("-")[0] for p in (root / "uris").iterdir()}
            assert kinds == {"working_dir", "py_modules", "pip"}
            wd = next((root / "uris").glob("working_dir-*"))
            assert mode_of(wd / "main.py") == 0o755
            assert mode_of(wd / "data.txt") == 0o644
            assert mode_of(wd / "bin" / "suid") == 0o755
            assert mode_of(wd / "tmp") == 0o755


async def test_a_restarted_agent_fixes_loose_folders_and_drops_a_package_others_could_write(
    base: Path,
) -> None:
    """A root left by an agent run under umask 000 before modes were set (uris/, tmp/, trash/
    and a package at 0777): the next start takes group and other write off the folders and
    deletes the package rather than vouch for it; the next create installs it again."""
    root = base / "root"
    package = base / "wd.zip"
    package.write_bytes(zip_with_infos(HOSTILE))
    serialized = env_json(f"file://{package}")
    log = base / "agent.log"
    async with agent_process(root, log, umask_000=False) as (_, stub):
        env_id = (await create(stub, serialized)).runtime_env_id
        await stub.DeleteRuntimeEnv(
            agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id), timeout=CREATE_S
        )
    [kept] = list((root / "uris").iterdir())
    for folder in (root / "uris", root / "tmp", root / "trash", kept):
        folder.chmod(0o777)

    async with agent_process(root, log, umask_000=False) as (_, stub):
        for sub in ("uris", "tmp", "trash"):
            assert mode_of(root / sub) == 0o755, sub
        assert not kept.exists()
        summary = (await info(stub)).recovery
        assert (summary.rows_kept, summary.rows_dropped, summary.orphans_deleted) == (0, 1, 1)
        await create(stub, serialized)
        assert mode_of(kept) == 0o755  # the same URI, the same folder: installed afresh
        assert loose_entries(root) == []
    assert "writable by others" in log.read_text()


async def test_an_agent_under_umask_000_makes_the_roots_missing_parents_0755(base: Path) -> None:
    """``--root`` names folders that do not exist yet: each one the agent makes, not only the
    root, is 0755 under umask 000 (an open parent lets others swap the root for their own)."""
    root = base / "made" / "for-it" / "root"
    async with agent_process(root, base / "agent.log", umask_000=True) as (proc, _):
        assert umask_of(proc.pid) == 0
        assert mode_of(base / "made") == 0o755
        assert mode_of(base / "made" / "for-it") == 0o755
        assert mode_of(root) == 0o755


def test_the_socket_folder_and_every_parent_made_for_it_are_0700_under_umask_000(
    base: Path,
) -> None:
    """A parent made open to others (0777 under umask 000) would let them rename the socket's
    folder away and put their own in its place."""
    address = f"unix:{base / 'run' / 'deeper' / 'agent.sock'}"
    old = os.umask(0)
    try:
        prepare_socket_path(address)
    finally:
        os.umask(old)
    assert mode_of(base / "run") == 0o700
    assert mode_of(base / "run" / "deeper") == 0o700
