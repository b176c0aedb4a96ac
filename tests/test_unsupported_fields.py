"""Ray's fields that need what this agent does not manage on the node (``NEEDS_ON_NODE``:
conda, image_uri, container, _nsight, _rocprof_sys), refused by name through both doors of one
real agent: FAILED_PRECONDITION over gRPC, a FAILED reply over Ray's HTTP door (the raylet fails
the task with this text), each saying what the node would need, and nothing counted."""

from __future__ import annotations

import json

import aiohttp
import grpc
import pytest

from agent.app.config import RaySettings
from agent.core.env_fields import NEEDS_ON_NODE
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.in_process import running_agent
from tests.harness.ray_door import RayClient

VALUES: dict[str, object] = {
    "conda": {"dependencies": ["numpy"]},
    "image_uri": "docker.io/rayproject/ray:2.60.0",
    "container": {"image": "rayproject/ray:2.60.0"},
    "_nsight": "default",
    "_rocprof_sys": {"args": {}, "env": {}},
}


def test_every_refused_field_has_a_value_here() -> None:
    assert set(VALUES) == set(NEEDS_ON_NODE)


@pytest.mark.parametrize("name", sorted(NEEDS_ON_NODE))
async def test_a_field_the_node_cannot_serve_is_refused_by_name_through_both_doors(
    name: str,
) -> None:
    text = json.dumps({"env_vars": {"A": "1"}, name: VALUES[name]})
    expected = f"runtime_env field {name!r} cannot be used on this node: it needs "
    async with (
        running_agent(ray=RaySettings()) as a,
        aiohttp.ClientSession() as session,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.create(text)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = caught.value.details() or ""
        assert details == expected + NEEDS_ON_NODE[name]
        reply = await RayClient(session, a.agent.ray_address).create(text)
        assert reply.status == ray_pb2.AGENT_RPC_STATUS_FAILED
        assert reply.error_message.endswith(expected + NEEDS_ON_NODE[name])
        info = await a.info()
        assert (info.total_envs, list(info.uris)) == (0, [])
        a.service.check_invariants()
