"""Prometheus metrics on --metrics-address: scraped over real HTTP from a real agent, the
figures move with creates (miss, then hit), a failing create, deletes and an eviction."""

from __future__ import annotations

import asyncio
import gzip
import shutil
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import Settings
from agent.app.token import MISSING, WRONG
from agent.core.errors import ErrorKind, StartupError
from agent.doors.http_errors import STATUS as HTTP_STATUS
from agent.doors.metrics import BUG, CANCELLED, OK, Metrics, Outcome
from agent.ops.server import Agent
from tests.harness.in_process import running_agent, slow_passes
from tests.harness.metrics import Samples, scrape, value
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.tempdirs import short_tempdir

SIZE = 1000  # bytes unpacked per package


def requests(samples: Samples, rpc: str, outcome: str) -> float:
    return value(samples, "rtenv_requests_total", {"rpc": rpc, "outcome": outcome})


def created(samples: Samples, cache: str) -> float:
    return value(samples, "rtenv_create_seconds_count", {"cache": cache})


async def test_a_scrape_right_after_a_create_counts_its_package_even_while_passes_are_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache's bytes come from passes over the root's index; a scrape waits for the pass a
    create or delete asked for, as info does, so it never shows the figures of the pass before."""
    async with package_server() as pkgs, running_agent(metrics_address="127.0.0.1:0") as a:
        monkeypatch.setattr(a.service.store.db, "sweep", slow_passes(a))
        url = pkgs.add("a.zip", workdir_zip({"data.txt": "a" * SIZE}))
        reply = await a.create(env_json(url))
        used = await scrape(a.agent.metrics_address)
        assert value(used, "rtenv_cache_bytes", {"state": "used"}) == SIZE
        assert await a.delete(reply.runtime_env_id) == 0
        unused = await scrape(a.agent.metrics_address)
        assert value(unused, "rtenv_cache_bytes", {"state": "used"}) == 0
        assert value(unused, "rtenv_cache_bytes", {"state": "unused"}) == SIZE


async def test_metrics_move_with_creates_hits_failures_deletes_and_evictions() -> None:
    async with (
        package_server() as pkgs,
        running_agent(metrics_address="127.0.0.1:0", cache_budget_bytes=int(SIZE * 1.5)) as a,
    ):
        host, _, port = a.agent.metrics_address.rpartition(":")
        assert (host, port.isdigit(), port != "0") == ("127.0.0.1", True, True)
        zips = {n: workdir_zip({"data.txt": n * SIZE}) for n in "ab"}
        urls = {n: pkgs.add(f"{n}.zip", body) for n, body in zips.items()}
        before = await scrape(a.agent.metrics_address)
        assert value(before, "rtenv_free_disk_bytes") > 0
        assert value(before, "rtenv_cache_budget_bytes") == int(SIZE * 1.5)
        assert value(before, "rtenv_installs_in_flight") == 0
        assert value(before, "rtenv_evictions_total") == 0
        assert value(before, "rtenv_wheel_cache_clears_total") == 0
        assert value(before, "rtenv_wheel_cache_bytes") == 0

        first = await a.create(env_json(urls["a"]))  # a miss: installs a
        await a.create(env_json(urls["a"]))  # a hit: same env, no install
        gate = pkgs.hold("b.zip")
        pending = asyncio.create_task(a.create(env_json(urls["b"])))
        await asyncio.wait_for(pkgs.requested("b.zip").wait(), 10)
        during = await scrape(a.agent.metrics_address)
        assert value(during, "rtenv_installs_in_flight") == 1
        gate.set()
        second = await asyncio.wait_for(pending, 10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.create(env_json(f"{pkgs.base_url}/absent.zip"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND

        middle = await scrape(a.agent.metrics_address)
        assert created(middle, "miss") - created(before, "miss") == 2
        assert created(middle, "hit") - created(before, "hit") == 1
        assert requests(middle, "CreateRuntimeEnv", "ok") == 3
        assert requests(middle, "CreateRuntimeEnv", "not_found") == 1
        assert value(middle, "rtenv_installs_total", {"result": "ok"}) == 2
        assert value(middle, "rtenv_installs_total", {"result": "error"}) == 1
        assert value(middle, "rtenv_install_bytes_total") == len(zips["a"]) + len(zips["b"])
        assert value(middle, "rtenv_install_seconds_count") == 3
        assert value(middle, "rtenv_cache_bytes", {"state": "used"}) == 2 * SIZE
        assert value(middle, "rtenv_cache_bytes", {"state": "unused"}) == 0
        assert value(middle, "rtenv_installs_in_flight") == 0
        assert value(middle, "rtenv_envs") == 2
        assert value(middle, "rtenv_cache_hits_total") > value(before, "rtenv_cache_hits_total")

        assert await a.delete(first.runtime_env_id) == 1
        assert await a.delete(first.runtime_env_id) == 0  # a unused: fits the budget
        cached = await scrape(a.agent.metrics_address)
        assert value(cached, "rtenv_cache_bytes", {"state": "used"}) == SIZE
        assert value(cached, "rtenv_cache_bytes", {"state": "unused"}) == SIZE
        assert value(cached, "rtenv_evictions_total") == 0
        assert await a.delete(second.runtime_env_id) == 0  # b unused too: a is evicted
        await a.settle()

        after = await scrape(a.agent.metrics_address)
        assert value(after, "rtenv_evictions_total") == 1
        assert value(after, "rtenv_cache_bytes", {"state": "used"}) == 0
        assert value(after, "rtenv_cache_bytes", {"state": "unused"}) == SIZE
        assert value(after, "rtenv_envs") == 0
        assert requests(after, "DeleteRuntimeEnv", "ok") == 3
        assert value(after, "rtenv_free_disk_bytes") > 0
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.delete(first.runtime_env_id)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        last = await scrape(a.agent.metrics_address)
        assert requests(last, "DeleteRuntimeEnv", "not_found") == 1
        await a.info()
        assert requests(await scrape(a.agent.metrics_address), "GetRuntimeEnvsInfo", "ok") == 1


async def test_metrics_are_off_by_default() -> None:
    async with running_agent() as a:
        assert a.agent.metrics_address == ""
        assert a.agent.settings.metrics_address == ""


@pytest.mark.parametrize("address", ["0.0.0.0:0", "192.0.2.1:0"])
async def test_metrics_on_a_non_loopback_address_is_refused_without_allow_remote(
    address: str,
) -> None:
    base = short_tempdir()
    try:
        agent = Agent(Settings(root=base / "root", metrics_address=address))
        with pytest.raises(StartupError) as caught:
            await agent.start()
        assert f"address {address!r} is not a loopback address" in caught.value.message
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_metrics_negotiate_openmetrics_gzip_and_export_process_not_created_series() -> None:
    """Operators' conventions: prometheus-client's own handler (OpenMetrics when asked, gzip
    when accepted), the process_* series, and no *_created series."""
    async with running_agent(metrics_address="127.0.0.1:0") as a:
        await a.info()  # one counter and its children exist
        url = f"http://{a.agent.metrics_address}/metrics"
        async with aiohttp.ClientSession(trust_env=False, auto_decompress=False) as session:
            async with session.get(url, headers={"Accept-Encoding": "gzip"}) as resp:
                assert resp.status == 200
                assert resp.headers.get("Content-Encoding") == "gzip"
                text = gzip.decompress(await resp.read()).decode()
            async with session.get(url, headers={"Accept-Encoding": "identity"}) as resp:
                assert "Content-Encoding" not in resp.headers
                assert resp.headers["Content-Type"].startswith("text/plain")
                assert "rtenv_requests_total" in await resp.text()
            openmetrics = "application/openmetrics-text; version=1.0.0"
            async with session.get(
                url, headers={"Accept": openmetrics, "Accept-Encoding": "identity"}
            ) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await resp.text()).endswith("# EOF\n")
        samples = {
            s.name for family in text_string_to_metric_families(text) for s in family.samples
        }
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= samples
        assert "rtenv_requests_total" in samples
        assert [name for name in samples if name.endswith("_created")] == []


def test_requests_are_counted_by_outcome_ok_each_error_kind_cancelled_or_bug() -> None:
    """The outcome label is protocol-neutral: "ok", an ErrorKind's value, "cancelled", "bug"."""
    metrics = Metrics()
    outcomes: list[Outcome] = [OK, OK, CANCELLED, BUG, *ErrorKind]
    for outcome in outcomes:
        metrics.count_request("CreateRuntimeEnv", outcome)

    def counted(outcome: str) -> float | None:
        labels = {"rpc": "CreateRuntimeEnv", "outcome": outcome}
        return metrics.registry.get_sample_value("rtenv_requests_total", labels)

    assert (counted("ok"), counted("cancelled"), counted("bug")) == (2, 1, 1)
    assert {kind.value: counted(kind.value) for kind in ErrorKind} == {
        k.value: 1 for k in ErrorKind
    }
    assert counted("NOT_FOUND") is None, "a gRPC code name as a label"


async def test_with_a_token_a_scrape_must_carry_it_through_the_same_check_as_grpc(
    base: Path,
) -> None:
    """The metrics door calls the token check the gRPC door calls: a scrape without the token
    is 401 with the missing-token message and ``WWW-Authenticate: Bearer``, a wrong token 401
    with the wrong-token message, the right one gets the metrics."""
    (base / "token").write_text("s3cret\n")
    async with (
        running_agent(token_file=str(base / "token"), metrics_address="127.0.0.1:0") as a,
        aiohttp.ClientSession(trust_env=False) as session,
    ):
        url = f"http://{a.agent.metrics_address}/metrics"
        async with session.get(url) as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert await resp.text() == MISSING + "\n"
        async with session.get(url, headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 401
            assert await resp.text() == WRONG + "\n"
        async with session.get(url, headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
            assert "rtenv_cache_budget_bytes" in await resp.text()


def test_every_error_kind_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorKind)
    assert HTTP_STATUS[ErrorKind.UNAUTHENTICATED] == 401
    assert HTTP_STATUS[ErrorKind.NOT_FOUND] == 404
