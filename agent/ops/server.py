"""One running agent: the store, the service and the gRPC server around them, with its lifecycle.

``Agent`` is used in-process by the integration tests and by ``agent.ops.entry.serve`` (the
CLI's process entry), which adds signals and the parent-death watch.

With ``settings.ray``, the Ray door (``ops/ray_door.py``) is bound first, before the root is
locked and before recovery, its port file written then; requests wait until the agent serves.
A failed start removes the port file; so does a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from types import TracebackType

import aiohttp
import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from agent.app.config import RaySettings, Settings
from agent.app.service import AgentService
from agent.app.token import Token, read_token
from agent.core import plugin_config
from agent.core.errors import ConfigError, StartupError
from agent.core.refs import RefTables
from agent.core.roots import FileRoots
from agent.core.units import human_bytes
from agent.doors.access import TokenInterceptor
from agent.doors.metrics import Metrics, start_metrics_server
from agent.doors.ray_front import RayFront
from agent.doors.ray_plugins import PluginRunner
from agent.doors.ray_setup_log import SetupLogs
from agent.doors.servicer import RuntimeEnvAgentServicer, add_services
from agent.install.disk.staging import through
from agent.install.fetch.base import Sleep
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.gcs_source import GcsConfig
from agent.install.installers import InstallTools, build_installers
from agent.install.unpack.pool import UnpackPool, auto_workers
from agent.install.venvs.wheel_cache import WheelCache, find_uv, version_of
from agent.ops.door_addresses import METRICS_FLAG, every_door, probe_doors
from agent.ops.ray_door import RayDoor
from agent.ops.startup import (
    bind_failure,
    check_address,
    check_distinct_ports,
    check_door_address,
    check_python,
    check_root_dirs,
    check_root_free,
    file_root_warning,
    lock_root,
    make_folders,
    missing_folders,
    move_aside,
    prepare_socket_path,
    share_root,
)
from agent.state import sockets
from agent.state.recovery import RecoverySummary, recover
from agent.state.state_db import FILE_NAME, MEMORY, StateDB
from agent.state.store import UriStore
from rtenv.v1 import agent_pb2

log = logging.getLogger(__name__)

# The host of Ray's runtime env plugins, made when a Ray door's node names some: it imports Ray,
# so the top layer hands it in (``agent.launcher.main``); no module here imports it.
LoadPlugins = Callable[[], PluginRunner]
SERVICE_NAME: str = agent_pb2.DESCRIPTOR.services_by_name["RuntimeEnvAgent"].full_name


class AgentState(Enum):
    NEW = "new"
    STARTING = "starting"
    SERVING = "serving"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Agent:
    def __init__(
        self,
        settings: Settings,
        *,
        sleep: Sleep = asyncio.sleep,
        before_recovery: Callable[[], Awaitable[None]] | None = None,
        freeze_heap: bool = False,
        load_plugins: LoadPlugins | None = None,
    ) -> None:
        """``before_recovery``: awaited just before recovery (a test's hook to hold the start
        there, with the Ray door already listening). ``freeze_heap``: ``freeze_start_heap``
        before the first call is served (process-wide: for the agent's own process).
        ``load_plugins``: the host of Ray's runtime env plugins, called as the Ray door starts
        serving when ``RAY_RUNTIME_ENV_PLUGINS`` names some (without it, such a start fails)."""
        self.settings = settings
        self.state = AgentState.NEW
        self.address = ""  # the bound address, with a real port for "HOST:0"
        self.service: AgentService | None = None
        self._sleep = sleep
        self._server: grpc.aio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._fetcher: Fetcher | None = None  # its GCS channel is closed at stop
        self._unpack: UnpackPool | None = None  # its workers end at stop, after the store
        self._health: health_aio.HealthServicer | None = None
        self._lock_fd: int | None = None
        self._db: StateDB | None = None
        self.recovery = RecoverySummary()
        self.metrics = Metrics()
        self.metrics_address = ""  # the bound HOST:PORT when metrics are served
        self._metrics_runner: web.AppRunner | None = None
        self._before_recovery = before_recovery
        self._freeze_heap = freeze_heap
        self._load_plugins = load_plugins
        self.ray_door: RayDoor | None = None  # with settings.ray
        self.ray_front: RayFront | None = None

    async def start(self) -> None:
        if self.state is not AgentState.NEW:
            raise RuntimeError(f"Agent.start() in state {self.state.value}; an agent starts once")
        self.state = AgentState.STARTING
        settings = self.settings
        try:
            # What needs no root first: a refused start leaves the root untouched.
            address = check_address(settings.resolved_address(), settings.allow_remote)
            doors = every_door(settings, address)
            check_distinct_ports(doors)
            root = settings.root.resolve()
            # --no-state-db cannot share the root; --reset-state may not pull the index from
            # under other agents: both need the root alone
            alone = not settings.persist or settings.reset_state
            check_root_free(root, alone=alone)
            await asyncio.to_thread(probe_doors, doors)  # a name may take a DNS look-up
            for missing in await asyncio.to_thread(missing_folders, settings.allow_file_roots):
                log.warning("%s", file_root_warning(missing), extra={"path": str(missing)})
            workers = settings.extract_workers
            if workers != 0:  # spawned now, in the background: ready by the time it serves
                self._unpack = UnpackPool(auto_workers() if workers is None else workers)
                self._unpack.start()
            secret = read_token(settings.token_file) if settings.token_file else None
            if settings.ray is not None:  # before any slow work: Ray waits ~15 s for the port
                self.ray_door = RayDoor(self.metrics)
                await self.ray_door.open(settings.ray, secret, settings.max_message_bytes)
            python_version = (sys.version_info.major, sys.version_info.minor)
            if settings.py_executable != sys.executable:  # the venvs' python: its version
                python_version = await asyncio.to_thread(check_python, settings.py_executable)
            try:
                make_folders(root, 0o755)  # every folder made, whatever the umask
                locking = asyncio.ensure_future(asyncio.to_thread(lock_root, root, alone=alone))
                try:
                    self._lock_fd = await through(locking)  # retries sleep: off the loop
                except asyncio.CancelledError:  # taken all the same: let it go with the start
                    if not locking.cancelled() and locking.exception() is None:
                        os.close(locking.result())
                    raise
            except OSError as exc:
                raise StartupError(
                    f"cannot use {root} as the agent's root: {exc.strerror or exc}"
                ) from exc
            await asyncio.to_thread(check_root_dirs, root)
            started = time.monotonic()
            db_path = root / FILE_NAME
            if settings.persist and settings.reset_state:  # the root is ours alone (the
                # lock): no other agent uses the index moved aside
                await asyncio.to_thread(move_aside, db_path)  # up to 3000 stats
                await asyncio.to_thread(share_root, self._lock_fd)  # others may come now
            self._db = db = StateDB(db_path if settings.persist else MEMORY, root=root)
            await db.open()
            if address.startswith("unix:"):  # noted before it is bound: whoever reaps this
                # holder if it dies without stopping removes the socket (``state.sockets``)
                await asyncio.to_thread(
                    sockets.note, root, db.holder_id, address.removeprefix("unix:")
                )
            interceptors = []
            if secret is not None:
                interceptors.append(TokenInterceptor(secret))
            self._session = aiohttp.ClientSession(trust_env=False)
            tables = RefTables()
            ray = settings.ray
            self._fetcher = fetcher = Fetcher(
                self._session,
                settings.fetch,
                sleep=self._sleep,
                file_roots=settings.allow_file_roots,
                gcs=GcsConfig(ray.gcs_address, ray.cluster_id_hex, ray.token)
                if ray is not None and ray.gcs_address
                else None,
                http_headers=dict(settings.http_headers),
            )
            uv = await asyncio.to_thread(find_uv)
            wheel_cache = WheelCache(root, uv, await version_of(uv))
            installers = build_installers(
                InstallTools(
                    fetcher,
                    settings.archive,
                    settings.py_executable,
                    settings.pip_installer,
                    root / "logs",
                    self._unpack,
                    settings.overlap_downloads,
                    uv,
                    wheel_cache.path,
                    FileRoots.of(settings.allow_file_roots),
                    uv_version=wheel_cache.version,
                    root=root,
                )
            )
            store = UriStore(
                root,
                installers,
                db=db,
                refcount=tables.uri_count,
                budget_bytes=settings.cache_budget_bytes,
                disk_floor=settings.min_free_disk,
                install_slots=settings.max_concurrent_installs,
                on_install=self.metrics.observe_install,
                wheel_cache=wheel_cache,
            )
            if self._before_recovery is not None:
                await self._before_recovery()
            store.pass_loop.kind_budgets = settings.kind_budgets
            self.recovery = await recover(store, db)
            store.start()  # the periodic passes
            if settings.ray_folders is not None:
                store.mirror_into(settings.ray_folders)
            self.service = AgentService(
                settings, store, tables, db=self._db, recovery=self.recovery
            )
            self.metrics.watch(self.service)
            self.metrics.gc.start()  # stopped at close
            self._server = grpc.aio.server(
                interceptors=interceptors,
                options=[
                    ("grpc.max_receive_message_length", settings.max_message_bytes),
                    ("grpc.so_reuseport", 0),
                ],
            )
            # bytes in and out; the hot methods registered by method (see doors/servicer.py)
            handlers = RuntimeEnvAgentServicer(self.service, self.metrics).handlers()
            self._health = health_aio.HealthServicer()
            add_services(self._server, handlers, self._health)
            if settings.metrics_address:  # before the gRPC port: a bound grpc server that
                # never started keeps its port until the process ends (grpc's own behaviour)
                await self._serve_metrics(settings, None if secret is None else Token(secret))
            self.address = await self._bind(address)
            if address.startswith("unix:"):  # the very file bound, noted (``state.sockets``)
                await asyncio.to_thread(
                    sockets.note,
                    root,
                    self._db.holder_id,
                    address.removeprefix("unix:"),
                    bound=True,
                )
            if self._freeze_heap:  # before serving: counting what was frozen walks it (6 ms)
                frozen = freeze_start_heap()
                log.info("start-up heap frozen: %d objects", frozen, extra={"objects": frozen})
            await self._server.start()
            for name in ("", SERVICE_NAME):
                await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
            if self.ray_door is not None:  # requests waiting at the Ray door go on now
                self.ray_front = RayFront(
                    self.service,
                    plugins=self._plugin_host(),
                    node=settings.ray.host if settings.ray else "",
                    node_pythonpath=os.environ.get("PYTHONPATH", ""),
                    python_version=python_version,
                    setup_logs=_setup_logs(settings.ray),
                )
                self.ray_door.serve(self.ray_front)
        except BaseException:
            if self._server is not None:  # bound, maybe started: its port is let go
                with contextlib.suppress(Exception):
                    await self._server.stop(None)
            if self.ray_door is not None:
                self.ray_door.fail()
            with contextlib.suppress(Exception):  # logged by _close; the start's error wins
                await self._close()
            self.state = AgentState.STOPPED
            raise
        self.state = AgentState.SERVING
        log.info(
            "serving on %s (root %s, budget %s, started in %.2fs)",
            self.address,
            root,
            human_bytes(settings.cache_budget_bytes),
            time.monotonic() - started,
            extra={
                "address": self.address,
                "root": str(root),
                "budget_bytes": settings.cache_budget_bytes,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    def _plugin_host(self) -> PluginRunner | None:
        """Ray's runtime env plugins when the node names some (``RAY_RUNTIME_ENV_PLUGINS``):
        their host, as ``load_plugins`` makes it; None otherwise, and Ray is never imported."""
        if not plugin_config.configured():
            return None
        if self._load_plugins is None:
            raise ConfigError(
                f"{plugin_config.PLUGINS_VAR} names plugins, but this agent was started with no "
                "host for them"
            )
        return self._load_plugins()

    @property
    def ray_address(self) -> str:
        """The Ray door's bound HOST:PORT; "" without one."""
        return "" if self.ray_door is None else self.ray_door.address

    @property
    def ray_app(self) -> web.Application | None:
        """The Ray door's application (``ray_http.waiting(app)`` counts who waits there)."""
        return None if self.ray_door is None else self.ray_door.app

    async def _serve_metrics(self, settings: Settings, token: Token | None) -> None:
        checked = check_door_address(METRICS_FLAG, settings.metrics_address, settings.allow_remote)
        host, _, port = checked.rpartition(":")
        try:
            self._metrics_runner, bound = await start_metrics_server(
                self.metrics, host.strip("[]"), int(port), token=token
            )
        except OSError as exc:  # another process took the port since start probed it
            raise bind_failure(checked, METRICS_FLAG, exc) from exc
        self.metrics_address = f"{host}:{bound}"
        log.info(
            "metrics on http://%s/metrics",
            self.metrics_address,
            extra={"metrics_address": self.metrics_address},
        )

    async def _bind(self, address: str) -> str:
        assert self._server is not None
        if address.startswith("unix:"):
            path = prepare_socket_path(address)
            old_umask = os.umask(0o177)
            try:
                self._server.add_insecure_port(address)
            except RuntimeError as exc:
                raise StartupError(f"cannot listen on {address}: {exc}") from exc
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o600)
            return address
        try:
            port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {address}: {exc}") from exc
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    async def stop(self, grace: float = 2.0) -> None:
        if self.state in (AgentState.STOPPING, AgentState.STOPPED):
            return
        self.state = AgentState.STOPPING
        try:
            if self.ray_door is not None:  # first: no new Ray request during the grace
                await self.ray_door.stop_accepting()
            if self._health is not None:
                await self._health.enter_graceful_shutdown()
            if self._server is not None:
                await self._server.stop(grace)
        finally:
            try:
                await self._close()
            finally:
                self.state = AgentState.STOPPED
        log.info("stopped")

    async def _close(self) -> None:
        """Release what start took, each step whatever the one before it raised (a state.db
        whose flusher died raises at close, after writing what it could): the root's lock and
        the HTTP session are always released; the first error is raised at the end."""
        steps: list[Callable[[], Awaitable[None]]] = []
        if self.ray_door is not None:  # its port file removed, its listener closed
            steps.append(self.ray_door.close)
        if self._metrics_runner is not None:
            steps.append(self._metrics_runner.cleanup)
        if self.service is not None:
            steps.append(self.service.store.close)
        if self._unpack is not None:  # after the store: its installs stop their extractions
            steps.append(self._unpack.close)
        if self._db is not None:
            steps.append(self._db.close)
        if self._fetcher is not None:
            steps.append(self._fetcher.close)
        if self._session is not None:
            steps.append(self._session.close)
        self._metrics_runner, self._db = None, None
        self.metrics.gc.stop()  # gc.callbacks is the process's: no agent's outlives it
        first: BaseException | None = None
        try:
            for step in steps:
                try:
                    await step()
                except Exception as exc:
                    name = str(getattr(step, "__qualname__", step))
                    log.exception("stopping: %s failed", name, extra={"step": name})
                    first = first or exc
        finally:  # a cancellation too: the lock never outlives the agent
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
        if first is not None:
            raise first

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def freeze_start_heap() -> int:
    """Move every object alive now out of the cyclic collector's passes (``gc.freeze``) and
    return how many: what the start made (modules, classes, protobuf descriptors, the gRPC
    server), about 50,000 objects, lives as long as the process. Each full collection walked
    them all: 30 ms of the event loop's CPU (200 ms on a loaded machine) during which no RPC
    was answered, the idle agent's worst latency (``bench.py --only loop-blocking``). What is
    made after the start is collected as before; frozen objects are still freed when their
    count drops to 0."""
    gc.freeze()
    return gc.get_freeze_count()


def _setup_logs(ray: RaySettings | None) -> SetupLogs | None:
    """Ray's per-job setup logs, when the raylet named its log dir."""
    return None if ray is None or ray.log_dir is None else SetupLogs(ray.log_dir)
