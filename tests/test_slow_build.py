"""A first build slower than the setup timeout (a package index on 127.0.0.1 that drips), through
the Ray door of a real agent with Ray's log dir: the create fails at its timeout in Ray's words,
the build goes on (info shows it in flight, its bytes so far; nothing half-built is visible), its
progress lines reach the job's setup log in Ray's format, and a retry joins it: one download."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest

from agent.app.config import RaySettings
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.drip_index import drip_index
from tests.harness.in_process import running_agent
from tests.harness.pip_wheels import isolate_pip
from tests.harness.polling import wait_until
from tests.harness.ray_door import RayClient
from tests.harness.uv_wheels import write_wheel

OK = ray_pb2.AGENT_RPC_STATUS_OK
FAILED = ray_pb2.AGENT_RPC_STATUS_FAILED
# Ray's LOGGER_FORMAT: "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"
RAY_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\tINFO rtenv-agent:0 -- building ray_pip:"
    r"pip://\S+: .*so far, \d+s$",
    re.MULTILINE,
)


async def test_a_build_slower_than_the_setup_timeout_goes_on_and_a_retry_joins_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_pip(monkeypatch)
    wheel = write_wheel(tmp_path / "wheels", "dripme", payload=768 * 1024)
    logs = tmp_path / "logs"  # as the raylet's --log-dir names it
    logs.mkdir()
    async with (
        drip_index(wheel) as index,
        running_agent(ray=RaySettings(log_dir=logs), pip_installer="pip") as a,
        aiohttp.ClientSession() as session,
    ):
        a.service.store.builds.every_s = 0.3  # progress lines every 0.3 s (5 s by default)
        ray = RayClient(session, a.agent.ray_address)
        options = ["--index-url", index.simple]
        env = json.dumps({"pip": {"packages": ["dripme"], "pip_install_options": options}})

        first = await ray.create(env, timeout_s=2)  # the wheel's second half is held
        assert first.status == FAILED
        assert "was not set up within 2s (setup_timeout_seconds)" in first.error_message
        assert "1 build(s) go on" in first.error_message
        assert "setup_timeout_seconds" in first.error_message

        async def measured() -> bool:
            builds = (await a.info()).builds
            return len(builds) == 1 and builds[0].bytes_so_far > 0

        await wait_until(measured, what="info showing the build in flight, bytes so far")
        info = await a.info()
        [build] = info.builds
        assert build.kind == "ray_pip"  # the Ray door's pip kind
        assert build.uri.startswith("pip://")
        assert build.kept
        assert not build.queued
        assert list(build.env_ids) == []  # nobody waits: the create timed out
        [uri] = info.uris
        assert (uri.state, uri.local_path) == ("installing", "")  # nothing half-built used
        assert a.uri_dirs() == []  # nor placed

        setup_log = logs / "runtime_env_setup-01000000.log"  # the raylet's job id, hex
        await wait_until(
            lambda: setup_log.exists() and RAY_LINE.search(setup_log.read_text()) is not None,
            what="a progress line in the job's setup log, in Ray's format",
        )
        print(setup_log.read_text().splitlines()[-1])  # for the record (pytest -s)

        retry = asyncio.ensure_future(ray.create(env, timeout_s=60))
        await wait_until(
            lambda: any(b.env_ids for b in a.service.waiting.in_flight()),
            what="the retry waiting on the build in flight",
        )
        [joined] = a.service.waiting.in_flight()
        assert joined.job_ids == ("01000000",)
        assert a.service.store.installs_in_flight() == 1  # joined, not a second build
        index.release()
        second = await retry
        assert second.status == OK, second.error_message
        assert index.gets == 1  # one download at the source
        assert (await a.info()).builds == []
        [placed] = a.uri_dirs()
        assert placed.startswith("ray_pip-")
        a.service.check_invariants()
