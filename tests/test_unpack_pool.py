"""The unpack pool: zips extracted in worker processes (real ones), split between them, with the
archive's checks, cancellation, dead workers and the agent's start and stop."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from agent.core.errors import DiskExhausted, Unavailable, UnsafeArchive
from agent.install.unpack import inflate
from agent.install.unpack.archive import extract_zip
from agent.install.unpack.jobs import Gate, Task
from agent.install.unpack.plan import ArchiveLimits, opened_zip, plan_zip
from agent.install.unpack.pool import UnpackPool
from agent.install.unpack.shares import shares
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip, workdir_zip
from tests.harness.polling import wait_until
from tests.harness.tempdirs import short_tempdir
from tests.harness.unpacking import pool_of, slow_zip, snapshot

LABEL = "http://pkgs/p.zip"
LIMITS = ArchiveLimits()
WD = "wd.zip"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid: int, marker: str = "agent.install.unpack.worker") -> list[int]:
    """The live processes whose parent is ``pid`` and whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and marker.encode() in cmdline:
            found.append(int(entry))
    return found


def niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def files_under(path: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Freeze a process (SIGSTOP) for the block; it is let go (SIGCONT) after, if alive."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)


# -- the plan's shares (pure) -----------------------------------------------------------------


def test_shares_hold_every_entry_once_in_archive_order_and_are_about_even(tmp_path: Path) -> None:
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip(files=500, text_mb=1))
    with opened_zip(archive, LABEL) as zf:
        plan = plan_zip(zf, archive.stat().st_size, True, LIMITS, LABEL)
    split = shares(plan, 3)
    assert split == shares(plan, 3)  # every worker computes the same
    flat = [e for share in split for e in share]
    assert sorted(e.info.header_offset for e in flat) == sorted(
        e.info.header_offset for e in plan.entries
    )
    for share in split:
        offsets = [e.info.header_offset for e in share]
        assert offsets == sorted(offsets)
    sizes = [len(share) for share in split]
    assert min(sizes) > 0
    assert ("empty",) in plan.dirs
    assert ("data",) in plan.dirs


def test_shares_keep_each_folders_small_files_together(tmp_path: Path) -> None:
    """Two workers creating files in one folder at once wait on each other (the file system
    serialises a folder's creations): a folder's small files go to one share, and a large
    entry, alone, balances the rest."""
    rng = random.Random(7)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(400):
            zf.writestr(f"proj/pkg{i % 8}/mod{i}.py", rng.randbytes(2000).hex())
        zf.writestr("proj/data/big.bin", rng.randbytes(3 * 2**20))
    archive = tmp_path / "p.zip"
    archive.write_bytes(buf.getvalue())
    with opened_zip(archive, LABEL) as zf:
        plan = plan_zip(zf, archive.stat().st_size, True, LIMITS, LABEL)
    split = shares(plan, 2)
    owners: dict[tuple[str, ...], set[int]] = {}
    for k, share in enumerate(split):
        for entry in share:
            owners.setdefault(entry.parts[:-1], set()).add(k)
    assert len(owners) == 9
    assert all(len(ks) == 1 for ks in owners.values()), owners
    assert all(len(share) > 0 for share in split)
    assert sorted(e.info.header_offset for share in split for e in share) == sorted(
        e.info.header_offset for e in plan.entries
    )


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
@pytest.mark.parametrize(
    ("name", "other", "body", "flip_at"),
    [
        ("a.txt", "z.txt", b"hello " * 100, 3),  # small: read in one call (``_copy_small``)
        # large: past _SMALL, inflated a chunk at a time (``_copy_stream``)
        ("big.txt", "zig.txt", random.Random(3).randbytes(600 * 1024).hex().encode(), 5000),
    ],
    ids=["small", "streamed"],
)
def test_an_entry_not_read_by_zipextfile_is_checked_as_zipfile_checks_it(
    tmp_path: Path, compression: int, name: str, other: str, body: bytes, flip_at: int
) -> None:
    """Entries skip ``ZipExtFile``: a local header naming another file, a flipped byte of a
    stored or deflated stream, are refused all the same, and a good one comes out byte for byte
    with its mode."""
    data = make_zip({name: body, "b.txt": "x"}, compression=compression)
    archive = tmp_path / "p.zip"
    archive.write_bytes(data)
    extract_zip(archive, tmp_path / "ok", strip_top_level=False, limits=LIMITS, label=LABEL)
    assert (tmp_path / "ok" / name).read_bytes() == body
    assert stat.S_IMODE((tmp_path / "ok" / name).stat().st_mode) == 0o644
    local = data.index(b"PK\x03\x04")
    renamed = bytearray(data)
    renamed[local + 30 : local + 30 + len(name)] = other.encode()  # the header names another
    flipped = bytearray(data)
    flipped[local + 30 + len(name) + flip_at] ^= 0xFF  # a byte of the entry's stream
    for bad, words in ((renamed, "differ"), (flipped, "")):
        archive.write_bytes(bytes(bad))
        with pytest.raises(UnsafeArchive, match="is not a readable zip archive") as info:
            extract_zip(archive, tmp_path / f"bad{words}",
                        strip_top_level=False, limits=LIMITS, label=LABEL)  # fmt: skip
        assert words in info.value.message


@pytest.mark.parametrize("decoder", ["zlib", "isal"])
def test_either_decoder_writes_the_same_tree(
    tmp_path: Path, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ISA-L's inflate (the extra ``fast``) and zlib's, the fallback, unpack the same bytes."""
    if decoder == "isal":
        isal_zlib = pytest.importorskip("isal.isal_zlib")
        monkeypatch.setattr(inflate, "decompressobj", isal_zlib.decompressobj)
        monkeypatch.setattr(inflate, "crc32", isal_zlib.crc32)
    else:
        monkeypatch.setattr(inflate, "decompressobj", zlib.decompressobj)
        monkeypatch.setattr(inflate, "crc32", zlib.crc32)
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip(files=200, text_mb=1))
    out = tmp_path / "out"
    extract_zip(archive, out, strip_top_level=False, limits=LIMITS, label=LABEL)
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if not info.is_dir():
                assert (out / info.filename).read_bytes() == zf.read(info), info.filename


async def test_the_workers_inflate_with_isal_when_it_is_installed(tmp_path: Path) -> None:
    """The workers run ``python -S`` (no site-packages): the pool puts ISA-L's folder on their
    path, so a worker that extracted an archive has ISA-L's library loaded."""
    pytest.importorskip("isal.isal_zlib")
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip(files=50, text_mb=1))
    async with pool_of(1) as pool:
        await pool.extract(
            archive, tmp_path / "out", archive_bytes=archive.stat().st_size,
            strip_top_level=True, limits=LIMITS, label=LABEL,
        )  # fmt: skip
        (pid,) = pool.pids
        maps = Path(f"/proc/{pid}/maps").read_text()
    assert "isal_zlib" in maps


# -- the pool --------------------------------------------------------------------------------


@pytest.mark.parametrize("split_bytes", [1, 1 << 40], ids=["split", "whole"])
async def test_the_pool_writes_what_extract_zip_writes(tmp_path: Path, split_bytes: int) -> None:
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip(files=300, text_mb=1))
    alone = tmp_path / "alone"
    expected = extract_zip(archive, alone, strip_top_level=True, limits=LIMITS, label=LABEL)
    async with pool_of(2, split_bytes) as pool:
        dest = tmp_path / "staging" / "unpacked"
        dest.parent.mkdir()
        reserved: list[int] = []

        async def reserve(declared: int) -> None:
            assert not dest.exists()  # before a byte is written
            reserved.append(declared)

        written = await pool.extract(
            archive, dest, archive_bytes=archive.stat().st_size, strip_top_level=True,
            limits=LIMITS, label=LABEL, reserve=reserve,
        )  # fmt: skip
    assert reserved == [expected]  # once, whatever the shares
    assert written == expected
    assert snapshot(dest) == snapshot(alone)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "bin" / "run").stat().st_mode) == 0o755


async def test_a_share_that_plans_as_a_refused_reservation_ends_is_halted() -> None:
    """A reservation that failed, its done-callback not run yet, is never taken for room: a
    share planning in that moment is told to halt and the failure is kept as the job's (CI saw
    the empty folder such a share made, one run in about fifteen)."""
    pool = UnpackPool(1)
    try:
        loop = asyncio.get_running_loop()

        async def unused(declared: int) -> None:
            raise AssertionError("the reservation is already made")

        replies: list[tuple[str]] = []
        gate = Gate(unused, lambda _task, message: replies.append(message), lambda: False)
        gate.step = loop.create_future()
        gate.step.set_exception(DiskExhausted("no room for 10 bytes"))  # no callback has run
        task = Task(("share",), loop.create_future(), gate=gate)
        pool._planned(task, 10)
        assert replies == [("halt",)]
        assert isinstance(gate.failed, DiskExhausted)
    finally:
        await pool.close()


@pytest.mark.parametrize("split_bytes", [1, 1 << 40], ids=["split", "whole"])
async def test_nothing_is_written_before_the_reservation_and_its_refusal_is_the_error(
    tmp_path: Path, split_bytes: int
) -> None:
    """The workers plan, then wait for the agent's room on the disk: refused, the job raises
    the reservation's error and nothing was written; cancelled while it waits, the workers are
    told to halt and are waited for."""
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip(files=50, text_mb=1))
    async with pool_of(2, split_bytes) as pool:

        async def refuse(declared: int) -> None:
            raise DiskExhausted(f"no room for {declared} bytes")

        with pytest.raises(DiskExhausted, match="no room for"):
            await pool.extract(
                archive, tmp_path / "a", archive_bytes=1, strip_top_level=True, limits=LIMITS,
                label=LABEL, reserve=refuse,
            )  # fmt: skip
        assert not (tmp_path / "a").exists()
        held = asyncio.Event()

        async def hold(declared: int) -> None:
            held.set()
            await asyncio.Event().wait()

        job = asyncio.ensure_future(
            pool.extract(
                archive, tmp_path / "b", archive_bytes=1, strip_top_level=True, limits=LIMITS,
                label=LABEL, reserve=hold,
            )
        )  # fmt: skip
        await asyncio.wait_for(held.wait(), 30)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert pool.busy == 0
        assert not (tmp_path / "b").exists()
        assert len(pool.pids) == 2  # halted, not killed


async def test_links_are_made_after_every_share_and_checked(tmp_path: Path) -> None:
    archive = tmp_path / "p.zip"
    files = {f"proj/d{n}/f{n}.txt": f"{n}" for n in range(50)}
    archive.write_bytes(make_zip(files, symlinks={"proj/link": "d1/f1.txt"}))
    async with pool_of(2) as pool:
        dest = tmp_path / "out"
        await pool.extract(
            archive, dest, archive_bytes=1, strip_top_level=True, limits=LIMITS, label=LABEL
        )
        assert os.readlink(dest / "link") == "d1/f1.txt"
        assert (dest / "link").read_text() == "1"
        archive.write_bytes(make_zip(files, symlinks={"proj/link": "../../etc/passwd"}))
        with pytest.raises(
            UnsafeArchive, match=r"symlink 'proj/link' points to '../../etc/passwd', outside"
        ):
            await pool.extract(
                archive, tmp_path / "out2", archive_bytes=1, strip_top_level=True,
                limits=LIMITS, label=LABEL,
            )  # fmt: skip


@pytest.mark.parametrize("split_bytes", [1, 1 << 40], ids=["split", "whole"])
async def test_an_unsafe_archive_comes_back_as_unsafe_archive_with_its_message(
    tmp_path: Path, split_bytes: int
) -> None:
    archive = tmp_path / "p.zip"
    async with pool_of(2, split_bytes) as pool:
        archive.write_bytes(make_zip({"ok.txt": "x", "../evil.txt": "x"}))
        with pytest.raises(UnsafeArchive) as info:
            await pool.extract(
                archive, tmp_path / "a", archive_bytes=1, strip_top_level=False,
                limits=LIMITS, label=LABEL,
            )  # fmt: skip
        assert (
            info.value.message
            == f"{LABEL}: entry '../evil.txt' climbs out of the destination with '..'"
        )
        assert not (tmp_path / "a").exists()  # refused from the plan: nothing written
        archive.write_bytes(make_zip({f"f{n}": "x" for n in range(20)}))
        with pytest.raises(UnsafeArchive, match=r"has 20 entries; the limit is 10 \(max_entries\)"):
            await pool.extract(
                archive, tmp_path / "b", archive_bytes=1, strip_top_level=False,
                limits=ArchiveLimits(max_entries=10), label=LABEL,
            )  # fmt: skip
        archive.write_bytes(b"not a zip at all")
        with pytest.raises(UnsafeArchive, match="is not a readable zip archive"):
            await pool.extract(
                archive, tmp_path / "c", archive_bytes=1, strip_top_level=False,
                limits=LIMITS, label=LABEL,
            )  # fmt: skip
        assert len(pool.pids) == 2  # errors are answers: no worker was lost


async def test_a_cancelled_extraction_returns_only_once_its_workers_stopped(
    tmp_path: Path,
) -> None:
    """Cancelled mid-way, the job's workers are told to stop, and the cancellation goes on
    only once they answered: nothing is written in the folder after that (the staging folder
    may then be removed), and the pool serves the next job."""
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip())
    total = files_under(Path(_extracted(archive, tmp_path / "ref")))
    async with pool_of(2) as pool:
        dest = tmp_path / "out"
        job = await _writing(pool, archive, dest)
        pids = pool.pids
        with stopped(pids[0]), stopped(pids[1]):  # both mid-share while the cancel arrives
            job.cancel()
            await asyncio.sleep(0)
            assert not job.done()  # it waits for the workers to answer
        with pytest.raises(asyncio.CancelledError):
            await job
        assert pool.busy == 0
        after = files_under(dest)
        assert 0 < after < total
        # the next job runs in the same workers; the folder above was left alone meanwhile
        await pool.extract(
            archive, tmp_path / "again", archive_bytes=1, strip_top_level=True, limits=LIMITS,
            label=LABEL,
        )  # fmt: skip
        assert files_under(dest) == after
        assert pool.pids == pids


async def _writing(pool: UnpackPool, archive: Path, dest: Path) -> asyncio.Future[int]:
    """A split extraction of ``archive`` into ``dest``, started and writing (files there)."""
    job = asyncio.ensure_future(
        pool.extract(
            archive, dest, archive_bytes=1, strip_top_level=True, limits=LIMITS, label=LABEL
        )
    )
    await wait_until(lambda: dest.exists() and files_under(dest) > 0, what="files written")
    return job


def _extracted(archive: Path, dest: Path) -> Path:
    extract_zip(archive, dest, strip_top_level=True, limits=LIMITS, label=LABEL)
    return dest


async def test_a_worker_killed_mid_extraction_fails_its_job_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / "p.zip"
    archive.write_bytes(slow_zip())
    async with pool_of(2) as pool:
        await pool.ready()
        before = pool.pids
        dest = tmp_path / "out"
        job = await _writing(pool, archive, dest)
        victim = before[0]
        with caplog.at_level(logging.ERROR, logger="agent.install.unpack.pool"):
            with stopped(victim):  # mid-share for sure: frozen, then killed
                os.kill(victim, signal.SIGKILL)
            with pytest.raises(Unavailable) as info:
                await job
        assert info.value.message == (
            f"{LABEL}: the process unpacking it (pid {victim}) was killed by SIGKILL; the agent "
            "started another; try again"
        )
        assert any(f"(pid {victim}) was killed by SIGKILL" in r.message for r in caplog.records)
        assert pool.busy == 0  # the other share was stopped and waited for
        await wait_until(lambda: len(pool.pids) == 2, what="a new worker")
        assert victim not in pool.pids
        assert not alive(victim)
        assert pool.replaced == 1
        again = tmp_path / "again"
        await pool.extract(
            archive, again, archive_bytes=1, strip_top_level=True, limits=LIMITS, label=LABEL
        )
        assert (again / "data" / "table.txt").is_file()


async def test_close_ends_every_worker_by_pid_even_one_that_does_not_listen(
    tmp_path: Path,
) -> None:
    pool = UnpackPool(2)
    pool.start()
    await pool.ready()
    pids = pool.pids
    assert len(pids) == 2
    assert all(alive(p) for p in pids)
    os.kill(pids[1], signal.SIGSTOP)  # deaf: only a kill by its pid ends it
    await pool.close()
    assert pool.pids == []
    assert not any(alive(p) for p in pids)


# -- in the agent ----------------------------------------------------------------------------


async def test_the_agent_starts_its_workers_and_ends_them_when_it_stops() -> None:
    async with running_agent(extract_workers=2) as a:
        await wait_until(lambda: len(children_of(os.getpid())) >= 2, what="the workers")
        pids = children_of(os.getpid())
        assert len(pids) == 2
        mine = niceness(os.getpid())
        await wait_until(lambda: all(niceness(p) > mine for p in pids), what="niced workers")
        async with package_server() as pkgs:
            reply = await a.create(env_json(pkgs.add(WD, workdir_zip({"main.py": "M = 1\n"}))))
            assert (Path(reply.context.cwd) / "main.py").read_text() == "M = 1\n"
    assert not any(alive(p) for p in pids)


async def test_a_worker_killed_during_a_create_fails_it_unavailable_and_the_agent_serves_on() -> (
    None
):
    async with package_server() as pkgs, running_agent(extract_workers=2) as a:
        wd = pkgs.add(WD, slow_zip())
        await wait_until(lambda: len(children_of(os.getpid())) == 2, what="the workers")
        victim = children_of(os.getpid())[0]
        call = asyncio.ensure_future(a.create(env_json(wd)))
        tmp = a.root / "tmp"
        await wait_until(
            lambda: any(p.name == "unpacked" for p in tmp.rglob("unpacked")),
            what="the extraction to begin",
        )
        with stopped(victim):
            os.kill(victim, signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"(pid {victim}) was killed by SIGKILL" in (info.value.details() or "")
        reply = await a.create(env_json(wd))  # served again, by the pool's new worker
        assert (Path(reply.context.cwd) / "data" / "table.txt").is_file()
        assert victim not in children_of(os.getpid())


@contextmanager
def _agent_process(log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m agent serve`` with two unpack workers, in a session of its own (its stderr to
    ``log``, if given); it and its workers killed by PID at the end, its root removed."""
    base = short_tempdir()
    with open(log or os.devnull, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--root", str(base / "root"),
             "--extract-workers", "2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children_of(proc.pid):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


async def test_workers_of_an_agent_killed_outright_exit_on_their_own() -> None:
    """kill -9 of the agent: nobody closes the pool; its workers see their parent gone (their
    socket ends) and exit: no orphans."""
    with _agent_process() as proc:
        await wait_until(lambda: len(children_of(proc.pid)) == 2, timeout_s=60, what="workers")
        pids = children_of(proc.pid)
        proc.kill()
        proc.wait()
        await wait_until(lambda: not any(alive(p) for p in pids), what="the workers to exit")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
async def test_a_signal_to_the_agents_whole_group_stops_it_with_no_worker_replaced(
    sig: signal.Signals, tmp_path: Path
) -> None:
    """systemd's stop (SIGTERM to every process of the unit), a closed terminal (SIGHUP) or ^C
    reach the workers too: they leave it to the agent, which ends them; none dies of it and is
    replaced while the agent stops."""
    log = tmp_path / "agent.log"
    with _agent_process(log) as proc:
        await wait_until(lambda: len(children_of(proc.pid)) == 2, timeout_s=60, what="workers")
        await wait_until(lambda: "serving on" in log.read_text(), timeout_s=60, what="serving")
        pids = children_of(proc.pid)
        os.killpg(proc.pid, sig)
        code = await asyncio.wait_for(asyncio.to_thread(proc.wait), 30)
        text = log.read_text()
        assert code == 0, text
        assert "starting another" not in text, text
        assert "unpack worker" not in text, text
        await wait_until(lambda: not any(alive(p) for p in pids), what="the workers to exit")
