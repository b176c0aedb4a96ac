"""Unknown runtime_env fields: the Ray door ignores them with a warning on each setup, as Ray's
agent does (Ray's test_unexpected_field_warning: "an unexpected runtime_env field doesn't
error"), bounded in count and name length; the gRPC door still refuses them by name. Parsing
(pure) and a real agent's Ray door over 127.0.0.1."""

from __future__ import annotations

import json
import logging

import pytest

from agent.core.dialect import RAY
from agent.core.env_fields import MAX_IGNORED_FIELDS, MAX_IGNORED_NAME_CHARS
from agent.core.errors import InvalidRuntimeEnv, UnsupportedOnNode
from agent.core.runtime_env import EnvLimits, RuntimeEnv, parse_runtime_env
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.ray_door import ray_agent

LIMITS = EnvLimits()
OK = ray_pb2.AGENT_RPC_STATUS_OK
FAILED = ray_pb2.AGENT_RPC_STATUS_FAILED


def ray_env(obj: dict[str, object]) -> RuntimeEnv:
    return parse_runtime_env(json.dumps(obj), LIMITS, dialect=RAY, node_python="/py")


def test_the_ray_door_ignores_an_unknown_field_naming_it_in_the_envs_identity() -> None:
    env = ray_env({"unexpected_field": "value", "env_vars": {"A": "1"}})
    assert env.ignored == ("unexpected_field",)
    assert env.env_vars == {"A": "1"}
    assert env.env_id != ray_env({"env_vars": {"A": "1"}}).env_id  # another text Ray counts


def test_the_grpc_door_still_refuses_it_by_name() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"unknown runtime_env field.*'unexpected_field'"):
        parse_runtime_env(json.dumps({"unexpected_field": "value"}), LIMITS)


@pytest.mark.parametrize(
    "obj",
    [
        {f"f{n}": 1 for n in range(MAX_IGNORED_FIELDS + 1)},
        {"x" * (MAX_IGNORED_NAME_CHARS + 1): 1},
    ],
)
def test_past_the_bounds_the_ray_door_refuses_saying_them(obj: dict[str, object]) -> None:
    with pytest.raises(InvalidRuntimeEnv, match=f"ignored up to {MAX_IGNORED_FIELDS} of at most"):
        ray_env(obj)


def test_fields_the_node_cannot_serve_are_still_refused_beside_an_unknown_one() -> None:
    with pytest.raises(UnsupportedOnNode, match="'conda'"):
        ray_env({"conda": "env", "unexpected_field": 1})


async def test_a_create_with_an_unknown_field_succeeds_and_warns_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = json.dumps({"unexpected_field": "value", "env_vars": {"A": "1"}})
    async with ray_agent() as (ra, ray):
        with caplog.at_level(logging.WARNING, logger="agent.app.parsing"):
            reply = await ray.create(text)
        assert reply.status == OK, reply.error_message
        assert json.loads(reply.serialized_runtime_env_context)["env_vars"]["A"] == "1"
        warned = [r for r in caplog.records if r.name == "agent.app.parsing"]
        assert [r.getMessage().split(" (env ")[0] for r in warned] == [
            "runtime_env field unexpected_field is not recognized and will be ignored, as "
            "Ray's agent ignores it"
        ]
        assert warned[0].field == "unexpected_field"  # type: ignore[attr-defined]
        too_many = json.dumps({f"f{n}": 1 for n in range(MAX_IGNORED_FIELDS + 1)})
        refused = await ray.create(too_many)
        assert refused.status == FAILED
        assert "unknown runtime_env field(s)" in refused.error_message
        ra.service.check_invariants()
