"""Prometheus metrics, served over HTTP when ``--metrics-address`` is set.

Events are counted as they happen (requests by RPC and outcome, create latency split by
cache hit or miss, installs with their bytes and seconds); levels are read at scrape time from
the service (``AgentService.levels``: bytes in use and unused against the budget, installs in
flight, envs) and the file system (free disk), so the request path pays one counter increment
and nothing more. The request path's series (requests, create latency) are plain numbers of
this process (``Tally``, ``LatencyTally``: no lock, no label lookup, bound once by a door's hot
path), turned into series at scrape. With a token, a scrape must carry it, as every gRPC call
but the health checks must.

The cyclic garbage collector's pauses are a histogram by generation (``GcPauses``, from
``gc.callbacks`` while the agent runs): every thread waits while one runs, the event loop
included, so a long one is every call's latency at that moment.

Served by prometheus-client's own aiohttp handler (content negotiation, OpenMetrics, gzip), with
the process collector's ``process_*`` series; the ``*_created`` series are not exported.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Literal

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent.app.token import Token
from agent.core.errors import AgentError, ErrorKind
from agent.doors.http_errors import error_response

if TYPE_CHECKING:
    from agent.app.service import AgentService

# The *_created series (a timestamp per counter and histogram child) double the scrape for
# nothing a dashboard uses; the switch is process-wide, and this process is the agent.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

# A young generation's pass takes tens of microseconds; a full pass over a large heap, tens of
# milliseconds (30 ms over the start-up heap before ops/server.freeze_start_heap).
_GC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

# How an RPC ended, as rtenv_requests counts it: answered, an expected error of a kind (its
# label is the kind's value: "not_found", "invalid"...), the client gone, or a bug.
OK: Literal["ok"] = "ok"
CANCELLED: Literal["cancelled"] = "cancelled"
BUG: Literal["bug"] = "bug"
Outcome = ErrorKind | Literal["ok", "cancelled", "bug"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._before_scrape: Callable[[], Awaitable[None]] | None = None
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, RSS, open fds...
        # The request path's series are plain numbers, read at scrape (``_RequestSeries``):
        # a prometheus child takes a lock and three calls per event.
        self._requests: dict[tuple[str, str], Tally] = {}
        self._create_hit = LatencyTally(_LATENCY_BUCKETS)
        self._create_miss = LatencyTally(_LATENCY_BUCKETS)
        self.registry.register(_RequestSeries(self))
        self.gc = GcPauses()  # counted between gc.start() and gc.stop() (the agent's run)
        self.registry.register(_GcSeries(self.gc))
        self.installs = Counter(
            "rtenv_installs",
            "package installs finished, by result",
            ["result"],
            registry=self.registry,
        )
        self.install_bytes = Counter(
            "rtenv_install_bytes",
            "bytes downloaded by successful installs",
            registry=self.registry,
        )
        self.install_seconds = Histogram(
            "rtenv_install_seconds",
            "seconds from the start of an install to its end",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def count_request(self, rpc: str, outcome: Outcome) -> None:
        """Count one RPC by how it ended."""
        self.request_counter(rpc, outcome).inc()

    def request_counter(self, rpc: str, outcome: Outcome) -> Tally:
        """The count of one RPC's outcome (``.inc()``), made once per pair: a hot path binds
        it once."""
        label = outcome.value if isinstance(outcome, ErrorKind) else outcome
        tally = self._requests.get((rpc, label))
        if tally is None:
            tally = self._requests[(rpc, label)] = Tally()
        return tally

    def observe_create(self, hit: bool, seconds: float) -> None:
        self.create_latency(hit).observe(seconds)

    def create_latency(self, hit: bool) -> LatencyTally:
        """The create latency histogram's series for a hit or a miss (``.observe(seconds)``)."""
        return self._create_hit if hit else self._create_miss

    def observe_install(self, ok: bool, fetched_bytes: int, seconds: float) -> None:
        self.installs.labels("ok" if ok else "error").inc()
        if ok:
            self.install_bytes.inc(fetched_bytes)
        self.install_seconds.observe(seconds)

    def watch(self, service: AgentService) -> None:
        """Read the levels from this service at every scrape, once the root's figures count
        every change made before the scrape (as info's do)."""
        self.registry.register(_Levels(service))
        self._before_scrape = service.caught_up

    async def caught_up(self) -> None:
        if self._before_scrape is not None:
            await self._before_scrape()


class Tally:
    """A count, read at scrape. Changed on the event loop only."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class LatencyTally:
    """A histogram's counts, read at scrape: ``counts[i]`` observations fell in bucket ``i``
    (at most ``bounds[i]``; the last one is +Inf). Changed on the event loop only."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, as the exposition has them."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            out.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
        return out


class GcPauses:
    """The garbage collector's pauses, by generation, while watched (``start`` to ``stop``:
    ``gc.callbacks`` is the process's, so an agent in a test's process stops at its close).
    The callback runs in whichever thread's allocation set off the collection, under the GIL,
    and costs a clock read and a bucket's increment."""

    def __init__(self) -> None:
        self.pauses = tuple(LatencyTally(_GC_BUCKETS) for _ in range(3))
        self._began = 0.0

    def start(self) -> None:
        if self._note not in gc.callbacks:
            gc.callbacks.append(self._note)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses[min(info["generation"], 2)].observe(time.perf_counter() - self._began)


class _GcSeries(Collector):
    """rtenv_gc_pause_seconds, from ``GcPauses``."""

    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "rtenv_gc_pause_seconds",
            "pauses of the cyclic garbage collector (every thread, "
            "the event loop included, waits), by generation",
            labels=["generation"],
        )
        for generation, tally in enumerate(self._pauses.pauses):
            family.add_metric([str(generation)], tally.buckets(), tally.sum)
        yield family


class _RequestSeries(Collector):
    """rtenv_requests and rtenv_create_seconds, from the metrics' tallies."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        requests = CounterMetricFamily(
            "rtenv_requests",
            "RPCs answered, by method and outcome (ok, an error kind, cancelled, bug)",
            labels=["rpc", "outcome"],
        )
        for (rpc, outcome), tally in list(m._requests.items()):
            requests.add_metric([rpc, outcome], tally.value)
        yield requests
        seconds = HistogramMetricFamily(
            "rtenv_create_seconds",
            "CreateRuntimeEnv latency, by whether every package was "
            "already installed (hit) or not (miss)",
            labels=["cache"],
        )
        for cache, latency in (("hit", m._create_hit), ("miss", m._create_miss)):
            seconds.add_metric([cache], latency.buckets(), latency.sum)
        yield seconds


class _Levels(Collector):
    """The service's levels as samples at every scrape (no lists built), and the free disk."""

    def __init__(self, service: AgentService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        levels = self._service.levels()
        cache = GaugeMetricFamily(
            "rtenv_cache_bytes", "bytes of installed packages", labels=["state"]
        )
        cache.add_metric(["used"], levels.used_bytes)
        cache.add_metric(["unused"], levels.unused_bytes)
        yield cache
        yield GaugeMetricFamily(
            "rtenv_cache_budget_bytes", "bytes of unused packages kept", value=levels.budget_bytes
        )
        yield GaugeMetricFamily(
            "rtenv_installs_in_flight",
            "installs running or queued",
            value=levels.installs_in_flight,
        )
        yield GaugeMetricFamily(
            "rtenv_envs", "runtime envs with references", value=levels.live_envs
        )
        yield CounterMetricFamily("rtenv_evictions", "packages evicted", value=levels.evictions)
        yield CounterMetricFamily("rtenv_cache_hits", "packages found installed", value=levels.hits)
        yield GaugeMetricFamily(
            "rtenv_wheel_cache_bytes",
            "the wheel cache's own bytes (what no venv links), as of its last measure",
            value=levels.wheel_cache_bytes,
        )
        yield CounterMetricFamily(
            "rtenv_wheel_cache_clears",
            "times the wheel cache was cleared",
            value=levels.wheel_cache_clears,
        )
        disk = os.statvfs(self._service.root)
        yield GaugeMetricFamily(
            "rtenv_free_disk_bytes",
            "free bytes on the root's file system (for the agent)",
            value=disk.f_bavail * disk.f_frsize,
        )


async def start_metrics_server(
    metrics: Metrics, host: str, port: int, *, token: Token | None = None
) -> tuple[web.AppRunner, int]:
    """Serve GET /metrics; return the runner (to stop it) and the bound port. With a token, a
    scrape must carry it (``Authorization: Bearer <token>``), as every gRPC call but the health
    checks must: the same check (``Token.check``), answered through the HTTP table."""
    middlewares = [] if token is None else [_require(token)]
    app = web.Application(middlewares=middlewares)
    exposition = make_aiohttp_handler(metrics.registry)

    async def scrape(request: web.Request) -> web.StreamResponse:
        await metrics.caught_up()
        return await exposition(request)

    app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]


def _require(token: Token) -> Middleware:
    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization")
        try:
            token.check(None if given is None else given.encode("utf-8", "surrogateescape"))
        except AgentError as exc:
            return error_response(exc)
        return await handler(request)

    return require_token
