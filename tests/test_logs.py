"""Logs of a real ``python -m agent serve --log-format json`` process: one JSON object per line,
one line per event that matters (start, recovery, install start and end, eviction, every error
with its env id and request id), and nothing for a cache hit at the default level. Each line's
time is ISO-8601 with milliseconds and zone; the facts (address, budget, env id, request id,
sizes) are fields of their own, not only words in the message."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.ops.logs import iso_time
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.helpers import env_json, workdir_zip
from tests.test_process import STOP_S, serving

Line = dict[str, Any]
ISO_MS_ZONE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00")


def json_lines(log: Path) -> list[Line]:
    """Every complete line of the log, each of which must be a JSON object."""
    lines = []
    for text in log.read_text().splitlines(keepends=True):
        if not text.endswith("\n"):
            break  # being written
        line = json.loads(text)
        assert isinstance(line, dict), text
        assert {"time", "level", "logger", "message"} <= set(line), text
        assert ISO_MS_ZONE.fullmatch(line["time"]), line["time"]
        lines.append(line)
    return lines


async def wait_line(log: Path, match: Callable[[Line], bool], what: str) -> int:
    """Wait (bounded) for a line that matches; return its index."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for index, line in enumerate(json_lines(log)):
            if match(line):
                return index
        await asyncio.sleep(0.02)
    raise AssertionError(f"no log line {what} in 10s:\n{log.read_text()}")


async def test_json_logs_have_one_line_per_event_and_none_for_a_cache_hit(base: Path) -> None:
    package = base / "wd.zip"
    body = workdir_zip({"data.txt": "x" * 5000})
    package.write_bytes(body)
    uri = f"file://{package}"
    label = f"working_dir:{uri}"
    log = base / "agent.log"
    args = ("--root", str(base / "root"), "--log-format", "json", "--cache-budget", "0")
    async with (
        serving(log, *args) as agent,
        grpc.aio.insecure_channel(agent.address) as channel,
    ):
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]

        async def create(serialized: str, request_id: str) -> agent_pb2.CreateRuntimeEnvReply:
            reply: agent_pb2.CreateRuntimeEnvReply = await stub.CreateRuntimeEnv(
                agent_pb2.CreateRuntimeEnvRequest(
                    serialized_runtime_env=serialized, request_id=request_id
                ),
                timeout=30,
            )
            return reply

        serving_at = await wait_line(
            log, lambda x: x["message"].startswith("serving on"), "serving on"
        )
        start = json_lines(log)
        served = start[serving_at]
        assert served["address"] == agent.address
        assert (served["budget_bytes"], served["root"]) == (0, str((base / "root").resolve()))
        when = datetime.fromisoformat(served["time"])
        assert abs(datetime.now(UTC) - when) < timedelta(minutes=5), served["time"]
        [recovery] = [x for x in start if x["message"].startswith("recovery: 0 packages kept")]
        assert (recovery["rows_kept"], recovery["bytes_freed"]) == (0, 0)

        reply = await create(env_json(uri), "create-1")  # a miss: one install
        began = await wait_line(log, lambda x: x["message"] == f"installing {label}", "start")
        ended = await wait_line(
            log, lambda x: x["message"].startswith(f"installed {label}: "), "install end"
        )
        assert began < ended
        end_line = json_lines(log)[ended]
        end = end_line["message"]
        assert f": {len(body)} bytes fetched, 5000 bytes unpacked, " in end, end
        assert re.search(r", \d+\.\d\ds$", end), end
        assert (end_line["uri"], end_line["fetched_bytes"], end_line["unpacked_bytes"]) == (
            label,
            len(body),
            5000,
        )
        assert isinstance(end_line["seconds"], float)
        assert json_lines(log)[began]["uri"] == label

        await create(env_json(uri), "create-2")  # a hit: must log nothing
        missing = env_json(f"file://{base}/missing.zip")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await create(missing, "marker-7")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        failed = await wait_line(log, lambda x: x.get("request_id") == "marker-7", "failure")
        lines = json_lines(log)
        between = [x["message"] for x in lines[ended + 1 : failed]]
        assert between == [f"installing working_dir:file://{base}/missing.zip"], "a hit logged"
        info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30)
        [failed_env] = [e.runtime_env_id for e in info.envs if e.state == "failed"]
        error = lines[failed]
        assert (error["env_id"], error["level"], error["code"]) == (
            failed_env,
            "WARNING",
            "NOT_FOUND",
        )
        assert error["rpc"] == "CreateRuntimeEnv"
        assert f"env_id={failed_env} request_id='marker-7'" in error["message"]
        assert sum("marker-7" in json.dumps(x) for x in lines) == 1, "one line per error"
        assert not any("create-1" in json.dumps(x) or "create-2" in json.dumps(x) for x in lines)

        for _ in range(2):
            await stub.DeleteRuntimeEnv(
                agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=reply.runtime_env_id), timeout=30
            )
        evicted = await wait_line(log, lambda x: x["message"].startswith(f"evicted {label}"), "ev")
        assert "(5000 bytes, unused)" in json_lines(log)[evicted]["message"]
        assert (json_lines(log)[evicted]["uri"], json_lines(log)[evicted]["bytes"]) == (label, 5000)

        agent.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(agent.proc.wait(), STOP_S) == 0
        lines = json_lines(log)
        assert len(lines) == len(log.read_text().splitlines()), "a line that is not JSON"
        assert lines[-1]["message"] == "stopped"
        assert [x for x in lines if x["level"] not in ("INFO", "WARNING")] == []


def test_json_time_is_iso_8601_utc_with_milliseconds_and_zone() -> None:
    # 2026-12-01 01:02:03.456789 UTC: the milliseconds are truncated, not rounded up
    assert iso_time(1796086923.456789) == "2026-12-01T01:02:03.456+00:00"
    assert datetime.fromisoformat(iso_time(0.0)) == datetime(1970, 1, 1, tzinfo=UTC)
