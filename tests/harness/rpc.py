"""Refused RPCs: the one check that a call failed with a given status code and words."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest


async def rpc_refused(call: Awaitable[object], code: grpc.StatusCode, *words: str) -> str:
    """Await ``call``: it must fail with ``code`` and details naming each of ``words``; return
    the details."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    details = caught.value.details() or ""
    assert caught.value.code() == code, f"{caught.value.code()}, not {code}: {details}"
    for word in words:
        assert word in details, f"{word!r} not in {details!r}"
    return details
