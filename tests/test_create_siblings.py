"""A create that fails on one package cancels the installs of its other packages that no other
create waits for: nothing it started keeps downloading for nobody."""

from __future__ import annotations

import grpc
import pytest

from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, make_zip
from tests.harness.polling import wait_until


async def test_a_failed_package_cancels_its_siblings_install() -> None:
    async with package_server() as pkgs, running_agent() as ra:
        held_url = pkgs.add("held.zip", make_zip({"a.txt": "a"}))
        gate = pkgs.hold("held.zip")  # released only at the end: the install would wait
        missing_url = pkgs.add("missing.zip", b"", statuses=[404] * 10)
        await wait_until(lambda: pkgs.base_url != "", what="the package server")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await ra.create(env_json(working_dir=held_url, py_modules=[missing_url]))
        assert "404" in (failed.value.details() or "")
        store = ra.service.store
        await wait_until(
            lambda: store.installs_in_flight() == 0,
            timeout_s=5,
            what="the held working_dir's install cancelled once its create failed",
        )
        assert ra.uri_dirs() == []
        ra.service.check_invariants()
        gate.set()  # the server's handler ends; nobody is listening any more
