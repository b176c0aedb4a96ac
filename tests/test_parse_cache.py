"""The parse cache remembers each text's env per dialect: one env read through both doors
(one env id) is two values, each with its own dialect, whatever order the texts come in."""

from __future__ import annotations

import json

from agent.app.parsing import ParseCache
from agent.core.dialect import GRPC, RAY
from agent.core.runtime_env import EnvLimits

TEXT = json.dumps({"env_vars": {"A": "1"}})
SPACED = json.dumps({"env_vars": {"A": "1"}}, indent=1)  # another spelling of the same env


def test_an_env_read_through_both_doors_keeps_each_doors_dialect_on_every_hit() -> None:
    cache = ParseCache(EnvLimits(), ())
    ray = cache.parse(TEXT, RAY)
    grpc = cache.parse(SPACED, GRPC)
    assert ray.env_id == grpc.env_id  # nothing either door reads otherwise: one env
    for _ in range(2):  # hits, in either order
        assert cache.parse(TEXT, RAY).dialect is RAY
        assert cache.parse(SPACED, GRPC).dialect is GRPC
        assert cache.parse(SPACED, RAY).dialect is RAY
        assert cache.parse(TEXT, GRPC).dialect is GRPC
