"""The overlap's pure parts and the worker's view of a growing archive: where a central
directory starts (as zipfile finds it), the first ranged GET's span, If-Range, and a zip read
and extracted while another thread is still writing it."""

from __future__ import annotations

import io
import os
import random
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.transport import Failure, MockTransport, Request, Response, TransportError
from agent.install.unpack.archive import extract_zip
from agent.install.unpack.finish import finish
from agent.install.unpack.growing import GrowingZip
from agent.install.unpack.overlap import _MIN_TAIL, directory_start, if_range, tail_span
from agent.install.unpack.plan import ArchiveLimits, opened_zip, plan_zip
from agent.install.unpack.stop import Stopped
from agent.install.unpack.write import write_share
from tests.harness.unpacking import slow_zip, snapshot, tail_offset_of

LIMITS = ArchiveLimits()


def build(entries: int, comment: bytes, prefix: bytes, zip64: bool) -> bytes:
    """A zip of ``entries`` small files, its end record carrying ``comment``, after ``prefix``
    (data before the archive, as a self-extractor has), with a zip64 end record if asked."""
    buf = io.BytesIO()
    buf.write(prefix)
    limit = zipfile.ZIP_FILECOUNT_LIMIT
    if zip64:  # the zip64 end record is written past this many entries
        zipfile.ZIP_FILECOUNT_LIMIT = 0  # type: ignore[misc]
    try:
        with zipfile.ZipFile(buf, "a" if prefix else "w") as zf:
            for n in range(entries):
                zf.writestr(f"top/f{n}.txt", f"file {n}\n" * (n % 7))
            zf.comment = comment
    finally:
        zipfile.ZIP_FILECOUNT_LIMIT = limit  # type: ignore[misc]
    return buf.getvalue()


def start_dir(data: bytes) -> int | None:
    """Where zipfile reads the directory from; None if it cannot read the archive at all."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            start: int = zf.start_dir
            return start
    except zipfile.BadZipFile:
        return None


@given(
    entries=st.integers(0, 40),
    comment=st.binary(max_size=300),
    prefix=st.binary(max_size=64),
    zip64=st.booleans(),
    cut=st.integers(0, 10_000),
)
@settings(max_examples=150, deadline=None)
def test_directory_start_is_where_zipfile_reads_the_directory(
    entries: int, comment: bytes, prefix: bytes, zip64: bool, cut: int
) -> None:
    """Whatever the tail holds of the end: the start zipfile uses, or None; never another."""
    data = build(entries, comment, prefix, zip64)
    offset = max(len(data) - cut, 0)
    found = directory_start(data[offset:], offset)
    expected = start_dir(data)
    assume(expected is not None)  # a prefix can spell a record zipfile refuses: no zip
    if found is not None:
        assert found == expected
    whole_end = len(data) - len(comment) - 22 - (76 if zip64 else 20)  # 20: room for a locator
    if offset <= max(whole_end, 0):  # the tail holds the end record and what precedes it
        assert found == expected


def test_a_zip64_end_record_is_followed_through_its_locator() -> None:
    data = build(5, b"", b"", zip64=True)
    assert b"PK\x06\x06" in data[-100:]
    assert directory_start(data, 0) == start_dir(data)


def test_a_tail_without_an_end_record_gives_no_start() -> None:
    assert directory_start(b"no zip here" * 100, 0) is None
    assert directory_start(b"", 0) is None


def test_the_first_ranged_get_is_a_sixteenth_within_its_bounds() -> None:
    assert tail_span(100) == 0  # smaller than the longest end record: all of it
    assert tail_span(4 * 2**20) == 4 * 2**20 - 2**18
    assert tail_span(64 * 2**20) == 63 * 2**20  # at most 1 MiB
    assert tail_span(2 * _MIN_TAIL) == _MIN_TAIL


def test_if_range_takes_a_strong_etag_else_last_modified() -> None:
    assert if_range({"ETag": '"abc"', "Last-Modified": "x"}) == {"If-Range": '"abc"'}
    assert if_range({"ETag": 'W/"abc"', "Last-Modified": "x"}) == {"If-Range": "x"}
    assert if_range({}) == {}


# -- a growing archive ----------------------------------------------------------------------


@contextmanager
def written_slowly(
    path: Path, data: bytes, *, pause_at: int, resume: threading.Event
) -> Iterator[threading.Thread]:
    """A thread writing ``data`` to ``path`` from its start in 64 KiB chunks, pausing before
    byte ``pause_at`` until ``resume`` is set (at most 20 s)."""
    path.write_bytes(b"")

    def write() -> None:
        with open(path, "ab") as f:
            for start in range(0, len(data), 64 * 1024):
                if start <= pause_at < start + 64 * 1024:
                    resume.wait(20)
                f.write(data[start : start + 64 * 1024])
                f.flush()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        yield thread
    finally:
        resume.set()
        thread.join(20)


def extract_growing(view: GrowingZip, dest: Path, size: int) -> None:
    with opened_zip(view, "growing") as zf:
        plan = plan_zip(zf, size, True, LIMITS, "growing")
        dest.mkdir(mode=0o700)
        root = dest.resolve()
        write_share(zf, plan.entries, root, LIMITS.max_uncompressed_bytes, "growing", bool)
        finish(zf, plan, root, "growing", bool)


def test_a_zip_is_extracted_as_it_is_written_and_equals_the_complete_ones(
    tmp_path: Path,
) -> None:
    data = slow_zip(files=300, text_mb=1)
    offset = tail_offset_of(data)
    archive, resume = tmp_path / "package.zip", threading.Event()
    with (
        written_slowly(archive, data, pause_at=len(data) // 2, resume=resume),
        GrowingZip(str(archive), len(data), offset, data[offset:], bool) as view,
    ):
        reader = threading.Thread(
            target=extract_growing, args=(view, tmp_path / "early", len(data))
        )
        reader.start()
        deadline = time.monotonic() + 20
        while view.waits == 0 and time.monotonic() < deadline:  # it reached the pause
            time.sleep(0.005)
        assert view.waits > 0, "the reader never waited for the bytes still to come"
        assert archive.stat().st_size < len(data)
        resume.set()
        reader.join(30)
        assert not reader.is_alive()
    complete = tmp_path / "complete.zip"
    complete.write_bytes(data)
    extract_zip(complete, tmp_path / "late", strip_top_level=True, limits=LIMITS, label="z")
    assert snapshot(tmp_path / "early") == snapshot(tmp_path / "late")


def test_a_read_waiting_for_bytes_stops_when_the_extraction_is_halted(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(200_000)
    archive = tmp_path / "package.zip"
    archive.write_bytes(data[:1000])
    halted = threading.Event()
    with GrowingZip(str(archive), len(data), len(data) - 100, data[-100:], halted.is_set) as view:
        assert view.pread(1000, 0) == data[:1000]  # there already: no wait
        assert view.pread(100, len(data) - 100) == data[-100:]  # the tail, from memory
        assert view.waits == 0
        timer = threading.Timer(0.05, halted.set)
        timer.start()
        try:
            with pytest.raises(Stopped):
                view.pread(10, 5000)
        finally:
            timer.cancel()
        assert view.waits > 0


def test_a_read_across_the_file_and_the_tail_joins_them(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    archive = tmp_path / "package.zip"
    archive.write_bytes(data)
    with GrowingZip(str(archive), len(data), 9000, data[9000:], bool) as view:
        assert view.pread(2000, 8000) == data[8000:10000]
        view.seek(-10, os.SEEK_END)
        assert view.read() == data[-10:]
        assert view.read(5) == b""
        view.seek(8990)
        assert view.read(20) == data[8990:9010]
        assert view.tell() == 9010


def test_a_tail_that_does_not_end_the_archive_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "package.zip"
    archive.write_bytes(b"")
    with pytest.raises(ValueError, match="does not end"):
        GrowingZip(str(archive), 100, 90, b"short", bool)


# -- the ranged GET ---------------------------------------------------------------------------

BODY = bytes(range(256)) * 4  # 1,024 bytes


def ranged_fetcher(answer: Callable[[Request], Response]) -> tuple[Fetcher, MockTransport]:
    transport = MockTransport(answer)
    return Fetcher(transport, FetchLimits()), transport


def part(request: Request, *, body: bytes = BODY, extra: bytes = b"", size: int = 0) -> Response:
    first, last = (int(n) for n in request.headers["Range"].removeprefix("bytes=").split("-"))
    return Response(
        206, body[first : last + 1] + extra,
        {"Content-Range": f"bytes {first}-{last}/{size or len(body)}"},
    )  # fmt: skip


async def test_a_ranged_get_reads_exactly_the_bytes_asked_for_with_if_range() -> None:
    fetcher, transport = ranged_fetcher(part)
    got = await fetcher.read_range("http://p/a.zip", 1000, 1024, 1024, {"If-Range": '"e"'})
    assert got == BODY[1000:]
    (request,) = transport.requests
    assert request.headers["Range"] == "bytes=1000-1023"
    assert request.headers["If-Range"] == '"e"'


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda r: Response(200, BODY), "the whole object (ranges ignored, or If-Range failed)"),
        (lambda r: part(r, size=2048), "another object's size"),
        (lambda r: Response(206, BODY[:24], {"Content-Range": "bytes 0-23/1024"}), "another span"),
        (lambda r: Response(206, BODY[1000:], {}), "no Content-Range"),
        (lambda r: part(r, body=BODY[:1010], size=1024), "fewer bytes than the span"),
    ],
)
async def test_a_ranged_get_answered_otherwise_gives_nothing(
    answer: Callable[[Request], Response], why: str
) -> None:
    fetcher, _ = ranged_fetcher(answer)
    assert await fetcher.read_range("http://p/a.zip", 1000, 1024, 1024, {}) is None, why


async def test_a_ranged_get_longer_than_asked_is_not_read_past_it() -> None:
    sent = [0]

    async def endless() -> AsyncIterator[bytes]:
        yield BODY[1000:]
        for _ in range(1000):  # bounded: the reader must stop after the first chunk past it
            sent[0] += 1
            yield b"x" * 4096

    fetcher, _ = ranged_fetcher(
        lambda r: Response(206, endless(), {"Content-Range": "bytes 1000-1023/1024"})
    )
    assert await fetcher.read_range("http://p/a.zip", 1000, 1024, 1024, {}) is None
    assert sent[0] == 1


async def test_a_ranged_get_that_fails_to_connect_gives_nothing() -> None:
    def refused(request: Request) -> Response:
        raise TransportError(Failure.CONNECTION, "refused")

    fetcher, _ = ranged_fetcher(refused)
    assert await fetcher.read_range("http://p/a.zip", 0, 10, 1024, {}) is None
