"""One real Ray node (``ray start``, its raylet launching this agent) with Ray's
``RAY_RUNTIME_ENV_LOG_TO_DRIVER_ENABLED=1``: a task whose pip env's first build is slow (a package
index on 127.0.0.1 that drips) shows this agent's progress lines at its driver, through the job's
setup log and Ray's log monitor, as ``(pid=runtime_env...) ... building ray_pip:...``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.drip_index import drip_index
from tests.harness.ray_nodes import OURS, needs_ours, poll, ray_nodes
from tests.harness.uv_wheels import write_wheel

pytestmark = pytest.mark.timeout(240)
MARK = "INFO rtenv-agent:0 -- building ray_pip:pip://"

DRIVER = """
import json, sys, ray
args = json.loads(sys.argv[1])
ray.init(address=args["address"], _node_ip_address=args["ip"], log_to_driver=True)
env = {"pip": {"packages": ["dripme"], "pip_install_options": ["--index-url", args["index"]]},
       "config": {"setup_timeout_seconds": 120}}

@ray.remote(runtime_env=env)
def value():
    import dripme
    return dripme.VALUE

print("VALUE " + ray.get(value.remote()), flush=True)
"""


class _ThreadedDrip:
    """The drip index on an event loop of its own (the test waits on processes)."""

    def __init__(self, wheel: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._cm = drip_index(wheel, chunk_delay_s=0.2)
        self.index = asyncio.run_coroutine_threadsafe(self._cm.__aenter__(), self.loop).result(10)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.index.release)

    def close(self) -> None:
        exit_ = self._cm.__aexit__(None, None, None)
        asyncio.run_coroutine_threadsafe(exit_, self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def dripping(tmp_path: Path) -> Iterator[_ThreadedDrip]:
    drip = _ThreadedDrip(write_wheel(tmp_path / "wheels", "dripme", payload=256 * 1024))
    try:
        yield drip
    finally:
        drip.close()


@needs_ours
def test_the_driver_shows_the_progress_of_a_slow_first_build(dripping: _ThreadedDrip) -> None:
    env = {"RAY_RUNTIME_ENV_LOG_TO_DRIVER_ENABLED": "1", "RTENV_PIP_INSTALLER": "pip"}
    with ray_nodes(1, num_cpus=1, env=env) as (node,):
        args = {"address": node.gcs_address, "ip": node.ip, "index": dripping.index.simple}
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(args)], env=dict(node.env),
            cwd=node.temp_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(
            target=lambda: lines.extend(line.rstrip("\n") for line in driver.stdout or ()),
            daemon=True,
        )
        reader.start()
        try:
            # the job's setup log's line, in Ray's format (the agent's own log, which Ray's log
            # monitor streams too with that variable, words it otherwise)
            shown = poll(
                lambda: next((line for line in lines if MARK in line), None),
                90.0,
                "a progress line of the job's setup log at the driver",
                every_s=0.2,
            )
            assert "(pid=runtime_env" in shown, shown  # how the driver prints a setup log
            dripping.release()
            assert driver.wait(timeout=90) == 0, "\n".join(lines[-40:])
            assert "VALUE dripme 1.0" in lines, "\n".join(lines[-40:])
            assert dripping.index.gets == 1
        finally:
            if driver.returncode is None:
                os.killpg(driver.pid, 9)
                driver.wait(timeout=10)
    assert OURS
