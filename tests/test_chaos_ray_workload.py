"""The Ray chaos run's workload (scripts/chaosray/workload.py) and its driver's pure parts
(scripts/chaosray/driver.py): the material is seeded and deterministic, its wheels are wheels
pip and uv take (RECORD checked here entry by entry), its zips unpack (top folder stripped, as
Ray strips an http zip's) to what the cases expect, the cases share their packages, and the
driver's look reports exactly the files missing, extra or changed, and plans every case once
before any twice."""

from __future__ import annotations

import importlib
import io
import json
import re
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the runner's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from chaosray.driver import differences, look, plan  # noqa: E402
from chaosray.workload import (  # noqa: E402
    Material,
    env_cases,
    material,
    record_digest,
    wheel_file,
)

BASE = "http://127.0.0.1:8765"
MiB = 1024 * 1024
_WHEEL_NAME = re.compile(r"[a-z_]+-1\.0-py3-none-any\.whl")


def _unpacked(body: bytes) -> dict[str, bytes]:
    """A zip's files as Ray unpacks an http zip: a single top folder stripped."""
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        files = {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}
    tops = {name.split("/")[0] for name in files}
    if len(tops) == 1 and all("/" in name for name in files):
        return {name.partition("/")[2]: data for name, data in files.items()}
    return files


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_material_is_deterministic_for_a_seed_and_differs_across_seeds() -> None:
    one, again, other = material(7), material(7), material(8)
    assert one.files == again.files
    assert one.wheels == again.wheels
    assert one.routes() == again.routes(), "the same seed: the same bytes, so the same URIs"
    assert set(one.files) == set(other.files)
    assert set(one.wheels) == set(other.wheels)
    for path, body in one.files.items():
        assert body != other.files[path], path
    for name, body in one.wheels.items():
        assert body != other.wheels[name], name


def test_the_sizes_are_small_but_one_working_dir_has_bytes_for_eviction() -> None:
    made = material(1)
    sizes = {path: len(body) for path, body in made.routes().items()}
    assert max(sizes.values()) < 2 * MiB, sizes
    big = [p for p, n in sizes.items() if n > MiB]
    assert big == ["/pkg/wd-a.zip"], sizes


def test_each_wheel_is_a_pep_427_wheel_whose_record_matches_every_entry() -> None:
    made = material(3)
    assert len(made.wheels) >= 3
    for name, body in made.wheels.items():
        assert _WHEEL_NAME.fullmatch(name), name
        dist = name.split("-")[0]
        info = f"{dist}-1.0.dist-info"
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            assert zf.testzip() is None
            entries = {n: zf.read(n) for n in zf.namelist()}
        meta = entries[f"{info}/METADATA"].decode()
        assert f"Name: {dist.replace('_', '-')}\n" in meta
        assert "Version: 1.0\n" in meta
        assert "Requires-Dist" not in meta, "no dependency: pip --target would ask an index"
        assert "Root-Is-Purelib: true" in entries[f"{info}/WHEEL"].decode()
        lines = entries[f"{info}/RECORD"].decode().splitlines()
        record = {line.split(",")[0]: line.split(",")[1:] for line in lines}
        assert set(record) == set(entries), name
        assert record[f"{info}/RECORD"] == ["", ""]
        for entry, data in entries.items():
            if entry != f"{info}/RECORD":
                assert record[entry] == [f"sha256={record_digest(data)}", str(len(data))], entry
        package = {
            n.removeprefix(f"{dist}/"): d for n, d in entries.items() if n.startswith(f"{dist}/")
        }
        assert f"{dist}/__init__.py" in entries, "a package folder, importable"
        assert made.modules[dist] == {p: _sha(d) for p, d in package.items()}


def test_each_zip_unpacks_to_its_tree_and_a_module_zip_to_its_package_folder() -> None:
    made = material(5)
    for path, body in made.files.items():
        files = _unpacked(body)
        assert made.trees[path] == {p: _sha(d) for p, d in files.items()}, path
        if "/mod-" in path:
            (top,) = {p.split("/")[0] for p in files}
            assert top.startswith("chaos_mod_"), path
    with zipfile.ZipFile(io.BytesIO(made.files["/pkg/wd-c.zip"])) as zf:
        assert len({n.split("/")[0] for n in zf.namelist()}) > 1, "several top entries: kept"
    with zipfile.ZipFile(io.BytesIO(made.files["/pkg/wd-a.zip"])) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2020, 1, 1, 0, 0, 0)}


def test_the_index_pages_link_each_wheel_with_its_digest() -> None:
    made = material(2)
    pages = made.pages()
    assert set(pages) == {f"/simple/{n.split('-')[0].replace('_', '-')}/" for n in made.wheels}
    for name, body in made.wheels.items():
        page = pages[f"/simple/{name.split('-')[0].replace('_', '-')}/"].decode()
        assert f'href="/files/{name}#sha256={_sha(body)}"' in page


def _cases(made: Material) -> list[tuple[str, dict[str, object], dict[str, dict[str, str]]]]:
    return [(c.name, c.runtime_env, c.expect) for c in env_cases(made, BASE)]


def test_the_cases_are_json_and_name_only_what_is_served_and_what_they_expect() -> None:
    made = material(4)
    cases = env_cases(made, BASE)
    assert 12 <= len(cases) <= 16
    assert len({c.name for c in cases}) == len(cases)
    assert _cases(made) == _cases(material(4)), "pure"
    routes = made.routes()
    for case in cases:
        env = json.loads(json.dumps(case.runtime_env))
        assert env == case.runtime_env
        assert env["env_vars"] == {"PYTHONDONTWRITEBYTECODE": "1", "CHAOS_ENV": case.name}
        urls = [env["working_dir"]] if "working_dir" in env else []
        urls += env.get("py_modules", [])
        served = [u.removeprefix(BASE) for u in urls]
        assert all(u.startswith(BASE + "/") for u in urls)
        assert all(p in routes for p in case.paths), case.paths
        assert ("working_dir" in env) == ("working_dir" in case.expect)
        if "working_dir" in env:
            assert case.expect["working_dir"] == made.trees[env["working_dir"].removeprefix(BASE)]
        for tool in ("pip", "uv"):
            if tool in env:
                options = env[tool][
                    "pip_install_options" if tool == "pip" else "uv_pip_install_options"
                ]
                assert options == ["--index-url", f"{BASE}/simple"]
                for requirement in env[tool]["packages"]:
                    dist = requirement.split("==")[0].replace("-", "_")
                    assert case.expect[f"module:{dist}"] == made.modules[dist]
                    served += [f"/simple/{dist.replace('_', '-')}/", f"/files/{wheel_file(dist)}"]
        assert sorted(case.paths) == sorted(set(served)), "each path it downloads, once"
        modules = [s for s in case.expect if s.startswith("module:")]
        assert len(case.expect) == len(modules) + ("working_dir" in env), case.expect
        assert all(case.expect[s] for s in case.expect), "no empty section"


def test_every_kind_is_there_and_every_package_is_shared_by_two_cases_or_more() -> None:
    made = material(6)
    cases = env_cases(made, BASE)
    names = [c.name for c in cases]
    for prefix in ("wd-", "mods-zip-", "mods-whl-", "pip-", "uv-", "mix-"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert sum(n.startswith(("pip-", "uv-")) for n in names) <= 4, "each venv build costs seconds"
    uses = Counter(p for c in cases for p in c.paths if not p.endswith("/"))
    packages = set(made.files) | {f"/files/{n}" for n in made.wheels}
    assert set(uses) == packages, "every package is used"
    assert min(uses.values()) >= 2, uses
    wheels_in_py_modules = {
        p for c in cases for p in c.runtime_env.get("py_modules", []) if p.endswith(".whl")
    }
    assert len(wheels_in_py_modules) >= 2
    mixed = [c for c in cases if "working_dir" in c.runtime_env and "py_modules" in c.runtime_env]
    assert mixed


def _write(folder: Path, files: dict[str, bytes]) -> dict[str, str]:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return {rel: _sha(data) for rel, data in files.items()}


def test_differences_names_exactly_the_missing_extra_and_changed_files(tmp_path: Path) -> None:
    expect = _write(tmp_path, {"a.txt": b"a", "d/b.bin": b"b", "d/e/c.py": b"c"})
    assert differences(str(tmp_path), expect) == []
    (tmp_path / "d" / "b.bin").unlink()
    (tmp_path / "d" / "e" / "c.py").write_bytes(b"C")
    (tmp_path / "d" / "new.txt").write_bytes(b"n")
    assert differences(str(tmp_path), expect) == [
        "missing d/b.bin", "changed d/e/c.py", "extra d/new.txt",
    ]  # fmt: skip
    (tmp_path / "d" / "new.txt").unlink()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"x")
    assert differences(str(tmp_path), expect, skip_pycache=True) == [
        "missing d/b.bin", "changed d/e/c.py",
    ]  # fmt: skip
    assert "extra __pycache__/a.pyc" in differences(str(tmp_path), expect)
    assert differences(str(tmp_path / "gone"), {"x": "0"}) == ["missing x"]


def test_look_reads_the_cwd_and_each_module_and_says_when(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    tree = _write(wd, {"f.txt": b"f"})
    mods = tmp_path / "mods"
    package = mods / "chaos_look_probe"
    package.mkdir(parents=True)
    init = _write(package, {"__init__.py": b"VALUE = 1\n"})
    monkeypatch.chdir(wd)
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delitem(sys.modules, "chaos_look_probe", raising=False)
    expect = {"working_dir": tree, "module:chaos_look_probe": init}
    try:
        assert look(expect, "start") == []
        (wd / "f.txt").unlink()
        (package / "x.py").write_bytes(b"")
        assert look(expect, "end") == [
            "end: module:chaos_look_probe: extra x.py",
            "end: working_dir: missing f.txt",
        ]
        said = look({"module:chaos_no_such_module": {}}, "start")
        assert said == [
            "start: module:chaos_no_such_module: import failed: ModuleNotFoundError: "
            "No module named 'chaos_no_such_module'"
        ]
    finally:
        sys.modules.pop("chaos_look_probe", None)
        importlib.invalidate_caches()


def test_plan_runs_every_case_once_before_any_twice_seeded() -> None:
    units = plan(5, 12, seed=3, round_=1, actor_share=0.5, hold_s=[0.1, 0.4])
    assert len(units) == 12
    assert sorted(u.case for u in units[:5]) == list(range(5))
    assert sorted(u.case for u in units[5:10]) == list(range(5))
    assert all(0.1 <= u.hold_s <= 0.4 for u in units)
    assert {u.how for u in units} == {"task", "actor"}
    assert units == plan(5, 12, seed=3, round_=1, actor_share=0.5, hold_s=[0.1, 0.4])
    assert units != plan(5, 12, seed=3, round_=2, actor_share=0.5, hold_s=[0.1, 0.4])
    assert {u.how for u in plan(5, 9, 3, 1, 0.0, [0, 0])} == {"task"}
    assert {u.how for u in plan(5, 9, 3, 1, 1.0, [0, 0])} == {"actor"}
    assert plan(0, 4, 3, 1, 0.5, [0, 1]) == []
