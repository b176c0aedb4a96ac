"""Fate sharing with the real raylet, both ways, and Ray's token auth on the agent's Ray port.
Each test starts a node of its own (it ends it, or locks it down)."""

from __future__ import annotations

import os
import signal

import pytest

from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.ray_nodes import (
    EXIT_S,
    alive,
    drive,
    needs_token_auth,
    new_token,
    poll,
    ray_nodes,
    ray_post,
)

pytestmark = pytest.mark.timeout(300)


def test_killing_the_raylet_ends_its_agent() -> None:
    """SIGKILL the raylet: its agent notices and exits on its own."""
    with ray_nodes(1) as (node,):
        agent, raylet = node.agent_pid(), node.raylet_pid()
        assert agent is not None, node.logs()
        assert raylet is not None, node.logs()
        os.kill(raylet, signal.SIGKILL)
        poll(lambda: True if not alive(agent) else None, EXIT_S, "the agent to exit")


def test_killing_the_agent_ends_its_raylet() -> None:
    """SIGKILL the agent: the raylet, which shares its fate, exits."""
    with ray_nodes(1) as (node,):
        agent, raylet = node.agent_pid(), node.raylet_pid()
        assert agent is not None, node.logs()
        assert raylet is not None, node.logs()
        os.kill(agent, signal.SIGKILL)
        poll(lambda: True if not alive(raylet) else None, EXIT_S, "the raylet to exit")


@needs_token_auth
def test_with_token_auth_tasks_run_and_the_agents_port_wants_the_token() -> None:
    """RAY_AUTH_MODE=token and RAY_AUTH_TOKEN for the whole node: a task with a runtime env
    runs; on the agent's Ray port a request without the token gets 401, with another 403, with
    the node's token 200."""
    token = new_token()
    with ray_nodes(1, token=token) as (node,):
        env = {"env_vars": {"E2E_TOKEN": "on"}}
        case = {"name": "t", "runtime_env": env, "spec": {"env": ["E2E_TOKEN"]}}
        got = drive(node, "probe", {"cases": [case], "tasks_only": True})
        assert got["t"]["task"].get("env") == {"E2E_TOKEN": "on"}, got
        body = ray_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()
        path = "/get_runtime_envs_info"
        assert ray_post(node, path, body, token=None)[0] == 401
        assert ray_post(node, path, body, token=new_token())[0] == 403
        assert ray_post(node, path, body)[0] == 200
