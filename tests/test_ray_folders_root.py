"""Ray's folders of agents whose root is not in Ray's session (issue 40: ``RTENV_ROOT``, the Ray
switch's ``--root``): real ``rtenv-agent ray-agent`` processes, as a raylet starts them with
Ray's flags for two nodes' sessions, on one shared root outside both, created through their gRPC
door from packages served on 127.0.0.1.

Each node's folders show the packages its own envs used, as trees of hard links into the root,
and no package only the other used; where Ray's cache size is 0 an unused package goes from the
node's folder (and from the root) at once; a package still cached stays in the folder of a node
that used it, until another agent of the root evicts it; an agent that stops takes its entries
out of its folders (left, they would keep an evicted package's bytes), the root keeping its
packages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.crashing_agent import AgentProc, RayNode, agent_process, listing
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip
from tests.harness.polling import wait_until

pytestmark = pytest.mark.timeout(120)

X_ZIP = make_zip({"proj/x.txt": "x" * 10_000, "proj/sub/y.txt": "y" * 100})  # a working_dir
M_ZIP = make_zip({"mmod/__init__.py": "VALUE = 'm'\n"})  # a py_module
PASS_S = 25.0  # an agent's periodic pass comes every 10 s: another agent's eviction seen by then
SOON_S = 10.0  # after a pass this agent asked for (a create, a release)


def entries(node: RayNode, folder: str) -> list[str]:
    path = node.runtime_resources / folder
    return listing(path) if path.is_dir() else []


def tree_of(root: Path, node: RayNode, folder: str, name: str) -> bool:
    """Whether the node's folder shows package ``name`` of the root whole: a tree (no link) of
    its files, each a hard link to the package's."""
    tree, package = node.runtime_resources / folder / name, root / "uris" / name
    if tree.is_symlink() or not tree.is_dir():
        return False
    mine = {os.path.relpath(os.path.join(t, f), tree) for t, _, fs in os.walk(tree) for f in fs}
    theirs = {
        os.path.relpath(os.path.join(t, f), package) for t, _, fs in os.walk(package) for f in fs
    }
    return (
        bool(mine)
        and mine == theirs
        and all((tree / f).stat().st_ino == (package / f).stat().st_ino for f in mine)
    )


async def create(agent: AgentProc, env: str) -> str:
    reply = await agent.create(env)
    assert reply.runtime_env_id, reply
    return reply.runtime_env_id


async def test_agents_on_a_shared_root_fill_and_empty_their_own_nodes_ray_folders(
    base: Path,
) -> None:
    root = base / "root"  # shared, in neither session
    a, b = RayNode(base / "sa", "aa" * 28), RayNode(base / "sb", "bb" * 28)
    zero = {"RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB": "0"}  # on A only: B keeps what it used
    async with package_server() as pkgs:
        pkgs.add("x.zip", X_ZIP)
        pkgs.add("m.zip", M_ZIP)
        wd_env = env_json(working_dir=f"{pkgs.base_url}/x.zip")
        mod_env = env_json(py_modules=[f"{pkgs.base_url}/m.zip"])
        async with (
            agent_process(root, base / "a.log", ray=a, environ=zero) as agent_a,
            agent_process(root, base / "b.log", ray=b) as agent_b,
        ):
            assert agent_a.address, agent_a.log_text()
            assert agent_b.address, agent_b.log_text()
            a_x = await create(agent_a, wd_env)
            [x] = listing(root / "uris")

            await wait_until(
                lambda: tree_of(root, a, "working_dir_files", x),
                timeout_s=SOON_S,
                what="x's tree in A's folder",
            )
            await create(agent_b, mod_env)  # B's pass after it adopts X: B never used it
            [m] = [d for d in listing(root / "uris") if d != x]
            await wait_until(
                lambda: tree_of(root, b, "py_modules_files", m),
                timeout_s=SOON_S,
                what="m's tree in B's folder",
            )
            assert {u.uri for u in (await agent_b.info()).uris} >= {f"{pkgs.base_url}/x.zip"}
            assert entries(b, "working_dir_files") == [], "B shows a package only A used"
            assert entries(a, "py_modules_files") == []
            for node in (a, b):  # the folders Ray's GC checks list, made even empty
                assert all((node.runtime_resources / f).is_dir() for f in ("pip", "conda"))

            b_x = await create(agent_b, wd_env)  # a hit: X is the root's already
            await wait_until(
                lambda: tree_of(root, b, "working_dir_files", x),
                timeout_s=SOON_S,
                what="x's tree in B's folder",
            )
            assert pkgs.gets["x.zip"] == 1
            assert await agent_b.delete(b_x) == 0  # B keeps X cached (no cache size set)
            assert tree_of(root, b, "working_dir_files", x)
            assert await agent_a.delete(a_x) == 0  # A's size 0: out of A's folder and the root
            await wait_until(
                lambda: entries(a, "working_dir_files") == [] and x not in listing(root / "uris"),
                timeout_s=SOON_S,
                what="x gone from A's folder and from the root at A's release",
            )
            await wait_until(
                lambda: entries(b, "working_dir_files") == [],
                timeout_s=PASS_S,
                what="x gone from B's folder once B's pass sees A's eviction",
            )

            await agent_b.sigterm()  # B stops: what it showed goes, the root keeps m
            assert entries(b, "py_modules_files") == []
            assert m in listing(root / "uris")
            await agent_a.sigterm()
