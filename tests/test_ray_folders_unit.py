"""Ray's folders as this agent fills them (``agent.state.ray_folders``): the plan by kind; a
sync that shows each package of files this agent used as a tree of hard links (what Ray's tools
add up is what is on disk, stored once), each venv as a link, a package on another file system
as a link; that keeps a peer's current entry of a package it did not use, removes what it no
longer shows, a build cut short by a dead builder (the crash point ``mid_ray_link``, in a real
process) and, at ``clear``, what it shows; that touches nothing but entries named as its own
packages; and which packages a node shows under Ray's cache sizes (``shown_here``)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.uris import UriKey, UriKind
from agent.crash import ENV_VAR
from agent.state.index import KindBudget
from agent.state.ray_folders import ALWAYS, Mirror, Wanted, plan, shown_here
from tests.harness.disk import rays_size, tmpfs

WD_A, WD_B = "working_dir-aaaaaaaaaaaa", "working_dir-bbbbbbbbbbbb"
WD = UriKind.WORKING_DIR


def _package(root: Path, name: str, body: bytes = b"x" * 1000) -> Path:
    pkg = root / "uris" / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "main.py").write_bytes(body)
    (pkg / "sub" / "data.bin").write_bytes(body * 3)
    (pkg / "link.py").symlink_to("main.py")
    return pkg


def _names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_rays_checked_folders_are_always_planned_even_empty() -> None:
    wanted = plan([])
    assert set(ALWAYS) <= set(wanted)
    assert all(links == {} for links in wanted.values())


def test_the_plan_puts_each_package_in_its_kinds_folder_by_its_folders_name() -> None:
    wd, whl = Path("/r/uris/working_dir-aa"), Path("/r/uris/py_modules_wheel-bb")
    wanted = plan([(WD, wd, True), (UriKind.PY_MODULES_WHEEL, whl, False)])
    assert wanted["working_dir_files"] == {"working_dir-aa": Wanted(wd, True)}
    assert wanted["py_modules_files"] == {"py_modules_wheel-bb": Wanted(whl, False)}


def test_a_package_of_files_is_a_tree_of_hard_links_that_rays_tools_count_in_full(
    tmp_path: Path,
) -> None:
    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    Mirror(base).sync(plan([(WD, pkg, True)]))
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
    mirror.sync(plan([(WD, wd_a, True), (WD, wd_b, True), (UriKind.RAY_PIP, venv, True)]))
    assert (base / "pip" / venv.name).resolve() == venv.resolve()
    folder = base / "working_dir_files"
    (folder / "someone.lock").write_text("")  # not ours: kept
    (folder / "_ray_pkg_0123456789ab").mkdir()  # Ray's agent's name: kept
    mirror.sync(plan([(WD, wd_b, True)]))  # a evicted, the venv too
    assert _names(folder) == ["_ray_pkg_0123456789ab", "someone.lock", WD_B]
    assert not os.path.lexists(base / "pip" / venv.name)
    assert (wd_a / "main.py").read_bytes() == b"x" * 1000, "the package itself is never touched"
    mirror.sync(plan([]))
    assert _names(folder) == ["_ray_pkg_0123456789ab", "someone.lock"]
    assert (wd_b / "main.py").stat().st_nlink == 1  # its tree's links are gone with it


def test_a_tree_made_elsewhere_or_from_a_replaced_package_is_made_anew(tmp_path: Path) -> None:
    pkg = _package(tmp_path, WD_A, b"old!" * 250)
    base = tmp_path / "runtime_resources"
    Mirror(base).sync(plan([(WD, pkg, True)]))
    tree = base / "working_dir_files" / WD_A
    (tree / "planted.txt").write_text("not the package's")
    mirror = Mirror(base)  # another process: it did not make that tree, and checks it
    mirror.sync(plan([(WD, pkg, True)]))
    assert _names(base / "working_dir_files") == [WD_A]
    assert not (tree / "planted.txt").exists()
    os.rename(pkg, tmp_path / "trash")  # evicted and installed again between two passes
    pkg = _package(tmp_path, WD_A, b"new!" * 250)
    mirror.sync(plan([(WD, pkg, True)]))
    assert (tree / "main.py").read_bytes() == b"new!" * 250
    assert (tree / "main.py").stat().st_ino == (pkg / "main.py").stat().st_ino


def test_a_package_not_used_here_gets_no_entry_and_a_peers_current_one_is_kept_till_evicted(
    tmp_path: Path,
) -> None:
    """Agents on one root: one that never used a package makes no entry of it; a peer's
    sharing the folder (checked file by file, once) is kept as it is, and so is a peer's build
    under way; once the root evicts the package, its entry goes."""
    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    folder = base / "working_dir_files"
    here = Mirror(base)
    here.sync(plan([(WD, pkg, False)]))
    assert _names(folder) == [], "a package this agent did not use"
    Mirror(base).sync(plan([(WD, pkg, True)]))  # a peer of this folder that uses it
    tree = folder / WD_A
    made = tree.stat().st_ino
    building = folder / f".rtenv-building-{WD_B}-{os.getppid()}"  # a live builder's
    building.mkdir()
    for shown in (False, True, True):  # kept as the peer made it, shown here or not
        here.sync(plan([(WD, pkg, shown)]))
        assert tree.stat().st_ino == made
        assert (tree / "main.py").stat().st_ino == (pkg / "main.py").stat().st_ino
    assert building.is_dir(), "a live builder's build is its own"
    here.sync(plan([]))
    assert _names(folder) == [building.name]


def test_what_is_no_longer_shown_here_goes_and_clear_removes_what_is_shown(
    tmp_path: Path,
) -> None:
    wd_a, wd_b = _package(tmp_path, WD_A), _package(tmp_path, WD_B)
    base = tmp_path / "runtime_resources"
    folder = base / "working_dir_files"
    mirror = Mirror(base)
    mirror.sync(plan([(WD, wd_a, True), (WD, wd_b, True)]))
    assert _names(folder) == [WD_A, WD_B]
    mirror.sync(plan([(WD, wd_a, False), (WD, wd_b, True)]))  # a out of this node's cache
    assert _names(folder) == [WD_B]
    (folder / "someone.lock").write_text("")
    mirror.clear()
    assert _names(folder) == ["someone.lock"]
    assert (wd_b / "main.py").stat().st_nlink == 1
    mirror.sync(plan([(WD, wd_a, True)]))
    assert _names(folder) == ["someone.lock"], "no sync after clear"


def test_a_node_shows_what_it_used_within_rays_cache_sizes_what_is_in_use_always() -> None:
    a, b, c = (UriKey(WD, f"gcs://{n}.zip") for n in "abc")
    venv = UriKey(UriKind.PIP, "p")
    assert shown_here([(a, 5, 1, False), (venv, 9, 1, False)], ()) == {a, venv}, "no cap"
    zero = KindBudget("RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB", frozenset({WD.value}), 0)
    used = [(a, 5, 1, True), (b, 5, 2, False), (venv, 9, 1, False)]
    assert shown_here(used, [zero]) == {a, venv}, "at 0: only what is in use here"
    ten = KindBudget("RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB", frozenset({WD.value}), 10)
    # Ray's test_hit_cache_size_limit: 8 unused beside 4 in use over a cap of 10: the 8 goes
    assert shown_here([(a, 8, 1, False), (b, 4, 2, True)], [ten]) == {b}
    # least recently used first, until the rest fits
    assert shown_here([(a, 4, 3, False), (b, 4, 1, False), (c, 4, 2, False)], [ten]) == {a, c}


def test_where_no_hard_link_can_be_made_the_package_is_a_link_made_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    mirror = Mirror(base)
    monkeypatch.setattr(os, "link", no_links)
    mirror.sync(plan([(WD, pkg, True)]))
    entry = base / "working_dir_files" / WD_A
    assert entry.is_symlink()
    assert entry.resolve() == pkg.resolve()
    made = entry.lstat().st_ino
    mirror.sync(plan([(WD, pkg, True)]))
    assert entry.lstat().st_ino == made, "kept, not made again each pass"
    assert _names(base / "working_dir_files") == [WD_A]  # no build left


def test_a_root_on_another_file_system_shows_links_kept_by_each_agent_and_removed(
    tmp_path: Path,
) -> None:
    """A root on a file system of its own (a real tmpfs: no hard link can cross): the package
    is a link in its folder of files, kept as it is at the next sync, and by another agent of
    the folder (a restart), and gone once evicted."""
    with tmpfs(1024 * 1024) as other:
        pkg = _package(other, WD_A)
        base = tmp_path / "runtime_resources"
        entry = base / "working_dir_files" / WD_A
        mirror = Mirror(base)
        mirror.sync(plan([(WD, pkg, True)]))
        assert entry.is_symlink()
        assert os.readlink(entry) == str(pkg)
        assert (entry / "sub" / "data.bin").read_bytes() == b"x" * 3000
        made = entry.lstat().st_ino
        mirror.sync(plan([(WD, pkg, True)]))
        Mirror(base).sync(plan([(WD, pkg, True)]))
        assert entry.lstat().st_ino == made, "kept, not made again"
        assert _names(base / "working_dir_files") == [WD_A]  # no build left
        mirror.sync(plan([]))
        assert _names(base / "working_dir_files") == []


_BUILD = """
import sys
from pathlib import Path
from agent.core.uris import UriKind
from agent.state.ray_folders import Mirror, plan
Mirror(Path(sys.argv[1])).sync(plan([(UriKind.WORKING_DIR, Path(sys.argv[2]), True)]))
"""


def test_a_tree_cut_short_at_mid_ray_link_is_never_shown_and_the_next_sync_makes_it_whole(
    tmp_path: Path,
) -> None:
    """A process killed (-9) at the crash point ``mid_ray_link``: its tree's temporary folder
    holds one link, nothing has the package's name; the next sync (another process: the
    agent restarted) removes the temporary folder and makes the tree whole."""
    pkg = _package(tmp_path, WD_A)
    base = tmp_path / "runtime_resources"
    folder = base / "working_dir_files"
    env = {**os.environ, ENV_VAR: "mid_ray_link"}
    done = subprocess.run(
        [sys.executable, "-c", _BUILD, str(base), str(pkg)],
        env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == -9, done.stderr
    [left] = _names(folder)
    assert left.startswith(f".rtenv-building-{WD_A}-"), left
    linked = [f for _, _, files in os.walk(folder / left) for f in files]
    assert len(linked) == 1, "killed after its first link"
    Mirror(base).sync(plan([(WD, pkg, True)]))
    assert _names(folder) == [WD_A]
    assert rays_size(folder) == rays_size(pkg)
