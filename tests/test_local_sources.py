"""Package lines naming files and folders of the node (issue 37): each form Ray's agent passes to
pip taken by ``pip`` and ``uv`` alike, checked against the allowed roots, refused forms named
with the way that works, and the venv keyed by the bytes read (what was opened, bounded), never
by the path: a wheel rebuilt at one path is another venv, the same bytes at two paths one."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.core.errors import AgentError, InvalidRuntimeEnv, PackageRejected, PermissionDenied
from agent.core.pip_spec import PipSpec, parse_pip
from agent.core.roots import FileRoots
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uv_spec import parse_uv
from agent.install.venvs import local_read
from tests.harness.pip_wheels import local_project
from tests.harness.uv_wheels import module_wheel

WHEEL = "/srv/allowed/w/tinydep-0.1.0-py3-none-any.whl"
ROOTS = ("/srv/allowed",)


def pip_spec(packages: list[str], roots: tuple[str, ...] = ()) -> PipSpec:
    parsed = parse_pip(packages, file_roots=roots)
    assert parsed is not None
    return parsed


def refusal(packages: list[str], roots: tuple[str, ...] = ()) -> AgentError:
    with pytest.raises(AgentError) as refused:
        parse_pip(packages, file_roots=roots)
    return refused.value


def keyed(spec: PipSpec, roots: tuple[str, ...] = ()) -> str:
    """The venv's key once the create read the sources' bytes."""
    contents = local_read.read_digests(spec.sources, FileRoots.of(roots), "t", threading.Event())
    return dataclasses.replace(spec, contents=contents).uri


# -- the forms taken ---------------------------------------------------------------------------

TAKEN = [
    (WHEEL, "archive", WHEEL),
    ("/srv/allowed/sd/proj-1.0.tar.gz", "archive", "/srv/allowed/sd/proj-1.0.tar.gz"),
    ("/srv/allowed/sd/proj-1.0.zip", "archive", "/srv/allowed/sd/proj-1.0.zip"),
    ("/srv/allowed/proj", "folder", "/srv/allowed/proj"),
    ("/srv/allowed/proj/[Extra_One]", "folder", "/srv/allowed/proj[extra-one]"),
    ("file:///srv/allowed/my%20proj/", "folder", "/srv/allowed/my proj"),
    (f"tinydep @ file://{WHEEL}", "archive", f"tinydep @ file://{WHEEL}"),
    ("proj[b,a] @ file:///srv/allowed/proj", "folder", "proj[a,b] @ file:///srv/allowed/proj"),
    ("-e /srv/allowed/proj", "editable", "-e /srv/allowed/proj"),
    ("--editable=file:///srv/allowed/proj[dev]", "editable", "-e /srv/allowed/proj[dev]"),
]


@pytest.mark.parametrize(("line", "form", "normal"), TAKEN, ids=[t[0] for t in TAKEN])
@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_each_local_form_ray_passes_to_pip_is_taken_by_pip_and_uv(
    tool: str, line: str, form: str, normal: str
) -> None:
    """Before: every form but ``name @ file://`` was 'not a requirement'."""
    parse = parse_pip if tool == "pip" else parse_uv
    spec = parse(["requests", line], file_roots=ROOTS)
    assert spec is not None
    assert spec.packages == ("requests",)
    (source,) = spec.sources
    assert (source.form.value, source.line) == (form, normal)
    assert spec.canonical()["packages"] == sorted(["requests", normal])


def test_bare_remote_urls_are_taken_as_pip_takes_them() -> None:
    lines = ["https://host/a-1.0-py3-none-any.whl", "git+https://host/r.git@v1#egg=r"]
    assert pip_spec(lines, ROOTS).packages == tuple(sorted(lines))


def test_two_spellings_of_one_path_are_one_env() -> None:
    def env_id(line: str) -> str:
        return parse_runtime_env(json.dumps({"pip": [line, "b"]}), EnvLimits()).env_id

    assert env_id("/srv/p/../p/[B,a]") == env_id("/srv/p[a,b]")
    assert env_id("file:///srv/p/") == env_id("/srv/p")
    assert env_id("/srv/p") != env_id("/srv/q")


def test_a_set_naming_local_sources_has_no_key_until_their_bytes_are_read() -> None:
    """Its venv is derived at create (a pure parse cannot read files): the env lists no pip
    package, and asking the set's key before its bytes are read is a bug."""
    env = parse_runtime_env(json.dumps({"pip": [WHEEL, "requests"]}), EnvLimits())
    assert env.packages == ()
    assert env.derives_venv
    assert env.local_venv is not None
    assert env.local_venv.sources
    with pytest.raises(AssertionError, match="keyed once their bytes are read"):
        _ = env.local_venv.uri
    plain = parse_runtime_env(json.dumps({"pip": ["requests"]}), EnvLimits())
    assert plain.local_venv is None
    assert len(plain.packages) == 1


# -- refused, each saying what works ---------------------------------------------------------


_RELATIVE = ("relative path", "absolute path on the node")
_OUTSIDE = ("allow-file-root",)
REFUSED: list[tuple[str, type[AgentError], tuple[str, ...]]] = [
    ("./pkg", InvalidRuntimeEnv, _RELATIVE),
    ("../dist/x-1.0.tar.gz", InvalidRuntimeEnv, _RELATIVE),
    ("dist/x-1.0-py3-none-any.whl", InvalidRuntimeEnv, _RELATIVE),
    ("x-1.0-py3-none-any.whl", InvalidRuntimeEnv, _RELATIVE),
    ("~/pkg", InvalidRuntimeEnv, _RELATIVE),
    ("-e ./pkg", InvalidRuntimeEnv, _RELATIVE),
    ("--editable=pkg/", InvalidRuntimeEnv, _RELATIVE),
    (f"{WHEEL} ; python_version >= '3'", InvalidRuntimeEnv, ("name @ file:///abs/path ; marker",)),
    ("-e git+https://host/r.git#egg=r", InvalidRuntimeEnv, ("pip.pip_install_options",)),
    ("--no-deps", InvalidRuntimeEnv, ("pip.pip_install_options",)),
    ("/srv/elsewhere/x-1.0-py3-none-any.whl", PermissionDenied, _OUTSIDE),
    ("/srv/allowed/../elsewhere/proj", PermissionDenied, _OUTSIDE),
    ("file:///srv/allowed/%2E%2E/elsewhere/proj", PermissionDenied, _OUTSIDE),
    ("-e /srv/allowed-not/proj", PermissionDenied, _OUTSIDE),
]


@pytest.mark.parametrize(("line", "kind", "words"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_form_is_named_with_the_way_that_works(
    line: str, kind: type[AgentError], words: tuple[str, ...]
) -> None:
    """A relative path names nothing where Ray's agent runs pip (an empty folder of its own);
    a marker after a path, an option line, an editable VCS checkout have a form that works;
    outside the allowed roots, a local source is refused as every local place is."""
    refused = refusal([line], ROOTS)
    assert isinstance(refused, kind), refused
    assert line.removeprefix("-e ") in refused.message
    for word in words:
        assert word in refused.message


def test_an_option_line_uv_does_not_read_in_a_requirements_file_names_uvs_options_field() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"pass any other in uv\.uv_pip_install_options"):
        parse_uv(["--upgrade", "a"], file_roots=ROOTS)


def test_an_editable_folder_needs_an_allowed_root_as_the_option_does() -> None:
    refused = refusal(["-e /srv/allowed/proj"])
    assert isinstance(refused, PermissionDenied)
    assert "allow-file-root" in refused.message
    assert "drop '-e'" in refused.message
    assert pip_spec(["-e /srv/allowed/proj"], ROOTS).sources


def test_without_roots_a_local_source_anywhere_is_taken_as_before() -> None:
    assert pip_spec(["/anywhere/x-1.0-py3-none-any.whl", "/anywhere/proj"]).sources


# -- the key: the bytes read -------------------------------------------------------------------


def test_a_wheel_rebuilt_at_the_same_path_is_another_venv(tmp_path: Path) -> None:
    wheel = module_wheel(tmp_path, "tinydep", "one")
    spec = pip_spec([str(wheel)])
    first = keyed(spec)
    assert keyed(spec) == first, "read again, unchanged: the same venv"
    module_wheel(tmp_path, "tinydep", "two")
    assert keyed(spec) != first


def test_the_same_bytes_at_two_paths_are_one_venv(tmp_path: Path) -> None:
    wheel = module_wheel(tmp_path, "tinydep", "one")
    (tmp_path / "copy").mkdir()
    shutil.copy(wheel, tmp_path / "copy" / wheel.name)
    here, there = pip_spec([str(wheel)]), pip_spec([str(tmp_path / "copy" / wheel.name)])
    assert here.canonical() != there.canonical(), "two envs: each names its own path"
    assert keyed(here) == keyed(there)


def test_a_folder_is_keyed_by_its_files_names_bytes_and_modes_not_their_times(
    tmp_path: Path,
) -> None:
    folder = local_project(tmp_path / "proj", "projmod", "one")
    spec = pip_spec([str(folder)])
    first = keyed(spec)
    os.utime(folder / "projmod" / "__init__.py", (1, 1))
    assert keyed(spec) == first, "a time is no content"
    changes: list[Callable[[], object]] = [
        lambda: (folder / "projmod" / "__init__.py").write_text("VALUE = 'two'\n"),
        lambda: (folder / "projmod" / "extra.py").write_text(""),
        lambda: os.chmod(folder / "local_backend.py", 0o755),
        lambda: os.symlink("projmod", folder / "alias"),
    ]
    seen = {first}
    for change in changes:
        change()
        seen.add(keyed(spec))
    assert len(seen) == 1 + len(changes), "each change is another venv"


def test_an_editable_folder_is_keyed_by_its_build_files_not_its_code(tmp_path: Path) -> None:
    """The code is read live from the folder (an editable install's point); its dependencies
    are in its build files."""
    folder = local_project(tmp_path / "proj", "projmod", "one")
    spec = pip_spec([f"-e {folder}"], (str(tmp_path),))
    first = keyed(spec, (str(tmp_path),))
    (folder / "projmod" / "__init__.py").write_text("VALUE = 'two'\n")
    assert keyed(spec, (str(tmp_path),)) == first
    (folder / "setup.cfg").write_text("[metadata]\n")
    assert keyed(spec, (str(tmp_path),)) != first


def test_past_the_entry_or_byte_limit_a_folder_is_refused_naming_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = local_project(tmp_path / "proj", "projmod", "one")
    spec = pip_spec([str(folder)])
    monkeypatch.setattr(local_read, "MAX_ENTRIES", 3)
    with pytest.raises(PackageRejected, match="past 3 files, folders and links"):
        keyed(spec)
    monkeypatch.setattr(local_read, "MAX_ENTRIES", 100)
    monkeypatch.setattr(local_read, "MAX_BYTES", 100)
    with pytest.raises(PackageRejected, match="more than 100 bytes"):
        keyed(spec)


@pytest.mark.timeout(30)
def test_a_fifo_as_the_wheel_or_in_the_folder_is_refused_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "x-1.0-py3-none-any.whl"
    os.mkfifo(fifo)
    with pytest.raises(PackageRejected, match="a FIFO"):
        keyed(pip_spec([str(fifo)]))
    folder = local_project(tmp_path / "proj", "projmod", "one")
    os.mkfifo(folder / "pipe")
    with pytest.raises(PackageRejected, match="'pipe' is a FIFO, socket or device"):
        keyed(pip_spec([str(folder)]))


def test_a_link_flipped_out_of_the_roots_after_the_parse_is_refused_on_what_was_opened(
    tmp_path: Path,
) -> None:
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    allowed.mkdir()
    elsewhere.mkdir()
    wheel = module_wheel(allowed, "tinydep", "in")
    outside = module_wheel(elsewhere, "tinydep", "out")
    link = allowed / "current" / wheel.name
    link.parent.mkdir()
    link.symlink_to(wheel)
    spec = pip_spec([str(link)], (str(allowed),))
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(PermissionDenied, match="allow-file-root"):
        keyed(spec, (str(allowed),))


def test_a_missing_source_is_not_found_and_a_file_for_a_folder_is_said_so(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="no such file on this node"):
        keyed(pip_spec([str(tmp_path / "gone-1.0-py3-none-any.whl")]))
    (tmp_path / "notes").write_text("")
    with pytest.raises(PackageRejected, match=r"is a file; a path not ending in \.whl"):
        keyed(pip_spec([str(tmp_path / "notes")]))


def test_the_copy_built_from_must_hold_the_bytes_the_key_names(tmp_path: Path) -> None:
    """Rebuilt between the create's read and the install's copy: refused, never a venv whose
    key names other bytes."""
    (tmp_path / "w").mkdir()
    wheel = module_wheel(tmp_path / "w", "tinydep", "one")
    folder = local_project(tmp_path / "proj", "projmod", "one")
    spec = pip_spec([str(wheel), str(folder)])
    contents = local_read.read_digests(spec.sources, FileRoots(), "t", threading.Event())
    argv = local_read.copy_sources(
        spec.sources, contents, FileRoots(), tmp_path / "copy", "t", threading.Event()
    )
    copies = [tmp_path / "copy" / str(i) / Path(s.path).name for i, s in enumerate(spec.sources)]
    assert sorted(argv) == sorted(map(str, copies))
    assert len(argv) == 2
    (copied,) = [c for c in copies if c.name == "proj"]
    assert (copied / "projmod" / "__init__.py").read_text() == "VALUE = 'one'\n"
    module_wheel(tmp_path / "w", "tinydep", "two")
    with pytest.raises(PackageRejected, match="changed since this create read it"):
        local_read.copy_sources(
            spec.sources, contents, FileRoots(), tmp_path / "again", "t", threading.Event()
        )
