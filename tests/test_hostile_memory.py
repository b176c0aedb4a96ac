"""A hostile client on the socket cannot pin the agent's memory, blow up its error trailers, or
make GetRuntimeEnvsInfo unreadable. Each test runs against a real ``python -m agent serve``
process and reads its resident size from /proc/<pid>/status (VmRSS)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agent.app.idempotency import MAX_REQUEST_ID_BYTES, RequestLog
from agent.core.bounded import BoundedCache
from agent.core.errors import (
    ECHO_CHARS,
    MAX_MESSAGE_BYTES,
    InvalidArgument,
    RequestIdReused,
    cap_message,
    echo,
)
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import Served, serving
from tests.harness.in_process import AgentCalls

MiB = 1024 * 1024
BIG_MESSAGES = [("grpc.max_send_message_length", 8 * MiB)]
# What any of the hostile loops below may leave the agent's RSS grown by. Before the fixes each
# loop grew it by 277 to 539 MiB; after them by 10 to 75 MiB: the caches' byte budgets (8 MiB
# each) and what malloc keeps of freed MiB-sized buffers (malloc_trim gives most of it back).
GROWTH_BOUND = 128 * MiB


def rss_bytes(pid: int) -> int:
    """The process's resident set size, from /proc/<pid>/status."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB$", text, re.MULTILINE)
    assert match is not None, text
    return int(match.group(1)) * 1024


@dataclass
class Client(AgentCalls):
    served: Served
    stub: agent_pb2_grpc.RuntimeEnvAgentStub

    @property
    def rss(self) -> int:
        return rss_bytes(self.served.proc.pid)


@asynccontextmanager
async def agent_process(base: Path, *args: str) -> AsyncIterator[Client]:
    """A real agent process and a client that may send messages up to 8 MiB."""
    async with (
        serving(base / "agent.log", "--root", str(base / "root"), *args) as served,
        grpc.aio.insecure_channel(served.address, options=BIG_MESSAGES) as channel,
    ):
        stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
        yield Client(served, stub)


async def status_of(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def growth(client: Client, loop: Callable[[], Awaitable[None]]) -> int:
    """RSS growth over ``loop``, after a warm-up that allocates gRPC's own buffers."""
    await client.create("{}")
    before = client.rss
    await loop()
    after = client.rss
    print(f"VmRSS {before / MiB:.1f} MiB -> {after / MiB:.1f} MiB")
    return after - before


async def still_answers(client: Client) -> None:
    reply = await client.create(json.dumps({"env_vars": {"OK": "1"}}))
    assert reply.context.env_vars["OK"] == "1"
    assert await client.delete(reply.runtime_env_id) == 0
    await client.info()


def log_lines_short(served: Served) -> None:
    """No log line echoes a huge input."""
    longest = max((len(line) for line in served.log_text().splitlines()), default=0)
    assert longest < 3 * MAX_MESSAGE_BYTES, f"a log line of {longest} characters"


async def test_huge_request_ids_are_refused_and_pin_nothing(base: Path) -> None:
    """120 creates with distinct 3 MiB request ids: INVALID_ARGUMENT, naming the limit, and the
    agent does not keep them (unbounded before: +390 MiB)."""
    async with agent_process(base) as client:

        async def loop() -> None:
            for i in range(120):
                request_id = f"{i:04d}" + "r" * (3 * MiB)
                code, details = await status_of(client.create("{}", request_id=request_id))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
                assert "request_id is 3145732 bytes; the limit is 128" in details, details
                assert len(details) < MAX_MESSAGE_BYTES
                code, details = await status_of(client.delete("0" * 32, request_id=request_id))
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])

        assert await growth(client, loop) < GROWTH_BOUND
        reply = await client.create("{}", request_id="r" * 128)  # at the limit: accepted
        assert await client.create("{}", request_id="r" * 128) == reply  # and remembered
        await still_answers(client)
        log_lines_short(client.served)


async def test_padded_spellings_of_one_env_are_parsed_once_and_pin_nothing(base: Path) -> None:
    """300 whitespace-padded ~1 MiB spellings of ``{}``: one env, and the parsed-env cache does
    not keep the texts (keyed by the raw text before: +296 MiB)."""
    async with agent_process(base) as client:
        ids = set()

        async def loop() -> None:
            for i in range(300):
                text = "{" + " " * (MiB - 100 - i) + "}"
                reply = await client.create(text)
                ids.add(reply.runtime_env_id)

        assert await growth(client, loop) < GROWTH_BOUND
        assert len(ids) == 1
        info = await client.info()
        assert [e.references for e in info.envs] == [301]
        await still_answers(client)


def big_vars(i: int) -> dict[str, str]:
    """900 KiB of variables (one may not exceed 128 KiB), distinct for each ``i``."""
    return {f"BIG{k}": f"{i:06d}" + "v" * (112 * 1024) for k in range(8)}


def big_env(i: int) -> str:
    return json.dumps({"env_vars": big_vars(i)})


async def test_distinct_big_envs_created_and_deleted_pin_nothing(base: Path) -> None:
    """150 distinct envs with a 900 KiB variable, each created (with a request id) and deleted:
    neither the parsed-env cache, the create-reply cache nor the request log keeps them all
    (each kept every one before)."""
    async with agent_process(base) as client:

        async def loop() -> None:
            for i in range(150):
                reply = await client.create(big_env(i), request_id=f"create-{i}")
                assert await client.delete(reply.runtime_env_id, request_id=f"delete-{i}") == 0

        assert await growth(client, loop) < GROWTH_BOUND
        # a retry of a create whose env was deleted since is still answered, the same way
        again = await client.create(big_env(149), request_id="create-149")
        assert again.context.env_vars["BIG0"].startswith("000149")
        await still_answers(client)


async def test_failed_big_envs_pin_nothing(base: Path) -> None:
    """100 failing creates of distinct envs with a 900 KiB variable: the record of recent
    failures keeps their ids and errors, not all their bodies (it kept 100 of them before)."""
    async with agent_process(base) as client:
        missing = f"file://{base}/missing.zip"

        async def loop() -> None:
            for i in range(100):
                text = json.dumps({"working_dir": missing, "env_vars": big_vars(i)})
                code, details = await status_of(client.create(text))
                assert code == grpc.StatusCode.NOT_FOUND, (code, details[:200])

        assert await growth(client, loop) < GROWTH_BOUND
        info = await client.info()
        failed = [e for e in info.envs if e.state == "failed"]
        assert failed
        assert all("missing.zip" in e.error for e in failed)
        await still_answers(client)


async def test_huge_echoed_inputs_get_their_status_with_a_short_message(base: Path) -> None:
    """A 200 KB env-var name, a 100 KB env id, a 500 KB unknown field: the promised status and
    a message that quotes the input truncated with its length (before: RESOURCE_EXHAUSTED
    "Stream removed", the trailer overflowed), and no 200 KB log line."""
    async with agent_process(base) as client:
        name = "N" * 200_000
        cases: list[tuple[Awaitable[object], grpc.StatusCode, str]] = [
            (
                client.create(json.dumps({"env_vars": {name: "x"}})),
                grpc.StatusCode.INVALID_ARGUMENT,
                "(200000 characters)",
            ),
            (
                client.create(json.dumps({"env_vars": {"K=" + name: "x"}})),
                grpc.StatusCode.INVALID_ARGUMENT,
                "(200002 characters)",
            ),
            (client.delete("e" * 100_000), grpc.StatusCode.NOT_FOUND, "(100000 characters)"),
            (
                client.create(json.dumps({"u" * 500_000: 1})),
                grpc.StatusCode.INVALID_ARGUMENT,
                "(500000 characters)",
            ),
            (
                client.create(
                    json.dumps({"env_vars": {"A": 1}, **{f"x{i}": 1 for i in range(50_000)}})
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
                "unknown runtime_env field",
            ),
            (
                client.create(json.dumps({"working_dir": "s" * 4000 + "://x/y.zip"})),
                grpc.StatusCode.INVALID_ARGUMENT,
                "(4010 characters)",
            ),
            (
                client.create(json.dumps({"pip": ["\u00e9" * 300_000]})),
                grpc.StatusCode.INVALID_ARGUMENT,
                "",
            ),
        ]
        for call, code, words in cases:
            got, details = await status_of(call)
            assert got == code, (got, details[:300])
            assert words in details, details
            assert len(details.encode()) <= MAX_MESSAGE_BYTES, len(details)
        await still_answers(client)
        log_lines_short(client.served)


async def test_info_over_four_mib_is_capped_by_size_and_says_how_many_were_left_out(
    base: Path,
) -> None:
    """12 live envs of 900 KiB each: the info reply stays under a default client's 4 MiB limit
    and total_envs says how many there are (before: RESOURCE_EXHAUSTED at the client)."""
    async with agent_process(base) as client:
        for i in range(12):
            await client.create(big_env(i))
        async with grpc.aio.insecure_channel(client.served.address) as plain:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(plain)  # type: ignore[no-untyped-call]
            info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=30)
        assert info.ByteSize() < 4 * MiB
        assert 0 < len(info.envs) < 12
        assert info.total_envs == 12
        assert info.total_uris == len(info.uris)
        await still_answers(client)


async def test_info_cli_reads_a_reply_over_four_mib(base: Path) -> None:
    """``rtenv-agent info`` prints what the agent sends: it accepts replies over 4 MiB."""
    from tests.harness.agent_process import run_cli

    async with agent_process(base) as client:
        for i in range(6):
            await client.create(big_env(i))
        code, out, err = await run_cli("info", "--address", client.served.address)
        assert code == 0, err
        assert "6 envs," in out
        assert "more not shown (the reply's cap)" in out  # the agent caps by size: it says so
    assert os.path.exists(base)


# -- the pure pieces ---------------------------------------------------------------------------


def test_echo_quotes_short_input_whole_and_long_input_cut_with_its_length() -> None:
    assert echo("abc") == "'abc'"
    assert echo("N" * 200_000) == repr("N" * ECHO_CHARS) + "... (200000 characters)"
    assert echo(b"x" * 300).endswith("... (300 bytes)")
    assert echo({"a": [1] * 10**6}) == "'dict'"  # containers are named, never dumped
    assert len(echo(10**4000)) < 2 * ECHO_CHARS
    assert echo("\ud800") == "'\\ud800'"


def test_cap_message_bounds_utf8_bytes_and_makes_any_text_sendable() -> None:
    capped = cap_message("\u00e9" * 100_000)
    assert len(capped.encode()) <= MAX_MESSAGE_BYTES
    assert capped.endswith("... (message cut; 200000 bytes in all)")
    assert cap_message("short") == "short"
    assert cap_message("a\ud800b").encode() == b"a\\ud800b"  # a lone surrogate cannot be sent


def test_bounded_cache_holds_to_both_its_count_and_its_bytes() -> None:
    cache: BoundedCache[int, str] = BoundedCache(max_entries=3, max_bytes=100)
    for i in range(5):
        cache.put(i, "v", 10)
    assert len(cache) == 3
    assert cache.get(0) is None
    assert cache.get(4) == "v"
    cache.put(9, "big", 90)  # pushes out the oldest until 100 bytes hold
    assert cache.bytes <= 100
    assert cache.get(9) == "big"
    cache.put(10, "huge", 101)  # heavier than the whole budget: not kept
    assert cache.get(10) is None
    assert cache.pop(9) == "big"
    assert cache.bytes == sum(10 for k in range(5) if cache.get(k) is not None)


async def test_request_log_refuses_ids_over_the_limit_and_keeps_fingerprints_short() -> None:
    log = RequestLog(capacity=10)

    async def op() -> int:
        return 1

    assert await log.run("create", "r" * MAX_REQUEST_ID_BYTES, "f" * 10_000, op) == 1
    with pytest.raises(InvalidArgument, match="request_id is 129 bytes; the limit is 128"):
        await log.run("create", "r" * (MAX_REQUEST_ID_BYTES + 1), "f", op)
    with pytest.raises(InvalidArgument, match="request_id is 130 bytes"):
        await log.run("create", "\u00e9" * 65, "f", op)  # bytes, not characters
    [attempt] = log._attempts.values()
    assert len(attempt.fingerprint) == 64  # the digest of a long fingerprint, not the text
    with pytest.raises(RequestIdReused) as caught:
        await log.run("create", "r" * MAX_REQUEST_ID_BYTES, "other", op)
    assert len(caught.value.message) < 400


def test_format_info_says_how_many_envs_and_uris_the_capped_reply_left_out() -> None:
    """A reply cut by size lists fewer entries than it counts: the CLI says how many it left out."""
    from agent.ops.info_address import format_info

    reply = agent_pb2.GetRuntimeEnvsInfoReply(total_envs=5, total_uris=3)
    reply.envs.add(runtime_env_id="a" * 32, references=1, state="ready")
    reply.uris.add(uri="file:///x.zip", kind="py_modules", references=1, state="ready")
    text = format_info(reply)
    assert "... 4 more not shown" in text
    assert "... 2 more not shown" in text
    full = agent_pb2.GetRuntimeEnvsInfoReply(total_envs=1, total_uris=1)
    full.envs.add(runtime_env_id="a" * 32, references=1, state="ready")
    full.uris.add(uri="file:///x.zip", kind="py_modules", references=1, state="ready")
    assert "not shown" not in format_info(full)
