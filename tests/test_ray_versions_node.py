"""A stock node of an older supported Ray (2.51 to 2.53: its raylet passes no --node-id and no
--session-dir and picks the agent's port itself) runs this agent: a job's working_dir, uploaded
to the GCS, is served to its task; no port file is written; and Ray 2.51's lack of token auth is
kept (RAY_AUTH_MODE=token on the node asks no token of its raylet). Runs only where such a Ray is
installed (CI's old-Ray venv, .ci/uvloop-pass); on Ray 2.54 and later the other Ray-node tests
cover the same start."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.ray_nodes import (
    OURS,
    PORT_FILES,
    RAY_RELEASE,
    cmdline,
    drive,
    new_token,
    ray_nodes,
    ray_post,
    wait_counts_zero,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(PORT_FILES, reason="Ray 2.54 and later: the other Ray-node tests cover it"),
    pytest.mark.skipif(not OURS, reason="this agent's start on an older Ray"),
]


def test_an_older_rays_node_runs_a_jobs_working_dir_on_this_agent(tmp_path: Path) -> None:
    token = new_token() if RAY_RELEASE < (2, 52) else None  # on 2.51, to see it is not asked
    with ray_nodes(1, token=token) as (node,):
        agent = node.agent_pid()
        assert agent is not None, node.logs()
        words = shlex.split(cmdline(agent))
        version = ".".join(map(str, RAY_RELEASE))
        assert any(w.startswith(f"--ray-version={version}") for w in words), words
        assert "--node-id" not in " ".join(words)
        assert not list(node.session_dir.glob("runtime_env_agent_port_*")), "no port file"
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "data.txt").write_text("old ray's working dir")
        spec = {"files": ["data.txt"]}
        got = drive(node, "job", {"job_env": {"working_dir": "./job"}, "spec": spec}, cwd=tmp_path)
        for kind in ("task", "actor"):
            assert got[kind].get("files") == {"data.txt": "old ray's working dir"}, got
            assert got[kind]["runtime_env"]["working_dir"].startswith("gcs://_ray_pkg_"), got
        if token is not None:
            body = ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()
            assert ray_post(node, "/get_runtime_envs_info", body, token=None)[0] == 200
            log = (node.session_dir / "logs" / "runtime_env_agent.log").read_text()
            assert "RAY_AUTH_MODE=token is ignored: Ray 2.51" in log, log[-2000:]
        wait_counts_zero(node)
