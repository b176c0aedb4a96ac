"""Unit tests for safe zip extraction on real zip files, and for remove_tree."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agent.install.unpack.write as zip_write_module
from agent.core.errors import FailedPrecondition, UnsafeArchive
from agent.install.disk.modes import harden_tree, make_dir, refused_unless_disk_full
from agent.install.disk.root import remove_tree
from agent.install.unpack.archive import extract_zip
from agent.install.unpack.plan import ArchiveLimits
from agent.install.unpack.stop import Stopped
from tests.harness.packages import make_zip, zip_with_infos

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


# -- modes: the agent's, whatever the archive and the umask -----------------------------------


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run the block under ``mask`` (process-wide: only for these short, single-threaded tests)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


HOSTILE_ENTRIES = [
    ("m/open.py", stat.S_IFREG | 0o777, b"x"),
    ("m/rw.txt", stat.S_IFREG | 0o666, b"x"),
    ("m/suid", stat.S_IFREG | 0o4755, b"x"),
    ("m/sgid", stat.S_IFREG | 0o2755, b"x"),
    ("m/sticky", stat.S_IFREG | 0o1644, b"x"),
    ("m/owner_x_only", stat.S_IFREG | 0o100, b"x"),
    ("m/read_only", stat.S_IFREG | 0o444, b"x"),
    ("m/no_mode", 0, b"x"),
    ("m/open_dir/", stat.S_IFDIR | 0o777, b""),
    ("m/sticky_dir/", stat.S_IFDIR | 0o1777, b""),
    ("m/closed_dir/", stat.S_IFDIR | 0o500, b""),
    ("m/implicit/deep/f.py", stat.S_IFREG | 0o666, b"x"),
]
EXPECTED_MODES = {
    "m/open.py": 0o755, "m/rw.txt": 0o644, "m/suid": 0o755, "m/sgid": 0o755,
    "m/sticky": 0o644, "m/owner_x_only": 0o755, "m/read_only": 0o644, "m/no_mode": 0o644,
    "m/open_dir": 0o755, "m/sticky_dir": 0o755, "m/closed_dir": 0o755,
    "m/implicit": 0o755, "m/implicit/deep": 0o755, "m/implicit/deep/f.py": 0o644, "m": 0o755,
}  # fmt: skip


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_files_get_0644_or_0755_and_folders_0755_whatever_the_zip_and_the_umask(
    tmp_path: Path, mask: int
) -> None:
    """0777, 0666, setuid, setgid and sticky entries, and any umask: nothing group or other
    writable, no special bit; an execute bit anywhere makes 0755."""
    with umask(mask):
        dest, _ = extract(tmp_path, zip_with_infos(HOSTILE_ENTRIES), strip=False)
    found = {str(p.relative_to(dest)): mode_of(p) for p in dest.rglob("*")}
    assert found == EXPECTED_MODES
    assert mode_of(dest) == 0o755


def test_the_tree_is_private_while_it_is_written(tmp_path: Path) -> None:
    """Under umask 000, a file being written is 0600 and the destination 0700 until the end:
    nobody can open a file for writing, or add one, before the modes are final."""
    seen: list[tuple[int, int]] = []
    real_write = zip_write_module.write_share

    def spy(*args: Any, **kwargs: Any) -> int:
        written = real_write(*args, **kwargs)
        dest = tmp_path / "box" / "dest"
        seen.append((mode_of(dest), mode_of(dest / "m" / "rw.txt")))
        return written

    with umask(0), pytest.MonkeyPatch.context() as mp:
        mp.setattr("agent.install.unpack.archive.write_share", spy)
        extract(tmp_path, zip_with_infos(HOSTILE_ENTRIES), strip=False)
    assert seen == [(0o700, 0o644)]  # rw.txt had its final mode before the tree opened up


def test_harden_tree_fixes_a_tree_built_under_umask_000_and_never_follows_a_link(
    tmp_path: Path,
) -> None:
    """A venv-like tree another program built: folders 0755, files 0644/0755, special bits gone;
    a link to a file or folder outside is left alone, and so is what it points to."""
    outside_file = tmp_path / "outside.txt"
    outside_file.write_text("o")
    outside_file.chmod(0o666)
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    outside_dir.chmod(0o777)
    top = tmp_path / "venv"
    with umask(0):
        (top / "bin").mkdir(parents=True)
        (top / "lib" / "site-packages" / "pkg").mkdir(parents=True)
        (top / "bin" / "tool").write_text("#!/bin/sh\n")
        (top / "bin" / "tool").chmod(0o4777)
        (top / "lib" / "site-packages" / "pkg" / "__init__.py").write_text("")
        (top / "pyvenv.cfg").write_text("home = /usr\n")
        (top / "pyvenv.cfg").chmod(0o2666)
        (top / "bin" / "python").symlink_to(outside_file)
        (top / "lib" / "out").symlink_to(outside_dir)
    harden_tree(top, LABEL)
    assert {str(p.relative_to(top)): mode_of(p) for p in top.rglob("*") if not p.is_symlink()} == {
        "bin": 0o755, "bin/tool": 0o755, "lib": 0o755, "lib/site-packages": 0o755,
        "lib/site-packages/pkg": 0o755, "lib/site-packages/pkg/__init__.py": 0o644,
        "pyvenv.cfg": 0o644,
    }  # fmt: skip
    assert mode_of(top) == 0o755
    assert mode_of(outside_file) == 0o666
    assert mode_of(outside_dir) == 0o777


def test_harden_tree_that_cannot_set_a_mode_is_a_failed_precondition_naming_the_file(
    tmp_path: Path,
) -> None:
    """chmod refused (a file of another user's in the tree): FailedPrecondition naming the file,
    not a raw OSError. (The tests run as root, so the refusal is simulated.)"""
    top = tmp_path / "venv"
    top.mkdir()
    (top / "f").write_text("x")
    (top / "f").chmod(0o666)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "chmod", _refuse)
        with pytest.raises(FailedPrecondition) as info:
            harden_tree(top, LABEL)
    assert LABEL in info.value.message
    assert str(top / "f") in info.value.message


def _refuse(path: object, mode: int, **_: object) -> None:
    raise PermissionError(1, "Operation not permitted", str(path))


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_make_dir_makes_0755_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    with umask(mask):
        make_dir(tmp_path / "uris")
    assert mode_of(tmp_path / "uris") == 0o755


@pytest.mark.parametrize(("before", "after"), [(0o777, 0o755), (0o1777, 0o755), (0o2770, 0o750),
                                               (0o700, 0o700), (0o755, 0o755)])  # fmt: skip
def test_make_dir_on_an_existing_folder_only_takes_loose_bits_away(
    tmp_path: Path, before: int, after: int
) -> None:
    """A root left by an agent started under umask 000 is fixed; a stricter choice is kept."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    folder.chmod(before)
    make_dir(folder)
    assert mode_of(folder) == after


def test_make_dir_where_a_file_lies_raises(tmp_path: Path) -> None:
    (tmp_path / "uris").write_text("not a folder")
    with pytest.raises(FileExistsError):
        make_dir(tmp_path / "uris")


def test_an_entry_that_unpacks_past_its_declared_size_is_refused_after_the_declared_bytes(
    tmp_path: Path,
) -> None:
    """A central directory that under-declares an entry (1 MiB declared as 10 bytes, so the
    size and ratio checks pass): no more than the declaration is written, then UnsafeArchive."""
    data = bytearray(make_zip({"m/big.bin": b"\0" * 1024**2}))
    central = data.rindex(b"PK\x01\x02")  # the one central directory header
    local = data.index(b"PK\x03\x04")
    data[central + 24 : central + 28] = (10).to_bytes(4, "little")  # uncompressed size
    data[local + 22 : local + 26] = (10).to_bytes(4, "little")
    with pytest.raises(UnsafeArchive) as info:
        extract(tmp_path, bytes(data), strip=False)
    assert LABEL in info.value.message
    written = tmp_path / "box" / "dest" / "m" / "big.bin"
    assert written.stat().st_size <= 10


def test_declared_size_of_a_zip_of_an_unsupported_version_is_zero_not_an_exception(
    tmp_path: Path,
) -> None:
    """A central directory asking for zip version 6.4 made zipfile raise NotImplementedError,
    which reached the client as INTERNAL (found by the property test); the extraction refuses
    such a zip with its own message."""
    from agent.install.unpack.plan import declared_size

    body = bytearray(make_zip({"proj/a.txt": "x"}))
    central = body.index(b"PK\x01\x02")
    body[central + 6 : central + 8] = (64).to_bytes(2, "little")  # version needed: 6.4
    archive = tmp_path / "v64.zip"
    archive.write_bytes(bytes(body))
    assert declared_size(archive) == 0
    with pytest.raises(UnsafeArchive, match="unsupported"):
        extract_zip(archive, tmp_path / "out", strip_top_level=True,
                    limits=ArchiveLimits(), label="v64")  # fmt: skip


def test_an_extraction_told_to_stop_ends_at_its_next_chunk_and_writes_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop`` (set when the install is cancelled) ends the extraction with Stopped, not an
    error of the archive, before the next file is written."""
    archive = tmp_path / "p.zip"
    archive.write_bytes(make_zip({f"f{n}.txt": "x" * 10 for n in range(5)}))
    stop = threading.Event()
    copy = zip_write_module._copy
    copied: list[str] = []

    def copy_then_stop(*args: Any) -> int:
        size = copy(*args)
        copied.append(args[1].rel.name)
        stop.set()  # the install is cancelled while the first file is written
        return size

    monkeypatch.setattr(zip_write_module, "_copy", copy_then_stop)
    dest = tmp_path / "out"
    with pytest.raises(Stopped):
        extract_zip(archive, dest, strip_top_level=False, limits=ArchiveLimits(), label=LABEL,
                    stop=stop)  # fmt: skip
    assert copied == ["f0.txt"]
    assert sorted(p.name for p in dest.iterdir()) == ["f0.txt"]


def test_an_entry_the_file_system_refuses_is_the_archives_fault(tmp_path: Path) -> None:
    """A file "a" and a file "a/b": the second cannot be written, an UnsafeArchive naming it."""
    message = refused(tmp_path, make_zip({"a": "x", "a/b": "y"}), strip=False)
    assert message.endswith(
        "entry 'a/b' cannot be written: File exists (it collides with another entry, or its "
        "name is not allowed here)"
    ), message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_passes_through_as_the_disks_fault(code: int) -> None:
    """The store frees room and says the disk is full; the package is not blamed."""
    with (
        pytest.raises(OSError, match=os.strerror(code)) as info,
        refused_unless_disk_full(ValueError),
    ):
        raise OSError(code, os.strerror(code))
    assert info.value.errno == code


def test_another_os_error_is_the_refusal_raised_from_it() -> None:
    refusal = refused_unless_disk_full(lambda e: ValueError(f"refused: {e.errno}"))
    with pytest.raises(ValueError, match=f"^refused: {errno.EACCES}$") as info, refusal:
        raise OSError(errno.EACCES, "denied")
    assert isinstance(info.value.__cause__, OSError)
