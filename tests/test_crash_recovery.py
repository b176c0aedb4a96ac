"""Whole-process crash tests: an agent armed with ``RTENV_CRASH_AT`` SIGKILLs itself at one point,
and a restart on the same root makes the index (a real ``state.db``) and the disk agree again.

Each test: a clean agent installs package X and releases it (X cached, unused), and stops on
SIGTERM; an armed agent runs the workload that reaches the crash point and dies (-9); a clean
agent restarts on the same root and is checked through the disk, the SQLite file and
GetRuntimeEnvsInfo, then serves every surviving package with zero downloads and downloads again
whatever was not committed. ``mid_extract`` dies in an unpack worker process (the worker kills
the agent) and in a thread of the agent's; ``mid_venv_build`` while uv or pip builds a venv
(rebuilt after the restart); ``mid_ray_link`` runs ``ray-agent`` processes for one node (its Ray
folders: the restart removes the half-built tree and shows each package whole once used).
"""

from __future__ import annotations

import io
import os
import signal
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from agent.core.kinds import row_of
from agent.core.uris import UriKind
from agent.crash import POINTS
from tests.harness.crashing_agent import (
    X_ZIP,
    Y_ZIP,
    ZIPS,
    AgentProc,
    RayNode,
    agent_process,
    check_recovered,
    create_each,
    env_of,
    listing,
    read_index,
)
from tests.harness.in_process import listed
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json
from tests.harness.pip_wheels import isolate_pip, pip_env, processes_mentioning, run
from tests.harness.polling import wait_until


def unpacked_size(data: bytes) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return sum(info.file_size for info in zf.infolist() if not info.is_dir())


X_FILES, Y_FILES = unpacked_size(X_ZIP), unpacked_size(Y_ZIP)
BUDGET = X_FILES + Y_FILES // 2  # X alone fits, Y alone fits, both do not


# -- an agent process and a client -----------------------------------------------------------


# -- the index, read from the test -----------------------------------------------------------


def staging(root: Path) -> set[str]:
    """What the one staging directory under tmp/ holds (empty set if there is none): tmp/ holds
    one folder per holder, the dead agent's holding at most one staging directory."""
    inside = [own / name for own in (root / "tmp").iterdir() for name in listing(own)]
    assert len(inside) <= 1, inside
    return set(listing(inside[0])) if inside else set()


# -- scenarios -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rig:
    """What a scenario's workload and checks use: the packages' server, the root, the offline
    wheelhouse (for a venv's scenario), the node (for a Ray scenario)."""

    pkgs: PackageServer
    root: Path
    wheels: Path | None = None
    node: RayNode | None = None


Workload = Callable[[AgentProc, Rig], Awaitable[None]]


async def replied_or_died(call: Awaitable[object]) -> None:
    """The last call of a workload: the crash it leads to may come before its reply is sent."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc  # noqa: PT017


async def create_a_then_crash_installing_b(agent: AgentProc, rig: Rig) -> None:
    """A (cached X) is created, its live env written behind; then B's install of Y dies
    midway."""
    await agent.create(env_of(rig.pkgs, "x.zip"))
    await wait_until(
        lambda: read_index(rig.root).live_envs == 1, timeout_s=10, what="1 live env written behind"
    )
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await agent.create(env_of(rig.pkgs, "y.zip"))
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value


async def install_b_then_crash_writing_counts(agent: AgentProc, rig: Rig) -> None:
    """B installs Y (its row committed before the reply, with the live env noted before it);
    once the pass its install asked for has run (info waits for it) and carried what was noted
    by then, a second env of Y is created: a hit, whose live env and last use are only noted.
    The batch written behind, about 100 ms later, dies midway."""
    await agent.create(env_of(rig.pkgs, "y.zip"))
    await agent.info()
    url = f"{rig.pkgs.base_url}/y.zip"
    await replied_or_died(agent.create(env_json(py_modules=[url], env_vars={"SECOND": "1"})))


async def install_b_release_it_then_crash_evicting_x(agent: AgentProc, rig: Rig) -> None:
    """Under a budget that holds X or Y but not both, releasing B evicts X; its deletion dies."""
    reply = await agent.create(env_of(rig.pkgs, "y.zip"))
    await replied_or_died(agent.delete(reply.runtime_env_id))


async def install_b_then_crash_linking_it_into_rays_folder(agent: AgentProc, rig: Rig) -> None:
    """B installs Y (committed); the pass after it shows Y in the node's Ray folder, and dies
    after the first of its two hard links, before the tree is renamed into place."""
    await replied_or_died(agent.create(env_of(rig.pkgs, "y.zip")))


def venv_env(rig: Rig) -> str:
    assert rig.wheels is not None
    return pip_env(["alpha-pkg"], rig.wheels)


async def crash_building_a_venv(agent: AgentProc, rig: Rig) -> None:
    """A pip env's venv is made, and its installer started in it: the agent dies."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await agent.create(venv_env(rig))
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value


# -- what a scenario checks after the restart, beyond the zips ---------------------------------


async def venv_built_again(agent: AgentProc, rig: Rig) -> None:
    """No installer of the dead agent's runs on; the pip env's venv is built anew, whole (its
    package imports), one row, one folder."""
    staged = f"{rig.root.resolve() / 'tmp'}/"
    await wait_until(
        lambda: not processes_mentioning(staged), timeout_s=10, what="the dead agent's installer"
    )
    reply = await agent.create(venv_env(rig))
    python = reply.context.py_executable
    code, out, err = await run(python, "-c", "import alpha_pkg as a; print(a.VALUE)")
    assert (code, out.strip()) == (0, "alpha 1.0"), err
    pips = [d for d in listing(rig.root / "uris") if d.startswith("pip-")]
    assert len(pips) == 1, pips
    assert sorted(read_index(rig.root).uris) == listing(rig.root / "uris")


def _files(top: Path) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(t, f), top): os.lstat(os.path.join(t, f)).st_ino
        for t, _, names in os.walk(top)
        for f in names
    }


def _ray_folder(rig: Rig, package: str) -> Path:
    """The node's Ray folder that shows the root's package ``package`` (``<kind>-<hash>``)."""
    assert rig.node is not None
    return rig.node.runtime_resources / row_of(UriKind(package.rsplit("-", 1)[0])).ray_folder


def half_built_in_rays_folder(rig: Rig) -> None:
    """The dead agent left Y's tree under its temporary name, one of its two files linked, and
    nothing under Y's name."""
    [y] = [d for d in listing(rig.root / "uris") if not d.startswith("working_dir-")]
    names = listing(_ray_folder(rig, y))
    [left] = [n for n in names if n.startswith(f".rtenv-building-{y}-")]
    assert names == [left], names
    assert len(_files(_ray_folder(rig, y) / left)) == 1, "it died after its first link"


async def rays_folders_whole(agent: AgentProc, rig: Rig) -> None:
    """No temporary tree is left in the node's Ray folders, and each package the restarted
    agent used (``create_each``: X and Y) is shown whole: its files, hard links to the root's,
    once the pass after its create has run."""
    packages = listing(rig.root / "uris")
    assert len(packages) == 2, packages

    def whole() -> bool:
        for name in packages:
            tree, folder = _ray_folder(rig, name) / name, listing(_ray_folder(rig, name))
            if [n for n in folder if n.startswith(".rtenv-building-")] or tree.is_symlink():
                return False
            if not tree.is_dir() or _files(tree) != _files(rig.root / "uris" / name):
                return False
        return True

    await wait_until(whole, timeout_s=10, what="X and Y whole in the node's Ray folders")


@dataclass(frozen=True)
class Scenario:
    workload: Workload
    dead_uris: int  # directories under uris/ when it died
    dead_staging: frozenset[str]  # what tmp/'s staging directory held
    dead_trash: int
    kept: frozenset[str]  # packages whose row and directory survive the restart
    refetched: frozenset[str]  # packages whose install was lost: downloaded again
    rows_dropped: int
    orphans: int
    bytes_freed: int  # -1: some (a venv cut short: what it had written)
    envs_forgotten: int  # the armed agent's live envs, as its last transaction wrote them
    args: tuple[str, ...] = ()
    ray: bool = False  # the agents are ``ray-agent`` processes of one node (its Ray folders)
    wheels: bool = False  # the workload builds a venv from the offline wheelhouse
    died_with: Callable[[Rig], None] | None = None  # what else it left, checked once dead
    after: Workload | None = None  # checked last, in the restarted agent


ZIP_ONLY, ZIP_AND_TREE = frozenset({"package.zip"}), frozenset({"package.zip", "unpacked"})


def install_crash(
    dead_uris: int, dead_staging: frozenset[str], orphans: int, freed: int
) -> Scenario:
    """A crash inside Y's install: X (committed) is kept, Y (not committed) is lost. Two envs
    forgotten: A (ready) and B (creating), noted before the transaction that claimed Y."""
    return Scenario(
        create_a_then_crash_installing_b, dead_uris=dead_uris, dead_staging=dead_staging,
        dead_trash=0, kept=frozenset({"x.zip"}), refetched=frozenset({"y.zip"}),
        rows_dropped=0, orphans=orphans, bytes_freed=freed, envs_forgotten=2,
    )  # fmt: skip


Y_FIRST = len("VALUE = 'y'\n")  # the bytes of Y's first file, written when mid_extract dies


SCENARIOS = {
    "after_download": install_crash(1, ZIP_ONLY, 0, len(Y_ZIP)),
    # in an unpack worker (the default): the worker kills the agent, then itself
    "mid_extract": install_crash(1, ZIP_AND_TREE, 0, len(Y_ZIP) + Y_FIRST),
    "after_extract": install_crash(1, ZIP_AND_TREE, 0, len(Y_ZIP) + Y_FILES),
    "before_rename": install_crash(1, ZIP_AND_TREE, 0, len(Y_ZIP) + Y_FILES),
    # the rename's hop deleted the staging folder's download too
    "after_rename_before_commit": install_crash(2, frozenset(), 1, Y_FILES),
    "mid_count_batch": Scenario(
        install_b_then_crash_writing_counts, dead_uris=2, dead_staging=frozenset(),
        dead_trash=0, kept=frozenset({"x.zip", "y.zip"}), refetched=frozenset(),
        rows_dropped=0, orphans=0, bytes_freed=0, envs_forgotten=1,  # B, carried by a pass
    ),
    "during_trash_deletion": Scenario(
        install_b_release_it_then_crash_evicting_x, dead_uris=1, dead_staging=frozenset(),
        dead_trash=1, kept=frozenset({"y.zip"}), refetched=frozenset({"x.zip"}),
        rows_dropped=0, orphans=0, bytes_freed=X_FILES, args=("--cache-budget", str(BUDGET)),
        # X's row went with its eviction (one transaction): none is left to drop; B's delete
        # noted 0 live envs before the pass that evicted X, whose transaction carried it
        envs_forgotten=0,
    ),
    "mid_ray_link": Scenario(
        install_b_then_crash_linking_it_into_rays_folder, dead_uris=2, dead_staging=frozenset(),
        dead_trash=0, kept=frozenset({"x.zip", "y.zip"}), refetched=frozenset(), rows_dropped=0,
        orphans=0, bytes_freed=0, envs_forgotten=1, ray=True,
        died_with=half_built_in_rays_folder, after=rays_folders_whole,
    ),
    "mid_venv_build": Scenario(
        crash_building_a_venv, dead_uris=1, dead_trash=0,
        dead_staging=frozenset({"venv", "installer-tmp", "installer.pgid", "sources"}),
        kept=frozenset({"x.zip"}), refetched=frozenset(), rows_dropped=0, orphans=0,
        bytes_freed=-1, envs_forgotten=1, wheels=True, after=venv_built_again,
    ),
}  # fmt: skip
# more runs of a point: name -> (its point, its scenario)
VARIANTS = {
    "mid_extract-in-a-thread": (
        "mid_extract",
        replace(SCENARIOS["mid_extract"], args=("--extract-workers", "0")),
    ),
}
RUNS = {**{point: (point, scenario) for point, scenario in SCENARIOS.items()}, **VARIANTS}


def premature(point: str, root: Path, armed: AgentProc, exc: BaseException) -> str:
    """The workload failed: say so, and whether the agent died in recovery, before serving."""
    hint = ""
    if not armed.address and listed(root, "trash"):
        hint = " (recovery's own deletion of what it set aside reached the point)"
    return f"the workload for {point} failed{hint}: {exc}\nlog:\n{armed.log_text()[-2000:]}"


def test_every_crash_point_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(POINTS)
    assert {point for point, _ in RUNS.values()} == set(POINTS)


async def install_x_and_stop(
    root: Path, log: Path, pkgs: PackageServer, node: RayNode | None = None
) -> None:
    """A clean agent downloads X for env A, releases it (X cached, unused), stops on SIGTERM."""
    async with agent_process(root, log, ray=node) as first:
        reply = await first.create(env_of(pkgs, "x.zip"))
        assert await first.delete(reply.runtime_env_id) == 0
        await first.sigterm()
    assert pkgs.gets["x.zip"] == 1


@pytest.mark.parametrize("run_name", sorted(RUNS))
async def test_restart_after_sigkill_at_crash_point_agrees_with_disk_and_reuses_packages(
    base: Path, run_name: str, request: pytest.FixtureRequest
) -> None:
    """After kill -9 at POINT: rows == dirs, tmp/trash empty, no env live, no re-download of
    committed packages, one re-download of a lost one (and what the scenario checks after)."""
    (point, scenario), root = RUNS[run_name], base / "root"
    wheels = None
    if scenario.wheels:
        isolate_pip(request.getfixturevalue("monkeypatch"))
        wheels = request.getfixturevalue("wheels")
    node = RayNode(base / "session") if scenario.ray else None
    async with package_server() as pkgs:
        rig = Rig(pkgs, root, wheels, node)
        for name, body in ZIPS.items():
            pkgs.add(name, body)
        await install_x_and_stop(root, base / "1-clean.log", pkgs, node)

        async with agent_process(
            root, base / "2-armed.log", *scenario.args, crash_at=point, ray=node
        ) as armed:
            try:
                assert armed.address, "it exited before serving"
                await scenario.workload(armed, rig)
            except (AssertionError, grpc.aio.AioRpcError) as exc:
                raise AssertionError(premature(point, root, armed, exc)) from exc
            assert await armed.died() == armed.killed, armed.log_text()
        assert len(listing(root / "uris")) == scenario.dead_uris, "it did not die at the point"
        assert staging(root) == scenario.dead_staging, "it did not die at the point"
        assert len(listed(root, "trash")) == scenario.dead_trash, "it did not die at the point"
        if scenario.died_with is not None:
            scenario.died_with(rig)

        async with agent_process(root, base / "3-restart.log", ray=node) as agent:
            r = await check_recovered(agent, root, pkgs, scenario.kept)
            assert r.rows_dropped == scenario.rows_dropped, r
            assert r.orphans_deleted == scenario.orphans, r
            assert r.envs_forgotten == scenario.envs_forgotten, r
            if scenario.bytes_freed < 0:  # a venv cut short: as much as it had written
                assert r.bytes_freed > 0, r
            else:
                assert r.bytes_freed == scenario.bytes_freed, r
            await create_each(
                agent, root, pkgs, set(scenario.kept | scenario.refetched), set(scenario.refetched)
            )
            if scenario.after is not None:
                await scenario.after(agent, rig)


async def test_sigkill_while_recovery_deletes_leftovers_is_finished_by_the_next_start(
    base: Path,
) -> None:
    """A kill -9 while recovery deletes a previous run's staging leftovers (a folder under tmp/
    of no live holder, set aside into the recovering agent's trash): the next start reaps that
    dead agent, deletes them, keeps the cache and serves it without downloads."""
    root = base / "root"
    async with package_server() as pkgs:
        for name, body in ZIPS.items():
            pkgs.add(name, body)
        await install_x_and_stop(root, base / "1-clean.log", pkgs)
        (root / "tmp" / "stale").mkdir()
        (root / "tmp" / "stale" / "package.zip").write_bytes(b"z" * 1234)

        async with agent_process(
            root, base / "2-armed.log", crash_at="during_trash_deletion"
        ) as armed:
            assert await armed.died() == -signal.SIGKILL, armed.log_text()
        assert listed(root, "trash") != [], "it did not die while deleting the leftovers"
        assert not (root / "tmp" / "stale").exists(), "the leftovers were not set aside"

        async with agent_process(root, base / "3-restart.log") as agent:
            r = await check_recovered(agent, root, pkgs, frozenset({"x.zip"}))
            assert (r.rows_dropped, r.orphans_deleted, r.envs_forgotten) == (0, 0, 0), r
            assert r.bytes_freed == 1234, r
            await create_each(agent, root, pkgs, {"x.zip"}, set())
