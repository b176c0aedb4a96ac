"""Package kinds: every trait of a kind is its row of one table (``KINDS``), the store installs
a package from the recipe it carries (never from its URI parsed again), and a new kind is one
row there (and an installer where no ``Build`` fits), with nothing else changed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import StrEnum
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from agent.core.context import build_context
from agent.core.dialect import GRPC, RAY
from agent.core.kinds import KINDS, Build, KindRow, Origin, Placement, VenvPlace
from agent.core.packages import Package
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from agent.core.uris import ParsedUri, UriKey, UriKind, parse_uri
from agent.doors.ray_context import build_ray_context
from agent.install.disk.staging import place_package
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.installers import (
    INSTALLERS,
    Installed,
    InstallJob,
    InstallTools,
    build_installers,
)
from agent.install.installers.base import recipe_error
from agent.install.unpack.plan import ArchiveLimits
from agent.state.state_db import StateDB
from agent.state.store import UriStore
from tests.harness.in_process import listed
from tests.harness.packages import module_zip
from tests.harness.polling import wait_until


@asynccontextmanager
async def a_store(root: Path) -> AsyncIterator[UriStore]:
    """A store over the root's index (this process one holder of the root), every package it
    installs counted as used."""
    root.mkdir(parents=True, exist_ok=True)
    db = StateDB(root / "state.db")
    await db.open()
    try:
        async with aiohttp.ClientSession() as session:
            fetcher = Fetcher(session, FetchLimits())
            installers = build_installers(
                InstallTools(fetcher, ArchiveLimits(), sys.executable, "pip", root / "logs")
            )
            store = UriStore(root, installers, db=db, refcount=lambda _: 1, budget_bytes=10**9)
            try:
                yield store
            finally:
                await store.close()
    finally:
        await db.close()


def test_every_kind_has_one_row_and_every_way_of_building_one_installer() -> None:
    assert set(KINDS) == set(UriKind)
    assert set(INSTALLERS) == set(Build)
    assert {row.build for row in KINDS.values()} == set(Build)  # no installer unused


@pytest.mark.parametrize("kind", list(UriKind))
def test_each_kinds_row_is_complete_and_consistent(kind: UriKind) -> None:
    """Every column set; a venv kind builds a venv, a derived kind is never named by an env,
    a tool (the uv of a uv_version) is placed nowhere on the worker and every other kind one
    way, and what Ray's folder shows is what Ray's cache variable of that name caps."""
    row = KINDS[kind]
    venv = row.build in {Build.PIP_VENV, Build.UV_VENV, Build.PROJECT_VENV}
    assert (row.placement.venv is not None) == venv
    assert (row.origin is Origin.SET) == (row.build in {Build.PIP_VENV, Build.UV_VENV})
    assert (row.origin is Origin.DERIVED) == (row.placement.venv is VenvPlace.PROJECT)
    assert row.ray_folder in {
        "working_dir_files",
        "py_modules_files",
        "java_jars_files",
        "pip",
        "uv",
    }
    assert row.ray_cache == row.ray_folder.removesuffix("_files")
    placements = [row.placement.on_path, row.placement.java, row.placement.venv is not None]
    assert sum(placements) == (row.origin is not Origin.TOOL)  # each kind put there one way
    assert (row.origin is Origin.TOOL) == (row.build is Build.UV_TOOL)


def test_the_dialects_venv_and_module_kinds_are_rows() -> None:
    for dialect in (GRPC, RAY):
        for tool in ("pip", "uv"):
            assert KINDS[dialect.venv_kind(tool)].origin is Origin.SET
        assert KINDS[dialect.py_modules_zip].placement.on_path


def test_a_parsed_env_carries_each_package_with_its_recipe_in_order() -> None:
    env = parse_runtime_env(
        json.dumps(
            {
                "working_dir": "file:///p/wd.zip",
                "py_modules": ["https://h.example/m.zip#sha256=" + "ab" * 32, "file:///p/m2.zip"],
                "pip": ["requests"],
            }
        ),
        EnvLimits(),
    )
    kinds = [p.key.kind for p in env.packages]
    assert kinds == [UriKind.WORKING_DIR, UriKind.PY_MODULES, UriKind.PY_MODULES, UriKind.PIP]
    assert env.uri_keys == tuple(p.key for p in env.packages)
    wd, m1, _, pip = env.packages
    assert wd.recipe == parse_uri("working_dir", "file:///p/wd.zip")
    assert isinstance(m1.recipe, ParsedUri)
    assert m1.recipe.sha256 == "ab" * 32
    assert pip.recipe == env.pip
    assert pip.key.uri == env.pip.uri


async def test_the_store_installs_from_the_recipe_not_from_the_uri_parsed_again(
    tmp_path: Path,
) -> None:
    """The key's URI names nothing on disk; the recipe names the real archive: the install
    uses the recipe (a store parsing the URI again would find no such file)."""
    archive = tmp_path / "m.zip"
    archive.write_bytes(module_zip("mod", "from the recipe"))
    key = UriKey(UriKind.PY_MODULES, "file:///nowhere/m.zip")
    package = Package(key, parse_uri("py_modules[0]", f"file://{archive}"))
    async with a_store(tmp_path / "root") as store:
        path = await store.ensure(package)
        assert "from the recipe" in (path / "mod" / "__init__.py").read_text()
        assert path == store.path_for(key)


async def test_an_install_cancelled_during_its_rename_leaves_nothing_in_uris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename into uris/ runs in a thread; an install cancelled while it runs waits for it,
    then moves the package out again: no folder in uris/ without an entry."""
    archive = tmp_path / "m.zip"
    archive.write_bytes(module_zip("mod", "v"))
    package = Package(
        UriKey(UriKind.PY_MODULES, f"file://{archive}"), parse_uri("m", f"file://{archive}")
    )
    entered, go_on = threading.Event(), threading.Event()

    def slow_place(trash: Path, unpacked: Path, final: Path) -> Path | None:
        entered.set()
        assert go_on.wait(10), "the test never let the rename go on"
        return place_package(trash, unpacked, final)

    monkeypatch.setattr("agent.state.placing.place_package", slow_place)
    root = tmp_path / "root"
    async with a_store(root) as store:
        caller = asyncio.create_task(store.ensure(package))
        await wait_until(entered.is_set, what="the rename to start")
        entry = store.entry(package.key)
        assert entry is not None
        assert entry.task is not None
        install = entry.task
        caller.cancel()  # the only waiter leaves: the install is cancelled mid-rename
        await asyncio.wait([caller], timeout=10)
        go_on.set()
        await asyncio.wait([install], timeout=10)
        assert install.cancelled()
        await store.drain()
        assert store.entry(package.key) is None
        assert list((root / "uris").iterdir()) == []
        assert listed(root, "trash") == []


# -- a new kind, through the tables only -----------------------------------------------------


class _NewKind(StrEnum):
    JARS = "lib_jars"  # a stand-in for a kind the agent does not have


JARS = cast(UriKind, _NewKind.JARS)  # the tables and keys take it as they would a UriKind


class _NewBuild(StrEnum):
    LIB = "lib"


LIB = cast(Build, _NewBuild.LIB)  # likewise, a Build


class _JarInstaller:
    """A kind the store and the context have never heard of: one jar fetched into a folder."""

    def __init__(self, tools: InstallTools) -> None:
        self._fetcher = tools.fetcher

    def check(self, package: Package, label: str) -> None:
        if not isinstance(package.recipe, ParsedUri):
            raise recipe_error(package, "URI")
        self._fetcher.check_origin(package.recipe, label)

    def prepare(self, staging: Path) -> None:
        (staging / "jars").mkdir()

    async def install(self, package: Package, job: InstallJob) -> Installed:
        assert isinstance(package.recipe, ParsedUri)
        folder = job.staging / "jars"
        size = await self._fetcher.fetch(
            package.recipe, folder / "lib.jar", label=job.label, space=job.space
        )
        job.downloaded(size)
        job.unpacked()
        return Installed(folder, size)


def _jar_package(uri: str) -> Package:
    return Package(UriKey(JARS, uri), parse_uri("java_jars[0]", uri))


async def test_a_new_kind_is_installed_and_placed_by_registering_it_in_the_tables_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store and contexts (ours and Ray's) untouched: the kind's row (``KINDS``) names a new way
    of building it, whose installer (``INSTALLERS``) makes its folder, and its placement puts
    the folder on the worker's PYTHONPATH and makes it the cwd (which only a working dir gives
    today)."""
    row = KindRow(Placement(on_path=True, cwd=True), LIB, Origin.NAMED, "lib_jars", "lib_jars")
    monkeypatch.setitem(KINDS, JARS, row)
    monkeypatch.setitem(INSTALLERS, LIB, _JarInstaller)
    jar = tmp_path / "lib.jar"
    jar.write_bytes(b"PK\x05\x06" + bytes(18))
    package = _jar_package(f"file://{jar}")
    env = RuntimeEnv(
        working_dir=None, py_modules=(), env_vars={"PYTHONPATH": "/own"},
        setup_timeout_seconds=None, eager_install=None, canonical="{}", env_id="0" * 32,
        packages=(package,),
    )  # fmt: skip
    root = tmp_path / "root"
    async with a_store(root) as store:
        path = await store.ensure(package)
        assert (path / "lib.jar").read_bytes() == jar.read_bytes()
        assert path.name.startswith("lib_jars-")
        assert path.parent == root / "uris"
        assert store.stats().downloads == 1
        assert store.stats().extractions == 1
        context = build_context(env, store.path_for, py_executable="py", limits=EnvLimits())
        ray = build_ray_context(
            env, store.path_for, py_executable="py", node_pythonpath="", python_version=(3, 11)
        )
    assert context.env_vars["PYTHONPATH"].split(os.pathsep) == [str(path), "/own"]
    assert (context.cwd, context.py_executable) == (str(path), "py")
    ray_vars = ray["env_vars"]
    assert isinstance(ray_vars, dict)
    assert ray_vars["PYTHONPATH"].split(os.pathsep) == [str(path), "/own"]  # Ray's format too
    assert ray["command_prefix"] == ["cd", str(path), "&&"]


def test_a_rename_into_place_that_fails_deletes_the_leftover_it_moved_aside(tmp_path: Path) -> None:
    """A leftover at the final path (a crash between steps) goes to the trash before the rename;
    if the rename then fails, nobody else knows where it went, so it is deleted at once."""
    root = tmp_path / "root"
    trash = root / "trash" / ("0" * 32)  # the agent's own trash folder
    trash.mkdir(parents=True)
    final = root / "uris" / "py_modules-x"
    final.mkdir(parents=True)
    (final / "old.py").write_text("")
    with pytest.raises(FileNotFoundError):
        place_package(trash, tmp_path / "never-made", final)
    assert list(trash.iterdir()) == []
    assert not final.exists()
