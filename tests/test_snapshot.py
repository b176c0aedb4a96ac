"""``AgentService.snapshot`` and ``levels`` over a real service (a real agent, packages from a
real HTTP server on 127.0.0.1): the envs (live first, then recent failures), every package with
the state the service decides, the cache figures, the totals and what recovery found; the job ids
and eager_install an env's creates said; and the doors that only convert them."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from agent.app.config import Settings
from agent.app.records import MAX_JOB_ID_BYTES, MAX_JOB_IDS
from agent.app.service import AgentService
from agent.app.snapshot import EnvState, PackageState, Snapshot
from agent.core.errors import AgentError, InvalidArgument
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.ops.server import Agent
from tests.harness.in_process import FAST_FETCH, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]
SIZE = 1000  # bytes unpacked per package


def _envs(snapshot: Snapshot) -> list[tuple[str, EnvState, int]]:
    return [(e.env_id, e.state, e.references) for e in snapshot.envs]


async def test_snapshot_lists_live_envs_then_failures_and_every_package_in_its_state() -> None:
    """Live envs first (creating ones too), then the failed env; each package installing, ready
    (referenced) or unused (cached), with its references, size and path; totals count the live
    envs and every package; the cache figures and the levels agree with the list."""
    async with package_server() as pkgs, running_agent() as a:
        service: AgentService = a.service
        url = {n: pkgs.add(f"{n}.zip", workdir_zip({"data.txt": n * SIZE})) for n in "abc"}
        first = await service.create(env_json(url["a"], [url["b"]]), 0, "")
        second = await service.create(env_json(None, [url["b"]]), 0, "")
        assert await service.delete(first.env_id, "", "") == 0  # a unused, b still referenced
        with pytest.raises(AgentError):  # 404
            await service.create(env_json(f"{pkgs.base_url}/absent.zip"), 0, "")
        gate = pkgs.hold("c.zip")
        held = asyncio.create_task(service.create(env_json(url["c"]), 0, ""))
        try:
            await asyncio.wait_for(pkgs.requested("c.zip").wait(), 10)
            snap = await service.current_snapshot(0)  # the figures of the pass asked for
            [failed] = [e for e in snap.envs if e.state is EnvState.FAILED]
            live = [(second.env_id, EnvState.READY, 1), (_id(url["c"]), EnvState.CREATING, 1)]
            assert _envs(snap) == [*live, (failed.env_id, EnvState.FAILED, 0)]
            assert "absent.zip" in failed.error
            assert (snap.total_envs, snap.total_uris) == (2, 3)
            uris = {u.uri: u for u in snap.uris}
            assert {u: (v.state, v.references) for u, v in uris.items()} == {
                url["a"]: (PackageState.UNUSED, 0),
                url["b"]: (PackageState.READY, 1),
                url["c"]: (PackageState.INSTALLING, 1),
            }
            assert (uris[url["c"]].size_bytes, uris[url["c"]].local_path) == (0, "")
            for name in "ab":
                assert uris[url[name]].size_bytes == SIZE
                assert list(Path(uris[url[name]].local_path).rglob("data.txt"))
            assert (snap.cache.used_bytes, snap.cache.unused_bytes) == (SIZE, SIZE)
            assert snap.cache.budget_bytes == a.agent.settings.cache_budget_bytes
            assert snap.cache.downloads == 2
            levels = service.levels()
            assert (levels.used_bytes, levels.unused_bytes, levels.budget_bytes) == (
                snap.cache.used_bytes, snap.cache.unused_bytes, snap.cache.budget_bytes,
            )  # fmt: skip
            assert (levels.installs_in_flight, levels.live_envs) == (1, 2)
            assert (levels.evictions, levels.hits) == (snap.cache.evictions, snap.cache.hits)
            with pytest.raises(dataclasses.FrozenInstanceError):
                snap.total_envs = 0  # type: ignore[misc]
        finally:
            gate.set()  # else the package server waits on it at exit
        await asyncio.wait_for(held, 10)
        after = service.snapshot(0)
        assert {u.uri: u.state for u in after.uris}[url["c"]] is PackageState.READY
        assert service.levels().installs_in_flight == 0
        service.check_invariants()


def _id(working_dir: str) -> str:
    return parse_runtime_env(env_json(working_dir), EnvLimits()).env_id


async def test_snapshot_lists_at_most_the_limit_and_never_more_than_the_setting() -> None:
    async with running_agent(max_info_envs=3) as a:
        service: AgentService = a.service
        ids = [(await service.create(env_json(env_vars={"N": str(i)}), 0, "")).env_id
               for i in range(5)]  # fmt: skip
        assert [e.env_id for e in service.snapshot(2).envs] == ids[:2]
        assert [e.env_id for e in service.snapshot(0).envs] == ids[:3]
        assert [e.env_id for e in service.snapshot(100).envs] == ids[:3]
        assert service.snapshot(100).total_envs == 5


async def test_snapshot_carries_what_recovery_found_at_start() -> None:
    """The service receives the recovery summary at construction: a restart on the same root
    reports the package it kept."""
    base = short_tempdir()
    try:
        settings = replace(Settings(root=base / "root"), fetch=FAST_FETCH)
        zip_path = base / "w.zip"
        zip_path.write_bytes(workdir_zip({"data.txt": "x" * SIZE}))
        async with Agent(settings) as agent:
            assert agent.service is not None
            assert agent.service.snapshot(0).recovery.rows_kept == 0
            await agent.service.create(env_json(f"file://{zip_path}"), 0, "")
        async with Agent(settings) as agent:
            assert agent.service is not None
            recovery = agent.service.snapshot(0).recovery
            assert recovery.rows_kept == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_an_env_keeps_the_latest_distinct_job_ids_newest_last_failures_too() -> None:
    async with running_agent() as a:
        service: AgentService = a.service
        text = env_json(env_vars={"A": "1"})
        for job in ["j1", "j2", "j1", "", "j3", "j4", "j5", "j5"]:
            await service.create(text, 0, "", job_id=job)
        [env] = service.snapshot(0).envs
        assert MAX_JOB_IDS == 4
        assert env.job_ids == ("j1", "j3", "j4", "j5")
        assert env.references == 8
        service.check_invariants()

        absent = env_json(f"file://{a.root}/absent.zip")
        with pytest.raises(AgentError):
            await service.create(absent, 0, "", job_id="jf")
        failed = service.snapshot(0).envs[-1]
        assert (failed.state, failed.job_ids) == (EnvState.FAILED, ("jf",))
        service.check_invariants()


async def test_a_job_id_over_the_limit_is_refused_naming_it_and_counts_nothing() -> None:
    async with running_agent() as a:
        service: AgentService = a.service
        text = env_json(env_vars={"A": "1"})
        await service.create(text, 0, "", job_id="é" * (MAX_JOB_ID_BYTES // 2))  # 128 bytes
        with pytest.raises(InvalidArgument) as caught:
            await service.create(text, 0, "", job_id="é" * (MAX_JOB_ID_BYTES // 2) + "x")
        message = caught.value.message
        assert f"is {MAX_JOB_ID_BYTES + 1} bytes; the limit is {MAX_JOB_ID_BYTES}" in message
        assert "(65 characters)" in message  # quoted cut, with its length
        assert [e.references for e in service.snapshot(0).envs] == [1]


async def test_eager_install_is_accepted_from_the_request_or_the_json_and_kept() -> None:
    """The latest create's value, asked in the request's config or the JSON's config; never
    refused (stock Ray sends it set), and nothing more is done for it."""
    async with running_agent() as a:
        service: AgentService = a.service
        plain = env_json(env_vars={"A": "1"})
        in_json = json.dumps({"env_vars": {"A": "1"}, "config": {"eager_install": True}})

        def eager() -> bool:
            [env] = service.snapshot(0).envs
            return env.eager_install

        await service.create(plain, 0, "")
        assert not eager()
        await service.create(plain, 0, "", eager_install=True)
        assert eager()
        await service.create(plain, 0, "")
        assert not eager()
        await service.create(in_json, 0, "")  # the same env: config is not its identity
        assert eager()


def _imports_and_attributes(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return modules, attributes


@pytest.mark.parametrize("door", ["agent/doors/servicer.py", "agent/doors/metrics.py"])
def test_the_doors_import_nothing_of_the_state_layer_and_read_no_store_or_tables(
    door: str,
) -> None:
    """The servicer and the metrics only convert what the service hands them: neither imports
    the store nor recovery (nor anything of agent.state), nor reaches into the service's maps."""
    modules, attributes = _imports_and_attributes(REPO / door)
    assert [m for m in sorted(modules) if m.startswith("agent.state")] == []
    assert attributes & {"store", "tables", "records", "failures"} == set()
