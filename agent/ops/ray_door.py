"""The Ray door as the agent's process runs it: bound first in a start (before the root is
locked and before recovery: Ray's raylet gives up on an agent whose port file has not appeared
within about 15 s, and recovering a large cache takes longer), its port file written then (temp
file and rename: a reader never sees part of it), requests held until the agent serves
(``serve``) or answered 503 when its start fails (``fail``), and at the end closed with its
port file removed. The door itself (routes, bodies, the error table) is ``doors/ray_http.py``
and ``doors/ray_errors.py``; ``ops/server.py`` decides when each step runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from aiohttp import web

from agent.app.config import RaySettings
from agent.core.errors import StartupError
from agent.doors.metrics import Metrics
from agent.doors.ray_front import RayFront
from agent.doors.ray_http import ray_app
from agent.ops.startup import bind_failure

log = logging.getLogger(__name__)


class RayDoor:
    """One agent's Ray door. Invariant: once ``open`` noted a port file, ``close`` removes it,
    after its write ended (a start cancelled while the thread writes still has its file
    removed, never left naming a dead port)."""

    def __init__(self, metrics: Metrics) -> None:
        self.address = ""  # the bound HOST:PORT
        self.app: web.Application | None = None  # ray_http.waiting(app) counts who waits
        self._metrics = metrics
        self._runner: web.AppRunner | None = None
        self._ready: asyncio.Future[RayFront] | None = None
        self._port_file: Path | None = None  # the port file written by this agent, if any
        self._port_write: asyncio.Future[None] | None = None  # its write, in a thread

    async def open(self, ray: RaySettings, secret: bytes | None, max_body_bytes: int) -> None:
        """Bind the door (requests wait for ``serve``) and write its port file. Its token:
        Ray's (``ray.token``) when set, else the other doors' (``secret``)."""
        host = ray.host.strip("[]")
        shown = f"[{host}]" if ":" in host else host  # checked by start, as the other doors
        if ray.token is not None and not ray.token.strip():
            raise StartupError("the Ray token is empty: Ray's token auth needs a token to check")
        self._ready = asyncio.get_running_loop().create_future()
        self.app = ray_app(
            self._ready,
            token=ray.token if ray.token is not None else secret,
            max_body_bytes=max_body_bytes,
            metrics=self._metrics,
        )
        # handler_cancellation: a client gone (disconnected, timed out) cancels its create,
        # which gives its count and its reference back.
        self._runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=2.0, handler_cancellation=True
        )
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, ray.port).start()
        except OSError as exc:  # another process took the port since start probed it
            raise bind_failure(f"{shown}:{ray.port}", ray.named_by, exc) from exc
        port = self._runner.addresses[0][1]
        self.address = f"{shown}:{port}"
        if ray.port_file is not None:
            # Noted before the write, and the write waited for at close (the invariant above).
            self._port_file = ray.port_file
            self._port_write = asyncio.ensure_future(
                asyncio.to_thread(_write_port_file, ray.port_file, port)
            )
            await asyncio.shield(self._port_write)
        told = (
            f"port file {ray.port_file}"
            if ray.port_file is not None
            else "no port file: no raylet started this agent, so none waits for one"
        )
        log.info(
            "Ray door on http://%s (%s)",
            self.address,
            told,
            extra={
                "ray_address": self.address,
                "port_file": "" if ray.port_file is None else str(ray.port_file),
            },
        )

    def serve(self, front: RayFront) -> None:
        """The agent serves: the requests waiting at the door go on, through ``front``."""
        if self._ready is not None:
            self._ready.set_result(front)

    def fail(self) -> None:
        """The agent's start failed: the requests waiting (and any later) are answered 503."""
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(StartupError("the agent failed to start"))
            self._ready.exception()  # retrieved: waiting requests answer 503

    async def stop_accepting(self) -> None:
        """Close the listener (the first step of a stop: no new Ray request during the grace
        the gRPC door gives its calls)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def close(self) -> None:
        """Remove the port file (its write ended first), then close the listener if still
        open. Both are attempted; the first error is raised."""
        port_file, self._port_file = self._port_file, None
        writing, self._port_write = self._port_write, None
        try:
            if port_file is not None:
                if writing is not None:
                    await asyncio.wait([writing])  # the rename done (or failed) first
                await asyncio.to_thread(_remove_port_file, port_file)
        finally:
            await self.stop_accepting()


def _write_port_file(path: Path, port: int) -> None:
    """The port as decimal text, written to a temp file beside it and renamed over it: a reader
    sees no file or the whole file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(str(port))
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise StartupError(f"cannot write the Ray port file {path}: {exc.strerror or exc}") from exc


def _remove_port_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
