"""Ray's folders as this agent fills them (``agent.state.ray_folders``): the plan by kind; a
sync that shows each package of files as a tree of hard links (what Ray's tools add up is what
is on disk, stored once), each venv as a link, and touches nothing but entries named as its own
packages."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.core.uris import UriKind
from agent.state.ray_folders import ALWAYS, Mirror, plan
from tests.harness.disk import rays_size

WD_A, WD_B = "working_dir-aaaaaaaaaaaa", "working_dir-bbbbbbbbbbbb"


def _package(root: Path, name: str, body: bytes = b"x" * 1000) -> Path:
    pkg = root / "uris" / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "main.py").write_bytes(body)
    (pkg / "sub" / "data.bin").write_bytes(body * 3)
    (pkg / "link.py").symlink_to("main.py")
    return pkg


def test_rays_checked_folders_are_always_planned_even_empty() -> None:
    wanted = plan([])
    assert set(ALWAYS) <= set(wanted)
    assert all(links == {} for links in wanted.values())


def test_the_plan_puts_each_package_in_its_kinds_folder_by_its_folders_name() -> None:
    wd, whl = Path("/r/uris/working_dir-aa"), Path("/r/uris/py_modules_wheel-bb")
    wanted = plan([(UriKind.WORKING_DIR, wd), (UriKind.PY_MODULES_WHEEL, whl)])
    assert wanted["working_dir_files"] == {"working_dir-aa": wd}
    assert wanted["py_modules_files"] == {"py_modules_wheel-bb": whl}


def test_a_package_of_files_is_a_tree_of_hard_links_that_rays_tools_count_in_full(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    Mirror(base).sync(plan([(UriKind.WORKING_DIR, pkg)]))
    tree = base / "working_dir_files" / WD_A
    assert tree.is_dir()
    assert not tree.is_symlink()
    assert rays_size(base / "working_dir_files") == rays_size(pkg) == 4000
    assert (tree / "main.py").stat().st_ino == (pkg / "main.py").stat().st_ino  # stored once
    assert (tree / "sub" / "data.bin").stat().st_ino == (pkg / "sub" / "data.bin").stat().st_ino
    assert os.readlink(tree / "link.py") == "main.py"  # a symlink stays a symlink
    assert all((base / name).is_dir() for name in ALWAYS)


def test_a_venv_is_a_link_and_a_package_gone_loses_its_entry_and_others_are_left_alone(
    tmp_path: Path,
) -> None:
    wd_a, wd_b = _package(tmp_path, WD_A), _package(tmp_path, WD_B)
    venv = _package(tmp_path, "ray_pip-cccccccccccc")
    base = tmp_path / "runtime_resources"
    mirror = Mirror(base)
    mirror.sync(
        plan([(UriKind.WORKING_DIR, wd_a), (UriKind.WORKING_DIR, wd_b), (UriKind.RAY_PIP, venv)])
    )
    assert (base / "pip" / venv.name).resolve() == venv.resolve()
    folder = base / "working_dir_files"
    (folder / "someone.lock").write_text("")  # not ours: kept
    (folder / "_ray_pkg_0123456789ab").mkdir()  # Ray's agent's name: kept
    mirror.sync(plan([(UriKind.WORKING_DIR, wd_b)]))  # a evicted, the venv too
    assert sorted(p.name for p in folder.iterdir()) == [
        "_ray_pkg_0123456789ab",
        "someone.lock",
        WD_B,
    ]
    assert not os.path.lexists(base / "pip" / venv.name)
    assert (wd_a / "main.py").read_bytes() == b"x" * 1000, "the package itself is never touched"
    mirror.sync(plan([]))
    assert sorted(p.name for p in folder.iterdir()) == ["_ray_pkg_0123456789ab", "someone.lock"]
    assert (wd_b / "main.py").stat().st_nlink == 1  # its tree's links are gone with it


def test_a_tree_made_elsewhere_or_from_a_replaced_package_is_made_anew(tmp_path: Path) -> None:
    pkg = _package(tmp_path, WD_A, b"old!" * 250)
    base = tmp_path / "runtime_resources"
    Mirror(base).sync(plan([(UriKind.WORKING_DIR, pkg)]))
    tree = base / "working_dir_files" / WD_A
    (tree / "planted.txt").write_text("not the package's")
    (base / "working_dir_files" / f".rtenv-building-{WD_B}-1").mkdir()  # a build cut short
    mirror = Mirror(base)  # another process: it did not make that tree
    mirror.sync(plan([(UriKind.WORKING_DIR, pkg)]))
    assert sorted(p.name for p in (base / "working_dir_files").iterdir()) == [WD_A]
    assert not (tree / "planted.txt").exists()
    os.rename(pkg, tmp_path / "trash")  # evicted and installed again between two passes
    pkg = _package(tmp_path, WD_A, b"new!" * 250)
    mirror.sync(plan([(UriKind.WORKING_DIR, pkg)]))
    assert (tree / "main.py").read_bytes() == b"new!" * 250
    assert (tree / "main.py").stat().st_ino == (pkg / "main.py").stat().st_ino


def test_where_no_hard_link_can_be_made_the_package_is_a_link_made_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    mirror = Mirror(base)
    monkeypatch.setattr(os, "link", no_links)
    mirror.sync(plan([(UriKind.WORKING_DIR, pkg)]))
    entry = base / "working_dir_files" / WD_A
    assert entry.is_symlink()
    assert entry.resolve() == pkg.resolve()
    made = entry.lstat().st_ino
    mirror.sync(plan([(UriKind.WORKING_DIR, pkg)]))
    assert entry.lstat().st_ino == made, "kept, not made again each pass"
    assert [p.name for p in (base / "working_dir_files").iterdir()] == [WD_A]  # no build left
