"""Logs of a real ``python -m agent serve --log-format json`` process: one JSON object per line,
one line per event that matters (start, recovery, install start and end, eviction, every error
with its env id and request id), and nothing for a cache hit at the default level. Each line's
time is ISO-8601 with milliseconds and zone; the facts (address, budget, env id, request id,
sizes) are fields of their own, not only words in the message, and every line a request writes
carries the request's rpc, request_id and env_id."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.core import logfields
from agent.ops.logs import BoundFields, iso_time
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import STOP_S, serving
from tests.harness.packages import env_json, workdir_zip

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
        failed = await wait_line(
            log, lambda x: x.get("request_id") == "marker-7" and x["level"] == "WARNING", "failure"
        )
        lines = json_lines(log)
        between = [x["message"] for x in lines[ended + 1 : failed]]
        assert between == [f"installing working_dir:file://{base}/missing.zip"], "a hit logged"
        info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30)
        [failed_env] = [e.runtime_env_id for e in info.envs if e.state == "failed"]
        error = lines[failed]
        fields = ("rpc", "request_id", "env_id", "kind", "code")
        assert {key: error.get(key) for key in fields} == {
            "rpc": "CreateRuntimeEnv",
            "request_id": "marker-7",
            "env_id": failed_env,
            "kind": "not_found",
            "code": "NOT_FOUND",
        }
        assert f"env_id={failed_env} request_id='marker-7'" in error["message"]
        failures = [x for x in lines if x["level"] == "WARNING" and "marker-7" in json.dumps(x)]
        assert failures == [error], "one line per error"

        # Every line of a request carries its fields, the install it started included; the
        # hit wrote no line at all.
        def request_of(line: Line) -> tuple[object, ...]:
            return (line.get("rpc"), line.get("request_id"), line.get("env_id"))

        assert request_of(lines[failed - 1]) == ("CreateRuntimeEnv", "marker-7", failed_env)
        first = ("CreateRuntimeEnv", "create-1", reply.runtime_env_id)
        assert [request_of(x) for x in lines if "create-1" in json.dumps(x)] == [first, first]
        assert (request_of(lines[began]), request_of(lines[ended])) == (first, first)
        assert not any("create-2" in json.dumps(x) for x in lines)
        assert all(request_of(x) == (None, None, None) for x in lines[: serving_at + 1])

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


async def test_bound_fields_follow_the_work_into_its_tasks_and_end_with_their_scope() -> None:
    """``note`` adds to the innermost ``bind``, whose end drops it; a task started inside keeps
    the fields it was started with; a record's own extra fields win over bound ones."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    async def fields_seen_later() -> dict[str, object]:
        await asyncio.sleep(0)
        return dict(logfields.bound())

    handler = Keep()
    handler.addFilter(BoundFields())
    logger = logging.getLogger("tests.bound")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with logfields.bind(rpc="Create", request_id="r1"):
            logfields.note(env_id="e1")
            task = asyncio.create_task(fields_seen_later())
            logger.warning("inside", extra={"request_id": "own"})
            with logfields.bind(rpc="Inner"):
                logfields.note(env_id="e2")
                assert logfields.bound() == {"rpc": "Inner", "request_id": "r1", "env_id": "e2"}
            inherited = await task
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert logfields.bound() == {}
    assert inherited == {"rpc": "Create", "request_id": "r1", "env_id": "e1"}
    inside, outside = (vars(r) for r in records)
    assert (inside["rpc"], inside["request_id"], inside["env_id"]) == ("Create", "own", "e1")
    assert not {"rpc", "request_id", "env_id"} & set(outside)
