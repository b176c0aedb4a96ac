"""A uv run project's settings, checked before the agent builds its venv (pure but for
realpath): its own relative places are allowed, others only inside the allowed roots; a
workspace is left to uv; bad TOML and oversize files are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied
from agent.core.roots import FileRoots
from agent.core.uv_project import MAX_SETTINGS_BYTES, ProjectSettings, read_settings
from agent.core.uv_run import Passthrough

PROJECT = "/srv/root/uris/working_dir-abc"


def settings(text: str, *, roots: tuple[str, ...] = (), uv_toml: str | None = None) -> object:
    return read_settings(
        text.encode(), None if uv_toml is None else uv_toml.encode(), PROJECT, FileRoots.of(roots)
    )


BASE = '[project]\nname = "x"\nversion = "1"\n'


def test_a_virtual_project_with_its_own_find_links_is_allowed_anywhere() -> None:
    got = settings(BASE + '[tool.uv]\nfind-links = ["wheels"]\nno-index = true\n', roots=("/a",))
    assert got == ProjectSettings(
        is_package=False, find_links=("wheels",), index_urls=(), no_index=True
    )


def test_a_build_system_makes_a_package_unless_it_says_not() -> None:
    build = '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
    package = settings(BASE + build)
    assert isinstance(package, ProjectSettings)
    assert package.is_package
    virtual = settings(BASE + build + "[tool.uv]\npackage = false\n")
    assert isinstance(virtual, ProjectSettings)
    assert not virtual.is_package


@pytest.mark.parametrize(
    "setting",
    [
        'find-links = ["/elsewhere/wheels"]',
        'find-links = ["../../../../elsewhere"]',
        'find-links = ["file:///elsewhere/wheels"]',
        '[[tool.uv.index]]\nname = "local"\nurl = "/elsewhere/simple"',
        '[tool.uv.sources]\nlib = { path = "/elsewhere/lib" }',
        '[tool.uv.sources]\nlib = { git = "file:///elsewhere/repo" }',
    ],
)
def test_a_place_outside_the_allowed_roots_is_refused_naming_it(setting: str) -> None:
    text = BASE + ("[tool.uv]\n" if not setting.startswith("[") else "") + setting + "\n"
    with pytest.raises(PermissionDenied) as caught:
        settings(text, roots=("/allowed",))
    assert "elsewhere" in caught.value.message
    assert "/allowed" in caught.value.message


def test_the_same_places_are_allowed_inside_the_roots_or_remote() -> None:
    text = BASE + (
        '[tool.uv]\nfind-links = ["/allowed/wheels", "https://example.invalid/w"]\n'
        'index-url = "https://example.invalid/simple"\n'
        '[tool.uv.sources]\nlib = { git = "https://example.invalid/repo" }\n'
    )
    got = settings(text, roots=("/allowed",))
    assert isinstance(got, ProjectSettings)
    assert got.index_urls == ("https://example.invalid/simple",)


def test_uv_toml_is_read_first_and_checked_too() -> None:
    with pytest.raises(PermissionDenied):
        settings(BASE, roots=("/allowed",), uv_toml='find-links = ["/elsewhere"]\n')


def test_settings_that_move_uvs_writes_are_refused_by_name() -> None:
    with pytest.raises(PermissionDenied, match="cache-dir"):
        settings(BASE + '[tool.uv]\ncache-dir = "/tmp/c"\n')


def test_a_workspace_is_left_to_uv() -> None:
    got = settings(BASE + '[tool.uv.workspace]\nmembers = ["pkgs/*"]\n')
    assert isinstance(got, Passthrough)
    assert "workspace" in got.reason


def test_bad_toml_and_oversize_files_are_refused_saying_which() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"pyproject\.toml is not valid TOML"):
        settings("[project\n")
    with pytest.raises(InvalidRuntimeEnv, match=f"limit is {MAX_SETTINGS_BYTES}"):
        settings(BASE + "#" * MAX_SETTINGS_BYTES)
    with pytest.raises(InvalidRuntimeEnv, match="find-links must be strings"):
        settings(BASE + "[tool.uv]\nfind-links = 5\n")


def test_relative_paths_are_resolved_in_the_project(tmp_path: Path) -> None:
    """A relative path that stays inside the working dir is the project's own."""
    got = read_settings(
        (BASE + '[tool.uv]\nfind-links = ["sub/../wheels"]\n').encode(), None, str(tmp_path),
        FileRoots.of(["/allowed"]),
    )  # fmt: skip
    assert isinstance(got, ProjectSettings)
