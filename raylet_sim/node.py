"""A node: the agent sidecar, the client and the worker pool, sharing fate.

If the agent exits while the node runs, the node kills its workers (SIGTERM, bounded wait,
SIGKILL) and every task in flight or to come fails with ``AgentDied``; the caller exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import grpc

from raylet_sim.client import AgentClient
from raylet_sim.pool import TaskSpec, WorkerPool
from raylet_sim.sidecar import DEFAULT_AGENT_COMMAND, FAST_RECONNECT, AgentSidecar

log = logging.getLogger(__name__)

# A stop signal (the run must end within a second, whatever it did): the workers and the agent,
# told at once, have this long to exit before SIGKILL. Measured on a busy 2-core VM, 70 workers
# exited 0.04 to 0.08 s after their SIGTERM and the agent 0.2 to 0.35 s after its own.
INTERRUPT_GRACE_S = 0.5


class AgentDied(Exception):
    def __init__(self, pid: int, code: int, workers_killed: int) -> None:
        super().__init__(
            f"the runtime-env agent (pid {pid}) exited with code {code} while the node was "
            f"running; killed {workers_killed} worker(s) and stopped"
        )
        self.code = code


class Node:
    def __init__(
        self,
        root: Path,
        *,
        agent_command: Sequence[str] = DEFAULT_AGENT_COMMAND,
        agent_args: Sequence[str] = (),
        idle_timeout_s: float = 5.0,
        worker_stderr: IO[bytes] | int | None = None,
        watch_interval_s: float | None = None,
        env_keepalive_s: float = 0.0,
        address: str | None = None,
        log_path: Path | None = None,
        max_idle_workers: int | None = None,
    ) -> None:
        """``address`` and ``log_path``: the agent's own, when several nodes share one root;
        ``max_idle_workers``: the pool's (``WorkerPool``)."""
        self.sidecar = AgentSidecar(
            root, command=agent_command, extra_args=agent_args, address=address,
            log_path=log_path,
        )  # fmt: skip
        self._idle_timeout_s = idle_timeout_s
        self._worker_stderr = worker_stderr
        self._watch_interval_s = watch_interval_s
        self._env_keepalive_s = env_keepalive_s
        self._max_idle_workers = max_idle_workers
        self._channel: grpc.aio.Channel | None = None
        self.client: AgentClient | None = None
        self.pool: WorkerPool | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._interrupted = False
        self.died: AgentDied | None = None
        self._died = asyncio.Event()

    async def start(self) -> None:
        await self.sidecar.start()
        # a restarted agent is up in well under gRPC's default first reconnect backoff (1 s)
        self._channel = grpc.aio.insecure_channel(self.sidecar.address, options=FAST_RECONNECT)
        self.client = AgentClient(self._channel)
        self.pool = WorkerPool(
            self.client,
            idle_timeout_s=self._idle_timeout_s,
            worker_stderr=self._worker_stderr,
            watch_interval_s=self._watch_interval_s,
            env_keepalive_s=self._env_keepalive_s,
            max_idle_workers=self._max_idle_workers,
        )
        self._watcher = asyncio.create_task(self._watch(), name="watch the agent")

    async def _watch(self) -> None:
        assert self.pool is not None
        code = await self.sidecar.wait()
        if self._stopping:
            return
        workers = len(self.pool.workers)
        # known before the kills: a task that fails because its worker is killed, or because the
        # pool is closing, fails as AgentDied, not as a task of its own
        self.died = AgentDied(self.sidecar.pid, code, workers)
        log.error("the agent exited with code %d; killing %d workers", code, workers)
        self.pool.abandon_agent()
        await self.pool.kill_all()
        self._died.set()

    def interrupt(self) -> None:
        """Ctrl-C, SIGTERM or SIGHUP: the agent, in the run's process group, may have got the
        signal too and be exiting. Its exit is not a death to report, and nothing is deleted at
        an agent on its way out; ``stop`` then stops the workers (SIGTERM, as after a death: no
        task of theirs is awaited) and the agent, both at once."""
        self._stopping = True
        self._interrupted = True
        if self.pool is not None:
            self.pool.abandon_agent()

    async def wait_died(self) -> AgentDied:
        """Wait until the node has noticed its agent's death and stopped its workers."""
        await self._died.wait()
        assert self.died is not None
        return self.died

    async def run(self, task: TaskSpec, *, task_id: str = "") -> Any:
        """Run a task; if the agent dies first (or meanwhile), raise ``AgentDied``."""
        assert self.pool is not None
        if self.died is not None:
            raise self.died
        running = asyncio.ensure_future(self.pool.run(task, task_id=task_id))
        died = asyncio.ensure_future(self._died.wait())
        try:
            await asyncio.wait({running, died}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller went away: so does its task
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            raise
        finally:
            died.cancel()
        if self.died is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            raise self.died
        return running.result()

    async def stop(self) -> None:
        """Stop the workers, give every env back to the agent, then stop the agent (after its
        death: kill the workers, nothing to give back; after an interrupt: stop the workers and
        the agent at once, each SIGKILLed if still there after ``INTERRUPT_GRACE_S``)."""
        self._stopping = True
        if self._interrupted:
            await asyncio.gather(
                self.sidecar.stop(INTERRUPT_GRACE_S),
                *([] if self.pool is None else [self.pool.kill_all(INTERRUPT_GRACE_S)]),
            )
        elif self.pool is not None and self.died is None:
            await self.pool.close()
        elif self.pool is not None:
            await self.pool.kill_all()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        await self.sidecar.stop()

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
