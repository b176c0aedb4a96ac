"""Ray's folders as links to this agent's packages (``agent.state.ray_folders``): the plan by
kind, and a sync that makes exactly the links wanted and touches nothing but links."""

from __future__ import annotations

from pathlib import Path

from agent.core.uris import UriKind
from agent.state.ray_folders import ALWAYS, FOLDERS, plan, sync


def test_every_kind_has_a_ray_folder_and_rays_checked_folders_are_always_planned() -> None:
    assert set(FOLDERS) == set(UriKind)
    wanted = plan([])
    assert set(ALWAYS) <= set(wanted)
    assert all(links == {} for links in wanted.values())


def test_the_plan_puts_each_package_in_its_kinds_folder_by_its_folders_name() -> None:
    wd, whl = Path("/r/uris/working_dir-aa"), Path("/r/uris/py_modules_wheel-bb")
    wanted = plan([(UriKind.WORKING_DIR, wd), (UriKind.PY_MODULES_WHEEL, whl)])
    assert wanted["working_dir_files"] == {"working_dir-aa": wd}
    assert wanted["py_modules_files"] == {"py_modules_wheel-bb": whl}


def test_sync_adds_and_removes_links_and_leaves_other_files_alone(tmp_path: Path) -> None:
    pkg_a, pkg_b = tmp_path / "uris" / "working_dir-a", tmp_path / "uris" / "working_dir-b"
    pkg_a.mkdir(parents=True)
    pkg_b.mkdir()
    base = tmp_path / "runtime_resources"
    sync(base, plan([(UriKind.WORKING_DIR, pkg_a), (UriKind.WORKING_DIR, pkg_b)]))
    folder = base / "working_dir_files"
    assert sorted(p.name for p in folder.iterdir()) == ["working_dir-a", "working_dir-b"]
    assert (folder / "working_dir-a").resolve() == pkg_a.resolve()
    assert all((base / name).is_dir() for name in ALWAYS)
    (folder / "someone.lock").write_text("")  # not ours: kept
    sync(base, plan([(UriKind.WORKING_DIR, pkg_b)]))  # a evicted
    assert sorted(p.name for p in folder.iterdir()) == ["someone.lock", "working_dir-b"]
    assert pkg_a.is_dir(), "the package itself is never touched"
    sync(base, plan([]))
    assert sorted(p.name for p in folder.iterdir()) == ["someone.lock"]
