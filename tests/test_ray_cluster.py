"""A three-node Ray cluster on this machine (a head and two worker nodes, each its own raylet
and agent, each its own loopback IP): tasks of one runtime env spread over every node, each node
installs each package once and its counts return to 0; killing one worker node's agent takes
that node down while the others keep running tasks. One cluster serves the module; the test that
kills a node runs last."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.packages import workdir_zip
from tests.harness.ray_nodes import (
    EXIT_S,
    HTTP_OK,
    OURS,
    Json,
    RayNode,
    ThreadedPackageServer,
    agent_info,
    alive,
    drive,
    modules_zip,
    package_server,
    poll,
    ray_nodes,
    wait_counts_zero,
)

pytestmark = pytest.mark.timeout(600)  # the first test starts three nodes
NODES = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RayNode]]:
    with ray_nodes(NODES) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedPackageServer]:
    with package_server() as server:
        yield server


def _env(served: ThreadedPackageServer, folder: Path) -> Json:
    """One env: a working dir and a py_module, over http when the agent can fetch it."""
    wd = workdir_zip({"data.txt": "cluster working dir"})
    mods = modules_zip({"e2e_cluster_mod": "cluster module"})
    if HTTP_OK:
        return {
            "working_dir": served.add("cluster-wd.zip", wd),
            "py_modules": [served.add("cluster-mods.zip", mods)],
            "env_vars": {"E2E_CLUSTER": "1"},
        }
    (folder / "wd.zip").write_bytes(wd)
    (folder / "mods.zip").write_bytes(mods)
    return {
        "working_dir": (folder / "wd.zip").as_uri(),
        "py_modules": [(folder / "mods.zip").as_uri()],
        "env_vars": {"E2E_CLUSTER": "1"},
    }


SPEC = {"files": ["data.txt"], "modules": ["e2e_cluster_mod"], "env": ["E2E_CLUSTER"]}


def _check_results(got: Json, nodes: int) -> Counter[str]:
    """Every task saw its env; return the tasks run per node (all ``nodes`` of them)."""
    per_node: Counter[str] = Counter()
    for result in got["results"]:
        assert "error" not in result, result
        assert result["files"] == {"data.txt": "cluster working dir"}, result
        assert result["modules"] == {"e2e_cluster_mod": "cluster module"}, result
        assert result["env"] == {"E2E_CLUSTER": "1"}, result
        per_node[result["node"]] += 1
    assert set(per_node) == set(got["nodes"]), per_node
    assert len(per_node) == nodes, per_node
    return per_node


def test_one_env_spread_over_three_nodes_is_installed_once_per_node(
    cluster: list[RayNode], served: ThreadedPackageServer, tmp_path: Path
) -> None:
    """Tasks with ``scheduling_strategy="SPREAD"`` run on all three nodes, each node's agent
    installs each package once (one download per node), and every node's counts return to 0."""
    env = _env(served, tmp_path)
    got = drive(cluster[0], "spread", {"nodes": NODES, "runtime_env": env, "spec": SPEC})
    _check_results(got, NODES)
    assert {n.node_id for n in cluster} == set(got["nodes"])
    if HTTP_OK:
        assert served.gets("cluster-wd.zip") == NODES, "one download per node"
        assert served.gets("cluster-mods.zip") == NODES
    downloads = {}
    for node in cluster:
        wait_counts_zero(node)
        if OURS:
            info = agent_info(node)
            downloads[node.node_id] = info.cache.downloads
            packages = [u.uri for u in info.uris]
            assert sorted(packages) == sorted([env["working_dir"], *env["py_modules"]])
    if OURS and len({n.root for n in cluster}) == NODES:
        assert set(downloads.values()) == {2}, downloads
    elif OURS:  # Ray before 2.54: a local worker node's session is the head's, so is its root
        assert sum(downloads.values()) == 2, downloads


def test_killing_a_worker_nodes_agent_takes_that_node_down_and_the_others_run_on(
    cluster: list[RayNode], served: ThreadedPackageServer, tmp_path: Path
) -> None:
    """SIGKILL one worker node's agent: its raylet exits (Ray's fate sharing), Ray marks the node
    dead, and tasks of the env still run on the two other nodes."""
    victim = cluster[-1]
    agent, raylet = victim.agent_pid(), victim.raylet_pid()
    assert agent is not None, victim.logs()
    assert raylet is not None, victim.logs()
    os.kill(agent, signal.SIGKILL)
    poll(lambda: True if not alive(raylet) else None, EXIT_S, "the raylet to exit")
    dead = drive(cluster[0], "wait_dead", {"node": victim.node_id, "timeout_s": 60})
    assert sorted(dead["alive"]) == sorted(n.node_id for n in cluster[:-1]), dead
    env = _env(served, tmp_path)
    got = drive(cluster[0], "spread", {"nodes": NODES - 1, "runtime_env": env, "spec": SPEC})
    _check_results(got, NODES - 1)
    # Counts are not awaited here: after a node's death, Ray's raylet was seen to keep one count
    # on the head for over a minute with Ray's own agent as well (a lease it cancelled).
