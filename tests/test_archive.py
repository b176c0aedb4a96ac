"""Unit tests for safe zip extraction on real zip files, and for remove_tree."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from pathlib import Path

import pytest

from agent.archive import ArchiveLimits, extract_zip, remove_tree
from agent.errors import UnsafeArchive
from tests.helpers import make_zip

LABEL = "file:///pkgs/p.zip"
LIMITS = ArchiveLimits()


def extract(
    tmp_path: Path, data: bytes, *, strip: bool = True, limits: ArchiveLimits = LIMITS
) -> tuple[Path, int]:
    """Write ``data`` as a zip and extract it to ``<tmp>/box/dest``; return (dest, bytes)."""
    archive = tmp_path / "p.zip"
    archive.write_bytes(data)
    dest = tmp_path / "box" / "dest"
    return dest, extract_zip(archive, dest, strip_top_level=strip, limits=limits, label=LABEL)


def refused(
    tmp_path: Path, data: bytes, *, strip: bool = True, limits: ArchiveLimits = LIMITS
) -> str:
    """Extract ``data`` expecting UnsafeArchive; check nothing escaped; return the message."""
    with pytest.raises(UnsafeArchive) as info:
        extract(tmp_path, data, strip=strip, limits=limits)
    assert LABEL in info.value.message
    assert_nothing_outside(tmp_path)
    return info.value.message


def assert_nothing_outside(tmp_path: Path) -> None:
    """Only the archive and the box exist; the box holds only dest; no link in dest leaves it."""
    assert sorted(os.listdir(tmp_path)) in (["p.zip"], ["box", "p.zip"])
    box = tmp_path / "box"
    if box.exists():
        assert os.listdir(box) in ([], ["dest"])
    dest = box / "dest"
    root = os.path.realpath(dest)
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            real = os.path.realpath(os.path.join(dirpath, name))
            assert real == root or real.startswith(root + os.sep), f"{name} resolves to {real}"


def zip_with_infos(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A zip of (name, unix mode incl. file type, data) entries."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, mode, data in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return buf.getvalue()


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- layout -------------------------------------------------------------------------------------


def test_working_dir_single_top_level_folder_is_stripped(tmp_path: Path) -> None:
    dest, written = extract(
        tmp_path, make_zip({"proj/": "", "proj/main.py": "print(1)\n", "proj/d/x.txt": "xy"})
    )
    assert tree(dest) == {"main.py", "d", "d/x.txt"}
    assert (dest / "main.py").read_text() == "print(1)\n"
    assert written == len("print(1)\n") + 2


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a/x.py": "1", "b/y.py": "2"}, {"a", "a/x.py", "b", "b/y.py"}),
        ({"proj/x.py": "1", "README": "r"}, {"proj", "proj/x.py", "README"}),
        ({"main.py": "1"}, {"main.py"}),
    ],
)
def test_working_dir_is_not_stripped_without_a_single_top_folder(
    tmp_path: Path, files: dict[str, str], expected: set[str]
) -> None:
    dest, _ = extract(tmp_path, make_zip(files))
    assert tree(dest) == expected


def test_py_modules_are_not_stripped(tmp_path: Path) -> None:
    dest, _ = extract(tmp_path, make_zip({"mymod/__init__.py": "V = 1\n"}), strip=False)
    assert (dest / "mymod" / "__init__.py").read_text() == "V = 1\n"


def test_exec_bits_are_preserved(tmp_path: Path) -> None:
    data = zip_with_infos(
        [("run.sh", stat.S_IFREG | 0o755, b"#!/bin/sh\n"), ("data.txt", stat.S_IFREG | 0o644, b"d")]
    )
    dest, _ = extract(tmp_path, data, strip=False)
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755
    assert os.access(dest / "run.sh", os.X_OK)
    assert stat.S_IMODE((dest / "data.txt").stat().st_mode) == 0o644


def test_symlinks_that_stay_inside_are_created_and_work(tmp_path: Path) -> None:
    data = make_zip(
        {"proj/data/x.txt": "hello", "proj/sub/keep.txt": "k"},
        symlinks={"proj/link.txt": "data/x.txt", "proj/sub/up": "../data", "proj/self": "."},
    )
    dest, written = extract(tmp_path, data)
    assert (dest / "link.txt").is_symlink()
    assert os.readlink(dest / "link.txt") == "data/x.txt"
    assert (dest / "link.txt").read_text() == "hello"
    assert (dest / "sub" / "up" / "x.txt").read_text() == "hello"
    assert (dest / "self" / "data" / "x.txt").read_text() == "hello"
    targets = len("data/x.txt") + len("../data") + len(".")
    assert written == len("hello") + len("k") + targets
    assert_nothing_outside(tmp_path)


def test_return_value_equals_bytes_written(tmp_path: Path) -> None:
    files = {f"m/f{i}.bin": bytes([i]) * (1000 * i + 7) for i in range(5)}
    dest, written = extract(tmp_path, make_zip(files), strip=False)
    on_disk = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert written == on_disk == sum(len(v) for v in files.values())


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("/etc/evil", "has an absolute path"),
        ("\\evil", "has an absolute path"),
        ("C:/evil", "has an absolute path"),
        ("../evil", "climbs out of the destination with '..'"),
        ("proj/../../evil", "climbs out of the destination with '..'"),
        ("proj\\..\\..\\evil", "climbs out of the destination with '..'"),
    ],
)
def test_entry_paths_that_escape_are_refused(tmp_path: Path, name: str, needle: str) -> None:
    data = zip_with_infos([("proj/ok.txt", stat.S_IFREG | 0o644, b"ok"), (name, 0o100644, b"x")])
    message = refused(tmp_path, data)
    assert needle in message
    assert repr(name) in message
    assert not (tmp_path / "box").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("l", "/etc/passwd"),
        ("proj/l", "/tmp"),
        ("l", "C:/x"),
        ("l", ".."),
        ("a/l", "../../x"),
        ("a/b/l", "../../../etc"),
        ("a/l", "./../.."),
    ],
)
def test_symlinks_pointing_outside_are_refused(tmp_path: Path, link: str, target: str) -> None:
    data = make_zip({"a/b/f.txt": "f"}, symlinks={link: target})
    message = refused(tmp_path, data, strip=False)
    assert f"points to {target!r}, outside the package" in message
    assert not (tmp_path / "box" / "dest" / link).is_symlink()


def test_chained_symlink_escape_through_a_self_link_is_refused(tmp_path: Path) -> None:
    """p -> "." makes p/x -> ".." lexically harmless but really the parent of dest."""
    data = make_zip({"f.txt": "f"}, symlinks={"p": ".", "p/x": ".."})
    message = refused(tmp_path, data, strip=False)
    assert "outside the package" in message or "collides" in message
    assert not (tmp_path / "box" / "dest" / "x").is_symlink()


def test_chained_symlink_escape_in_reverse_order_is_refused(tmp_path: Path) -> None:
    data = make_zip({"f.txt": "f"}, symlinks={"p/x": "..", "p": "."})
    message = refused(tmp_path, data, strip=False)
    assert "collides with another entry" in message


def test_file_under_a_chained_symlink_escape_is_refused(tmp_path: Path) -> None:
    """Files are written before links, so p/x/evil lands in a real dir and p collides."""
    data = make_zip({"p/x/evil": "e"}, symlinks={"p": ".", "p/x": ".."})
    message = refused(tmp_path, data, strip=False)
    assert "collides with another entry" in message
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "box" / "evil").exists()


def test_symlink_made_escaping_by_a_later_link_is_refused(tmp_path: Path) -> None:
    """a -> "q/.." resolves inside while q is missing; once q -> "." exists, a is dest's parent."""
    data = make_zip({"f.txt": "f"}, symlinks={"a": "q/..", "q": "."})
    message = refused(tmp_path, data, strip=False)
    assert "outside the package" in message


def test_too_many_entries_is_refused_naming_the_limit(tmp_path: Path) -> None:
    data = make_zip({f"m/{i}.txt": "x" for i in range(4)})
    message = refused(tmp_path, data, limits=ArchiveLimits(max_entries=3))
    assert "has 4 entries; the limit is 3 (max_entries)" in message
    extract(tmp_path, data, limits=ArchiveLimits(max_entries=4))


def test_too_many_declared_bytes_is_refused_naming_the_limit(tmp_path: Path) -> None:
    data = make_zip({"a.bin": b"a" * 60, "b.bin": b"b" * 41})
    message = refused(tmp_path, data, limits=ArchiveLimits(max_uncompressed_bytes=100))
    assert "would unpack to 101 bytes; the limit is 100 (max_uncompressed_bytes)" in message
    assert not (tmp_path / "box").exists()


def test_high_compression_ratio_above_the_floor_is_refused(tmp_path: Path) -> None:
    data = make_zip({"zeros.bin": bytes(20 * 1024 * 1024)})
    assert len(data) * 200 < 20 * 1024 * 1024
    limits = ArchiveLimits(ratio_floor_bytes=1024 * 1024)
    message = refused(tmp_path, data, limits=limits)
    assert "times its own size" in message
    assert "the limit is 200 (max_ratio)" in message
    assert not (tmp_path / "box").exists()


def test_high_ratio_below_the_floor_is_allowed(tmp_path: Path) -> None:
    data = make_zip({"zeros.bin": bytes(1024 * 1024)})
    assert len(data) * 200 < 1024 * 1024
    dest, written = extract(tmp_path, data, limits=ArchiveLimits(ratio_floor_bytes=2 * 1024**2))
    assert written == 1024 * 1024
    assert (dest / "zeros.bin").stat().st_size == 1024 * 1024


@pytest.mark.parametrize("data", [b"not a zip at all", b"PK\x03\x04truncated", b""])
def test_not_a_zip_is_refused(tmp_path: Path, data: bytes) -> None:
    assert "is not a readable zip archive" in refused(tmp_path, data)


@pytest.mark.parametrize("kind", [stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK])
def test_special_file_entries_are_refused(tmp_path: Path, kind: int) -> None:
    data = zip_with_infos([("ok.txt", stat.S_IFREG | 0o644, b"ok"), ("dev", kind | 0o644, b"")])
    message = refused(tmp_path, data, strip=False)
    assert "entry 'dev' is a special file" in message
    assert f"{kind | 0o644:o}" in message
    assert not (tmp_path / "box").exists()


# -- remove_tree --------------------------------------------------------------------------------


def test_remove_tree_removes_directories_files_and_ignores_missing(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_text("x")
    f = tmp_path / "f"
    f.write_text("y")
    remove_tree(d)
    remove_tree(f)
    remove_tree(tmp_path / "missing")
    assert os.listdir(tmp_path) == []


def test_remove_tree_on_a_symlink_removes_the_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("k")
    link = tmp_path / "link"
    link.symlink_to(target)
    remove_tree(link)
    assert not link.is_symlink()
    assert (target / "keep").read_text() == "k"


@pytest.mark.parametrize("flip", [(60, 200), (40, 41)], ids=["deflate-stream", "one-byte"])
def test_corrupt_deflate_stream_is_unsafe_archive_not_a_raw_zlib_error(
    tmp_path: Path, flip: tuple[int, int]
) -> None:
    """A body corrupted in transit (zlib.error, EOFError inside zipfile) is refused as a zip."""
    data = bytearray(make_zip({"m/__init__.py": os.urandom(4000).hex()}))
    for i in range(*flip):
        data[i] ^= 0xFF
    message = refused(tmp_path, bytes(data), strip=False)
    assert "zip" in message
