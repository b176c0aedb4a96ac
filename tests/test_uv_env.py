"""uv envs through a real in-process agent: real venvs built by the real uv, offline, from
wheels written in the test; one venv per distinct set whatever its spelling; uv's own words on
a failure; venvs that share one wheel cache by hardlinks; the cache counted in the budget."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.app.config import Settings
from agent.core.uris import UriKey, UriKind
from agent.install.venvs.wheel_cache import CACHE_DIR, own_bytes, pip_installer_for
from tests.harness.disk import floor, free_bytes, tmpfs
from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.pip_wheels import isolate_pip
from tests.harness.uv_wheels import (
    BIG,
    MiB,
    agents_uv_version,
    du_bytes,
    have_uv,
    no_network,
    uv_env,
    write_wheel,
)
from tests.harness.venvs import probe

pytestmark = pytest.mark.skipif(not have_uv(), reason="no uv beside the python nor on PATH")

BUILD_S = 60  # deadline for one venv build on a loaded machine
BIG_BYTES = 20 * MiB


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pip configuration of this machine; any index request fails on loopback."""
    isolate_pip(monkeypatch)
    no_network(monkeypatch)


def venv_dirs(ra: RunningAgent, kind: str) -> list[str]:
    return [name for name in ra.uri_dirs() if name.startswith(f"{kind}-")]


def logs(ra: RunningAgent) -> list[Path]:
    folder = ra.root / "logs"
    return sorted(folder.iterdir()) if folder.exists() else []


async def test_the_list_and_the_object_spelling_of_one_uv_set_are_one_env_and_one_venv(
    tmp_path: Path,
) -> None:
    """Ray's two spellings (a list; an object with uv_check false and an empty uv_version)
    are one env id and one venv, built once by uv."""
    wheel = write_wheel(tmp_path / "wheels", "uvone")
    requirement = f"uvone @ {wheel.as_uri()}"
    spellings: list[Any] = [
        [requirement],
        {"packages": [requirement]},
        {"packages": [requirement, requirement], "uv_check": False, "uv_version": ""},
    ]
    async with running_agent() as ra:
        replies = [await ra.create(json.dumps({"uv": uv}), timeout_s=BUILD_S) for uv in spellings]
        assert len({r.runtime_env_id for r in replies}) == 1
        assert len({r.context.py_executable for r in replies}) == 1
        (uri,) = replies[0].uris  # a set naming a file is keyed by its bytes, read at create
        assert uri.startswith("uv:uv://")
        venv = ra.service.store.path_for(UriKey(UriKind.UV, uri.removeprefix("uv:")))
        assert replies[0].context.py_executable == str(venv / "bin" / "python")
        assert venv_dirs(ra, "uv") == [venv.name]
        assert len(logs(ra)) == 1, "one uv run"
        info = await ra.info()
        assert info.cache.extractions == 1
        seen = await probe(replies[0].context, "uvone")
        assert seen["uvone"][0] == "uvone 1.0"
        assert seen["uvone"][1].startswith(f"{venv}/lib/")


async def test_a_uv_env_installs_offline_wheels_with_their_dependencies_for_the_worker(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvtop", deps=["uvdep"])
    write_wheel(wheels, "uvdep")
    async with running_agent() as ra:
        reply = await ra.create(uv_env(["UvTop"], wheels), timeout_s=BUILD_S)
        seen = await probe(reply.context, "uvtop", "uvdep", "grpc")
        assert (seen["uvtop"][0], seen["uvdep"][0]) == ("uvtop 1.0", "uvdep 1.0")
        assert seen["grpc"] is None, "the venv sees the agent's own packages"
        [name] = venv_dirs(ra, "uv")
        assert reply.context.py_executable == str(ra.root.resolve() / "uris" / name / "bin/python")
        assert "--link-mode hardlink" in logs(ra)[0].read_text()
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_a_failing_uv_requirement_answers_failed_precondition_with_uvs_own_causes(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvthere")
    async with running_agent() as ra:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(uv_env(["doesnotexist==1.0"], wheels), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "No solution found when resolving dependencies" in details, details
        assert "cause: Because doesnotexist was not found" in details, details
        [log] = logs(ra)
        assert str(log) in details
        await ra.settle()
        assert venv_dirs(ra, "uv") == []


async def test_uv_check_true_runs_uv_pip_check_whose_incompatibility_fails_the_install(
    tmp_path: Path,
) -> None:
    """The same install (--no-deps: a dependency left out) is a venv without uv_check and
    FAILED_PRECONDITION with uv's words with it."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvneeds", deps=["uvmissing"])
    options = ["--no-index", "--find-links", str(wheels), "--no-deps"]
    unchecked = {"uv": {"packages": ["uvneeds"], "uv_pip_install_options": options}}
    checked = {"uv": {**unchecked["uv"], "uv_check": True}}
    async with running_agent() as ra:
        reply = await ra.create(json.dumps(unchecked), timeout_s=BUILD_S)
        assert (await probe(reply.context, "uvneeds"))["uvneeds"][0] == "uvneeds 1.0"
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(json.dumps(checked), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "The package `uvneeds` requires `uvmissing`, but it's not installed" in details
        assert len(venv_dirs(ra, "uv")) == 1, "the checked venv is not kept"


async def test_a_uv_version_no_place_of_the_env_has_fails_in_uvs_words(tmp_path: Path) -> None:
    """The uv of a uv_version the agent's does not satisfy is fetched from the env's places
    (here its find-links folder, offline), and one they lack fails the create
    FAILED_PRECONDITION in uv's own words (``test_uv_version.py``: from an index, the uv
    found and used)."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvver")
    options = ["--no-index", "--find-links", str(wheels)]
    uv = {"packages": ["uvver"], "uv_version": "==0.0.1", "uv_pip_install_options": options}
    async with running_agent() as ra:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(json.dumps({"uv": uv}), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "uv.uv_version '==0.0.1': the uv it asks for was not installed" in details
        assert "Because uv was not found in the provided package locations" in details, details
        await ra.settle()
        assert venv_dirs(ra, "uv") == venv_dirs(ra, "uv_tool") == []


async def test_a_uv_version_the_agents_uv_satisfies_is_built_by_it_and_gets_that_uv_installed(
    tmp_path: Path,
) -> None:
    """The agent's own uv satisfies the specifier: it builds the venv, and the env names no uv
    package; the venv gets ``uv<uv_version>`` installed into it all the same, as Ray's does (a
    hand-written ``uv`` 1.0 wheel here: the worker sees it); a set whose places have no uv fails
    saying why it needs one."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvver")
    options = ["--no-index", "--find-links", str(wheels)]
    uv = {"packages": ["uvver"], "uv_version": ">=0.1", "uv_pip_install_options": options}
    async with running_agent() as ra:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(json.dumps({"uv": uv}), timeout_s=BUILD_S)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "because uv was not found in the provided package locations" in details.lower()
        assert "uv.uv_version: the venv gets 'uv>=0.1' installed into it" in details, details

        write_wheel(wheels, "uv")
        reply = await ra.create(json.dumps({"uv": uv}), timeout_s=BUILD_S)
        assert [u.split(":")[0] for u in reply.uris] == ["uv"]
        assert venv_dirs(ra, "uv_tool") == []
        [venv] = venv_dirs(ra, "uv")
        cfg = (ra.root / "uris" / venv / "pyvenv.cfg").read_text()
        assert f"uv = {agents_uv_version()}\n" in cfg
        seen = await probe(reply.context, "uv")
        assert seen["uv"][0] == "uv 1.0"
        assert seen["uv"][1].startswith(str(ra.root.resolve() / "uris" / venv))


async def test_a_pip_env_and_a_uv_env_sharing_a_20_mib_wheel_hold_one_copy_on_disk(
    tmp_path: Path,
) -> None:
    """Two venvs of distinct sets (one pip env built by uv: the default pip-installer, auto,
    with uv beside the agent's python; one uv env)
    install the large wheel from the one wheel cache by hardlinks: the root holds about one
    copy of it (du counts each inode once)."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, BIG, payload=BIG_BYTES)
    write_wheel(wheels, "uvsmalla")
    write_wheel(wheels, "uvsmallb")
    options = ["--no-index", "--find-links", str(wheels)]
    pip = json.dumps({"pip": {"packages": [BIG, "uvsmalla"], "pip_install_options": options}})
    assert Settings(root=tmp_path).pip_installer == "auto"
    async with running_agent() as ra:
        first = await ra.create(pip, timeout_s=BUILD_S)
        second = await ra.create(uv_env([BIG, "uvsmallb"], wheels), timeout_s=BUILD_S)
        [pip_dir], [uv_dir] = venv_dirs(ra, "pip"), venv_dirs(ra, "uv")
        payloads = [
            next((ra.root / "uris" / d).glob(f"lib/python*/site-packages/{BIG}/payload.bin"))
            for d in (pip_dir, uv_dir)
        ]
        a, b = (os.stat(p) for p in payloads)
        assert (a.st_ino, a.st_size) == (b.st_ino, BIG_BYTES), "one inode, in both venvs"
        assert a.st_nlink >= 3, "linked from the cache too"
        assert stat.S_IMODE(os.stat(ra.root / CACHE_DIR).st_mode) == 0o700, "the cache is private"
        total = du_bytes(ra.root)
        assert total < 1.5 * BIG_BYTES, f"the root holds {total} bytes for one {BIG_BYTES}"
        for reply in (first, second):
            seen = await probe(reply.context, BIG)
            assert seen[BIG][0] == f"{BIG} 1.0"


async def test_the_wheel_caches_own_bytes_count_in_the_budget_and_it_is_cleared_over_it(
    tmp_path: Path,
) -> None:
    """Budget 30 MiB, two unused venvs of 20 MiB each: the older is evicted, which leaves its
    wheel only in the cache (20 MiB of the cache's own), over the budget with the newer venv:
    the cache is cleared, and the newer venv still works. With a budget of 100 MiB, all stay."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvbiga", payload=BIG_BYTES, seed=1)
    write_wheel(wheels, "uvbigb", payload=BIG_BYTES, seed=2)
    for budget, evicts in ((100 * MiB, False), (30 * MiB, True)):
        async with running_agent(cache_budget_bytes=budget) as ra:
            cache = ra.root / CACHE_DIR
            older = await ra.create(uv_env(["uvbiga"], wheels), timeout_s=BUILD_S)
            assert await ra.delete(older.runtime_env_id) == 0
            await ra.settle()
            newer = await ra.create(uv_env(["uvbigb"], wheels), timeout_s=BUILD_S)
            assert await ra.delete(newer.runtime_env_id) == 0
            await ra.settle()
            wheel_cache = ra.service.store.wheel_cache
            if not evicts:
                assert len(venv_dirs(ra, "uv")) == 2
                assert own_bytes(cache) < MiB, "every wheel is linked from a venv"
                assert wheel_cache.clears == 0
                assert ra.service.levels().wheel_cache_bytes == wheel_cache.own_bytes
                assert du_bytes(ra.root) < 2.5 * BIG_BYTES
                continue
            assert len(venv_dirs(ra, "uv")) == 1, "the older venv evicted"
            assert wheel_cache.clears == 1, "then the cache, over the budget with it"
            levels = ra.service.levels()  # what a metrics scrape shows
            assert (levels.wheel_cache_clears, levels.wheel_cache_bytes) == (1, 0), levels
            assert not cache.exists() or own_bytes(cache) == 0
            assert du_bytes(ra.root) < 1.5 * BIG_BYTES
            again = await ra.create(uv_env(["uvbigb"], wheels), timeout_s=BUILD_S)
            assert again.context.py_executable == newer.context.py_executable
            seen = await probe(again.context, "uvbigb")
            assert seen["uvbigb"][0] == "uvbigb 1.0"


async def test_the_disk_floor_clears_the_wheel_cache_when_no_package_can_be_evicted(
    tmp_path: Path,
) -> None:
    """On a 64 MiB tmpfs: a venv deleted by hand leaves its 16 MiB wheel in the cache alone;
    an install under a floor that only clearing the cache can keep (no package to evict) clears
    it, and succeeds."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvfloorbig", payload=16 * MiB, seed=3)
    write_wheel(wheels, "uvfloorsmall")
    with tmpfs(64 * MiB) as fs:
        root = fs / "root"
        async with running_agent(root=root, min_free_disk=floor(0)) as ra:
            await ra.create(uv_env(["uvfloorbig"], wheels), timeout_s=BUILD_S)
            [venv] = venv_dirs(replace(ra, root=root), "uv")
        shutil.rmtree(root / "uris" / venv)  # the venv gone; its wheel stays in the cache
        assert own_bytes(root / CACHE_DIR) >= 16 * MiB
        limit = free_bytes(fs) + 8 * MiB  # reachable only once the cache's 16 MiB are freed
        async with running_agent(root=root, min_free_disk=floor(limit)) as ra:
            reply = await ra.create(uv_env(["uvfloorsmall"], wheels), timeout_s=BUILD_S)
            assert ra.service.store.wheel_cache.clears == 1
            seen = await probe(reply.context, "uvfloorsmall")
            assert seen["uvfloorsmall"][0] == "uvfloorsmall 1.0"


async def test_with_pip_installer_pip_a_pip_venv_is_built_by_pip_without_the_wheel_cache(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvbypip")
    options = ["--no-index", "--find-links", str(wheels)]
    pip = json.dumps({"pip": {"packages": ["uvbypip"], "pip_install_options": options}})
    async with running_agent(pip_installer="pip") as ra:
        reply = await ra.create(pip, timeout_s=BUILD_S)
        assert (await probe(reply.context, "uvbypip"))["uvbypip"][0] == "uvbypip 1.0"
        assert " -m pip " in logs(ra)[0].read_text()
        assert not (ra.root / CACHE_DIR).exists()


async def test_a_pip_env_naming_an_option_uv_lacks_is_built_by_pip_and_no_cache_dir_still_links(
    tmp_path: Path,
) -> None:
    """Under pip-installer auto (uv there): a set whose options uv does not take
    (--prefer-binary) is built by pip, not failed by uv; a set naming --no-cache-dir, which uv
    would take as its --no-cache and so copy every file, is built by uv from the wheel cache."""
    wheels = tmp_path / "wheels"
    write_wheel(wheels, BIG, payload=BIG_BYTES)
    write_wheel(wheels, "uvsmalla")
    offline = ["--no-index", "--find-links", str(wheels)]

    def pip(packages: list[str], *more: str) -> str:
        options = [*offline, *more]
        return json.dumps({"pip": {"packages": packages, "pip_install_options": options}})

    async with running_agent() as ra:
        by_pip = await ra.create(pip(["uvsmalla"], "--prefer-binary"), timeout_s=BUILD_S)
        assert (await probe(by_pip.context, "uvsmalla"))["uvsmalla"][0] == "uvsmalla 1.0"
        [log] = logs(ra)
        assert " -m pip " in log.read_text()
        first = await ra.create(pip([BIG]), timeout_s=BUILD_S)
        second = await ra.create(pip([BIG, "uvsmalla"], "--no-cache-dir"), timeout_s=BUILD_S)
        for reply in (first, second):
            assert (await probe(reply.context, BIG))[BIG] is not None
        assert du_bytes(ra.root) < 1.5 * BIG_BYTES, "the two venvs share the wheel's files"


@pytest.mark.parametrize(
    ("setting", "uv", "installer"),
    [
        ("auto", "/opt/uv", "uv"),
        ("auto", None, "pip"),
        ("pip", "/opt/uv", "pip"),
        ("uv", "/opt/uv", "uv"),
    ],
)
def test_pip_installer_auto_means_uv_when_there_is_one_else_pip(
    setting: str, uv: str | None, installer: str
) -> None:
    assert pip_installer_for(setting, uv) == installer


_SAMPLE_VALUES = {
    "--index-url": "http://127.0.0.1:9/simple", "-i": "http://127.0.0.1:9/simple",
    "--pypi-url": "http://127.0.0.1:9/simple",
    "--extra-index-url": "http://127.0.0.1:9/simple", "--trusted-host": "localhost",
    "--only-binary": ":none:", "--no-binary": ":none:", "--upgrade-strategy": "eager",
    "--timeout": "5", "--default-timeout": "5", "--retries": "2", "--progress-bar": "off",
    "--platform": "linux_x86_64", "--python-version": "3.11", "--implementation": "cp",
    "--abi": "cp311", "--root-user-action": "ignore", "--proxy": "http://127.0.0.1:9",
    "--exists-action": "i", "--use-feature": "truststore", "--use-deprecated": "legacy-certs",
}  # fmt: skip
# uv takes these spellings, but they mean another thing there (a target python or platform to
# resolve for; no configuration file; leave a system python's packages be): a set naming one is
# built by pip, as pip reads it
_OTHER_MEANING = {"--platform", "--python-version", "--isolated", "--break-system-packages"}


def test_pip_only_lists_exactly_the_allowed_pip_options_the_agents_uv_refuses(
    tmp_path: Path,
) -> None:
    """Each option a pip env may name is tried on the agent's uv (a dry run, offline): those uv
    refuses as unknown, and those it takes with another meaning, are PIP_ONLY (their sets are
    built by pip), and uv takes every other."""
    from agent.core.pip_options import ALLOWED as _ALLOWED
    from agent.core.pip_options import PIP_ONLY
    from agent.install.venvs.wheel_cache import find_uv

    uv = find_uv()
    assert uv is not None
    wheels = tmp_path / "wheels"
    write_wheel(wheels, "uvoptprobe")
    subprocess.run([uv, "venv", "--quiet", str(tmp_path / "venv")], check=True, timeout=60)
    refused = set()
    for option, takes_value in _ALLOWED.items():
        if option in ("--editable", "-e", "--find-links", "-f", "--no-index"):
            continue  # a path of a project; the offline options every try names
        args = [option, _SAMPLE_VALUES[option]] if takes_value else [option]
        done = subprocess.run(
            [uv, "pip", "install", "--dry-run", "--quiet", "--python",
             str(tmp_path / "venv" / "bin" / "python"), "--no-index", "--find-links",
             str(wheels), *args, "uvoptprobe"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "UV_NO_CONFIG": "1"},
        )  # fmt: skip
        if done.returncode != 0 and "unexpected argument" in done.stderr:
            refused.add(option)  # any other error is of what the option asks, not its name
    assert refused | (_OTHER_MEANING & _ALLOWED.keys()) == PIP_ONLY
