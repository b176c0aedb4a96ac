"""Two real Ray nodes of one cluster on this machine (127.0.0.2 and 127.0.0.3), their raylets
launching this agent with one ``RTENV_ROOT`` (issue 16): each agent on a socket of its own in the
root (``agent-<node>.sock``), both running tasks whose working_dir and py_modules come from a
package server on 127.0.0.1, and each package installed once for the two of them."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent.ops.ray_agent import grpc_address
from tests.harness.packages import workdir_zip
from tests.harness.ray_nodes import (
    Driver,
    Json,
    RayNode,
    agent_info,
    modules_zip,
    needs_http,
    needs_ours,
    package_server,
    poll,
    ray_nodes,
    wait_counts_zero,
)

# Ray's own agent has no RTENV_ROOT: two of them download twice
pytestmark = [pytest.mark.timeout(300), needs_ours]
NODES = 2
SEEN_S = 60.0  # both agents to be waiting on the one install the server holds
SPEC = {"files": ["data.txt"], "modules": ["e2e_shared_mod"], "env": ["E2E_SHARED"]}


def _rows(root: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """One read of the shared index (read-only, waiting out writers)."""
    con = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _holder(root: Path, node: RayNode) -> str:
    """The holder id of ``node``'s agent (its row in ``holders`` names its pid)."""
    pid = node.agent_pid()
    assert pid is not None, node.logs()

    def found() -> str | None:
        ids = [r[0] for r in _rows(root, "SELECT id FROM holders WHERE pid = ?", pid)]
        return ids[0] if len(ids) == 1 else None

    return poll(found, SEEN_S, f"agent {pid}'s holder row")


@needs_http
def test_two_ray_nodes_sharing_one_root_install_each_package_once(base: Path) -> None:
    """Both nodes' agents want the env's two packages at once (their references are in the
    index while the server holds the one GET of each); one GET per package in all, one folder
    per package in the root, every task on both nodes sees its env, and both nodes' counts
    return to 0."""
    root = base / "root"
    with package_server() as served, ray_nodes(NODES, env={"RTENV_ROOT": str(root)}) as nodes:
        addresses = {grpc_address(root, n.temp_dir, n.agent_key) for n in nodes}
        assert len(addresses) == NODES, "one socket per node"
        for node in nodes:
            assert os.path.lexists(root / f"agent-{node.agent_key[:16]}.sock"), node.logs()
        holders = [_holder(root, node) for node in nodes]
        names = {"shared-wd.zip": workdir_zip({"data.txt": "shared root working dir"})}
        names["shared-mods.zip"] = modules_zip({"e2e_shared_mod": "shared root module"})
        urls = {name: served.add(name, body) for name, body in names.items()}
        gates = {name: served.server.hold(name) for name in names}
        env: Json = {
            "working_dir": urls["shared-wd.zip"],
            "py_modules": [urls["shared-mods.zip"]],
            "env_vars": {"E2E_SHARED": "1"},
        }
        driver = Driver(nodes[0], "spread", {"nodes": NODES, "runtime_env": env, "spec": SPEC})
        try:
            wanted = {(h, url) for h in holders for url in urls.values()}

            def both_wait() -> bool | None:
                fetched = all(served.gets(n) for n in names)
                return (
                    fetched and wanted <= set(_rows(root, "SELECT holder, uri FROM refs"))
                ) or None

            poll(both_wait, SEEN_S, "each package's GET, and both agents' references, held")
            assert {n: served.gets(n) for n in names} == dict.fromkeys(names, 1), (
                "both agents fetched a package: the second did not wait on the first's install"
            )
            for gate in gates.values():
                served.loop.call_soon_threadsafe(gate.set)
            got = driver.result()
        finally:
            for gate in gates.values():
                served.loop.call_soon_threadsafe(gate.set)
            driver.kill()

        per_node: Counter[str] = Counter()
        for result in got["results"]:
            assert "error" not in result, result
            assert result["files"] == {"data.txt": "shared root working dir"}, result
            assert result["modules"] == {"e2e_shared_mod": "shared root module"}, result
            assert result["env"] == {"E2E_SHARED": "1"}, result
            per_node[result["node"]] += 1
        assert set(per_node) == {n.node_id for n in nodes}, per_node
        assert {n: served.gets(n) for n in names} == dict.fromkeys(names, 1), "once per root"
        packages = _rows(root, "SELECT uri, dir, state FROM uris")
        assert {uri for uri, _, _ in packages} == set(urls.values())
        assert {state for _, _, state in packages} == {"ready"}
        on_disk = {p.name for p in (root / "uris").iterdir() if not p.name.startswith(".")}
        assert on_disk == {d for _, d, _ in packages}, "one folder per package"
        for node in nodes:
            wait_counts_zero(node)
        downloads = [agent_info(node).cache.downloads for node in nodes]
        assert sum(downloads) == len(names), downloads
