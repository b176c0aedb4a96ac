"""The agent as the pool's sidecar: started as a child, health-checked, watched; fate shared.

The agent gets ``--parent-pid`` (it stops when the pool dies); the pool watches the agent's
process and, when it exits, kills its workers and exits non-zero (``Node`` in ``node.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

MAX_UNIX_PATH_BYTES = 107  # AF_UNIX sun_path holds 108 bytes with its NUL
DEFAULT_AGENT_COMMAND = (sys.executable, "-m", "agent")
_STDERR_TAIL_BYTES = 4000
# gRPC's first reconnect waits a second by default; the agent is up (again) sooner than that
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class SidecarError(Exception):
    """The agent could not be started, or did not become healthy."""


def socket_address(root: Path) -> str:
    """The agent's socket: inside its root, or, if that path is too long for AF_UNIX, in a short
    private folder (mode 0700, made by ``AgentSidecar.start`` and removed by its ``stop``) under
    the temp dir, named after the root so it is stable."""
    path = root.resolve() / "agent.sock"
    if len(os.fsencode(str(path))) <= MAX_UNIX_PATH_BYTES:
        return f"unix:{path}"
    digest = hashlib.sha256(os.fsencode(str(root.resolve()))).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"rtenv-{digest}"
    short = folder / "agent.sock"
    log.warning(
        "socket path %s is %d bytes, over the AF_UNIX limit of %d; using %s",
        path, len(os.fsencode(str(path))), MAX_UNIX_PATH_BYTES, short,
    )  # fmt: skip
    return f"unix:{short}"


class AgentSidecar:
    def __init__(
        self,
        root: Path,
        *,
        command: Sequence[str] = DEFAULT_AGENT_COMMAND,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        health_timeout_s: float = 30.0,
        address: str | None = None,
    ) -> None:
        """``address``: the agent's own (several agents may serve one root, each on its own
        socket); default ``socket_address(root)``."""
        self.root = root
        self.address = address or socket_address(root)
        self._command = list(command)
        self._extra_args = list(extra_args)
        self.log_path = log_path or root.parent / "agent.log"
        self._health_timeout_s = health_timeout_s
        self.process: asyncio.subprocess.Process | None = None
        socket = Path(self.address.removeprefix("unix:"))
        # the short private folder of a socket that did not fit in the root: ours to remove
        self._short_dir = (
            socket.parent if address is None and socket.parent != root.resolve() else None
        )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        """Start the agent and wait until its health check says SERVING (bounded)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._short_dir is not None:
            _private_dir(self._short_dir)
        args = [
            *self._command, "serve", "--root", str(self.root), "--address", self.address,
            "--parent-pid", str(os.getpid()), *self._extra_args,
        ]  # fmt: skip
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *args, stdout=asyncio.subprocess.DEVNULL, stderr=log_fd
            )
        finally:
            os.close(log_fd)
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise

    async def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self._health_timeout_s
        async with grpc.aio.insecure_channel(self.address, options=FAST_RECONNECT) as channel:
            health = cast(Any, health_pb2_grpc.HealthStub(channel))  # the stubs lack methods
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise SidecarError(
                        f"the agent exited with code {self.process.returncode} before serving; "
                        f"its log ends:\n{self.stderr_tail()}"
                    )
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass  # not listening yet
                await asyncio.sleep(0.05)
        raise SidecarError(
            f"the agent did not report SERVING within {self._health_timeout_s:g}s; "
            f"its log ends:\n{self.stderr_tail()}"
        )

    def stderr_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - _STDERR_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, a bounded wait, then SIGKILL; then the short socket folder, if any, goes."""
        proc = self.process
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=grace_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._short_dir is not None:  # the agent is gone: its socket and the folder go too
            with contextlib.suppress(OSError):
                (self._short_dir / "agent.sock").unlink(missing_ok=True)
                self._short_dir.rmdir()
        return None if proc is None else proc.returncode


def _private_dir(folder: Path) -> None:
    """Make ``folder`` (mode 0700), or accept it if it is already a folder of ours, private."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SidecarError(
            f"{folder} is not a private folder of this user (mode 0700): it cannot hold the "
            "agent's socket; remove it, or choose a shorter root"
        )
