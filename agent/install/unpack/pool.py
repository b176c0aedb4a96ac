"""The unpack pool: zips are extracted in worker processes, off the event loop's process.

An extraction in a thread of the agent's process held the GIL for most of its time: every
request waited behind it (GetRuntimeEnvsInfo's p99 was 13 ms during a 61 MB install). Here the
agent's process only sends small tasks and reads small answers; the archive is planned (every
check), written and finished in ``worker`` processes, niced so the event loop wins the
CPU when it wakes. How a worker process is started, answers and ends is ``procs``; a
job's tasks and the gate of its disk reservation, ``jobs``.

- **Workers.** ``size`` processes, started once (``start``: spawned from a thread hop, so the
  agent serves meanwhile; an extraction waits for them), each ``python -m
  agent.install.unpack.worker`` (exec'd, never a fork of a process running gRPC's threads) on a
  socket pair of its own. ``close`` ends them: their sockets closed, stop flags set, then each
  waited for and killed by its PID if it outlives a grace. A worker whose agent dies outright
  sees its parent gone at its next chunk and its socket end: it exits.
- **Shares.** An archive of at least ``split_bytes`` is written by every worker at once: each
  plans it (the same plan: it is deterministic), says what it declares, waits for the job's
  disk reservation (``reserve``, made once, from the first plan to arrive: nothing is written
  before it), and writes its share of the entries, of about equal work (``shares``),
  into the one staging folder; then one of them (the one that wrote share 0, if free) makes
  the links and sets the final modes. A smaller one is one task, to one worker. Tasks wait in
  a queue for a free worker, in order.
- **Overlapped extractions.** An archive whose download is still under way (``growing``: its
  tail known, ``overlap.py``) is extracted by workers that wait for its bytes as they arrive.
  Such streaming tasks do not count against the ``size`` workers that ordinary tasks may keep
  busy: when every worker is taken and some wait on a download, the pool starts one more
  process (at most ``2 * size`` in all, each kept once started), so a slow download never
  holds up the installs behind it. At most ``size`` tasks of each kind run at once.
- **Stopping.** Each worker has a byte in a shared memory (a memfd): set, the worker ends its
  task at its next entry or chunk (``Stopped``); one waiting for the reservation is told
  ``halt``. A job whose caller is cancelled, or one of whose shares failed, sets its running
  shares' bytes, drops its queued ones, and waits for its running ones to answer before it
  raises: nothing writes in a staging folder once its removal may begin.
- **Failures.** An error in a worker comes back as the same class and message
  (``UnsafeArchive``, ``FailedPrecondition``; an ``OSError`` with its errno: a full disk is the
  store's to word); anything else is a bug, raised as ``RuntimeError`` with the worker's
  traceback logged. A worker that dies (killed) fails its job with ``Unavailable`` saying so,
  is logged, and is replaced; the agent goes on serving.

Not thread-safe: used from the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
import socket
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import Unavailable
from agent.install.unpack.growing import Growing
from agent.install.unpack.jobs import Gate, Reserve, Task
from agent.install.unpack.plan import ArchiveLimits
from agent.install.unpack.procs import (
    CLOSE_GRACE_S,
    NICE,
    WorkerDied,
    how_it_ended,
    popen_worker,
    reap,
    settle,
)
from agent.install.unpack.stop import Stopped
from agent.install.unpack.worker import receive, send

log = logging.getLogger(__name__)

SPLIT_BYTES = 4 * 1024 * 1024  # archives from this size are written by every worker at once
MAX_AUTO_WORKERS = 4  # the default pool size: the cores, at most this many


def auto_workers() -> int:
    """The pool's default size: one worker per core, at most ``MAX_AUTO_WORKERS``."""
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_WORKERS))


@dataclass(eq=False)
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    conn: socket.socket
    task: Task | None = None  # the one task sent to it and not answered yet
    dead: bool = False  # its socket ended; another worker takes its index


class UnpackPool:
    def __init__(self, size: int, *, nice: int = NICE, split_bytes: int = SPLIT_BYTES) -> None:
        if size < 1:
            raise ValueError(f"an unpack pool needs at least one worker, not {size}")
        self.size = size
        self._capacity = 2 * size  # processes at most: ``size`` more for streaming tasks
        self._nice = nice
        self._split_bytes = split_bytes
        self._workers: list[_Worker | None] = [None] * self._capacity  # None: not started
        self._queue: deque[Task] = deque()
        self._jobs = itertools.count(1)
        self._stops_fd = os.memfd_create("rtenv-unpack-stops", os.MFD_CLOEXEC)
        os.ftruncate(self._stops_fd, self._capacity)
        self._stops = mmap.mmap(self._stops_fd, self._capacity)
        self._starting: asyncio.Future[None] | None = None
        self._replacing: set[asyncio.Future[None]] = set()  # spawns after the start, too
        self._growing: set[int] = set()  # indices of extra workers being started
        self._grow_failed = False  # starting one failed: the pool keeps the workers it has
        self._closed = False
        self.replaced = 0  # workers that died and were replaced

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the workers in the background (a thread hop each); returns at once."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._spawn_all())

    async def _spawn_all(self) -> None:
        for index in range(self.size):
            if self._closed:
                return
            await self._spawn(index)

    async def _spawn(self, index: int) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await asyncio.to_thread(
                popen_worker, theirs.fileno(), self._stops_fd, index, self._nice
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        conn = mine
        if self._closed:  # closed while it started: it reads its socket's end and exits
            conn.close()
            await asyncio.to_thread(reap, proc)
            return
        worker = _Worker(index, proc, conn)
        self._workers[index] = worker
        asyncio.get_running_loop().add_reader(conn.fileno(), self._answered, worker)
        self._dispatch()

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids (none once closed)."""
        if self._closed:
            return []
        return [w.proc.pid for w in self._workers if w is not None and not w.dead]

    @property
    def busy(self) -> int:
        """Workers running a task (sent, not answered yet)."""
        return sum(1 for w in self._workers if w is not None and w.task is not None)

    async def ready(self) -> None:
        """Wait until every worker is spawned (its process exists; it may still be importing)."""
        if self._starting is not None:
            await asyncio.shield(self._starting)

    async def close(self) -> None:
        """End every worker: queued tasks fail with ``Stopped``, running ones are told to stop
        and waited for (``CLOSE_GRACE_S``); then each worker's socket is closed (an idle one
        reads its end and exits), and each is waited for, then killed by its PID past the
        grace."""
        if self._closed:
            return
        self._closed = True
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
        # each ends at once, the pool being closed (a failed start was logged by its callback)
        await asyncio.gather(*self._replacing, return_exceptions=True)
        while self._queue:
            task = self._queue.popleft()
            if not task.future.done():
                task.future.set_exception(Stopped())
        workers = [w for w in self._workers if w is not None]
        for worker in workers:
            self._stops[worker.index] = 1
            if worker.task is not None:
                self._reply(worker.task, ("halt",))
        running = [w.task.future for w in workers if w.task is not None]
        if running:
            await asyncio.wait(running, timeout=CLOSE_GRACE_S)
        loop = asyncio.get_running_loop()
        for worker in workers:
            if not worker.dead:
                loop.remove_reader(worker.conn.fileno())
                worker.conn.close()
            if worker.task is not None and not worker.task.future.done():
                worker.task.future.set_exception(Stopped())
        await asyncio.gather(*(asyncio.to_thread(reap, w.proc) for w in workers))
        self._stops.close()
        os.close(self._stops_fd)

    # -- extraction ------------------------------------------------------------------------
    async def extract(
        self,
        archive: Path,
        dest: Path,
        *,
        archive_bytes: int,
        strip_top_level: bool,
        limits: ArchiveLimits,
        label: str,
        reserve: Reserve | None = None,
        growing: Growing | None = None,
    ) -> int:
        """Extract ``archive`` into the new folder ``dest`` (as ``archive.extract_zip`` does);
        return the bytes written. ``reserve``: awaited with the bytes the archive declares once
        its plan passed, before a byte is written (the disk room; its error is the job's).
        ``growing``: the archive is still being downloaded (``growing.GrowingZip``); its
        ``archive_bytes`` are its declared size. Cancelled, the workers writing it are stopped
        and waited for before the cancellation goes on."""
        job = await self._job()
        n = self.size if archive_bytes >= self._split_bytes else 1
        head = (str(archive), str(dest), strip_top_level, limits, label, growing)
        gate = None if reserve is None else Gate(reserve, self._reply, lambda: self._closed)
        gated = gate is not None
        streaming = growing is not None
        if n == 1:
            whole_task = [("whole", job, *head, 0, 1, gated)]
            (whole,) = await self._run(whole_task, label, gate=gate, streaming=streaming)
            return whole.future.result()
        shared = [("share", job, *head, k, n, gated) for k in range(n)]
        written = await self._run(shared, label, gate=gate, streaming=streaming)
        finishing = [("finish", job, *head, 0, n, False)]
        (last,) = await self._run(finishing, label, written[0].worker, streaming=streaming)
        return sum(t.future.result() for t in (*written, last))

    async def _job(self) -> int:
        if self._closed:
            raise Stopped
        await self.ready()  # spawned (a failed spawn is raised here)
        return next(self._jobs)

    async def _run(
        self,
        messages: list[tuple[Any, ...]],
        label: str,
        affinity: int | None = None,
        *,
        gate: Gate | None = None,
        streaming: bool = False,
    ) -> list[Task]:
        """Run tasks to their end, all of them; the first failure (a worker's error, a dead
        worker, a failed reservation, the caller's cancellation) stops the others, which are
        waited for."""
        loop = asyncio.get_running_loop()
        tasks = [Task(m, loop.create_future(), affinity, streaming, gate=gate) for m in messages]
        self._queue.extend(tasks)
        self._dispatch()
        futures = [t.future for t in tasks]
        try:
            while True:
                done, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
                if not pending or any(f.exception() is not None for f in done):
                    break
        except asyncio.CancelledError:
            await self._stop(tasks)
            raise
        failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
        if failed:
            await self._stop(tasks)
            if gate is not None and gate.failed is not None:
                raise gate.failed
            raise self._error([e for e in failed if e is not None], label)
        return tasks

    async def _stop(self, tasks: list[Task]) -> None:
        """Stop a job's tasks: queued ones dropped, running ones told to stop and waited for
        (a cancellation meanwhile waits on: the staging folder is removed after them)."""
        for task in tasks:
            if task.gate is not None:
                task.gate.halted = True
                if task.gate.step is not None:
                    task.gate.step.cancel()  # a reservation nobody waits for any more
            if task.future.done():
                continue
            if task.worker is None:
                with contextlib.suppress(ValueError):
                    self._queue.remove(task)
                task.future.set_exception(Stopped())
            else:
                self._stops[task.worker] = 1
                self._reply(task, ("halt",))
        running = [t.future for t in tasks if not t.future.done()]
        while running:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(running)
            running = [f for f in running if not f.done()]
        for task in tasks:
            task.future.exception()  # retrieved: the first failure, or the cancellation, wins

    def _error(self, failed: list[BaseException], label: str) -> BaseException:
        """The job's error: the first that is not a ``Stopped`` of a share stopped after it."""
        first = next((e for e in failed if not isinstance(e, Stopped)), failed[0])
        if isinstance(first, WorkerDied):
            return Unavailable(
                f"{label}: the process unpacking it (pid {first.pid}) {first.how}; the agent "
                "started another; try again"
            )
        return first

    # -- the workers' side -----------------------------------------------------------------
    def _dispatch(self) -> None:
        """Hand queued tasks to free workers, in order (a finish to the worker holding its
        job's plan when that one is free), at most ``size`` of each kind (streaming or not)
        running at once; with no worker free for a task that may run, start one more."""
        while self._queue and not self._closed:
            task = self._runnable()
            if task is None:
                return
            free = [w for w in self._workers if w is not None and not w.dead and w.task is None]
            if not free:
                self._grow()
                return
            self._queue.remove(task)
            worker = next((w for w in free if w.index == task.affinity), free[0])
            self._stops[worker.index] = 0  # before the task: a stop for its last one is over
            worker.task, task.worker = task, worker.index
            with contextlib.suppress(OSError):  # died before it read: its socket's end says so
                send(worker.conn, task.message)

    def _runnable(self) -> Task | None:
        """The first queued task whose kind has fewer than ``size`` tasks running."""
        running = [w.task.streaming for w in self._workers if w is not None and w.task is not None]
        room = {kind: self.size - running.count(kind) for kind in (False, True)}
        return next((t for t in self._queue if room[t.streaming] > 0), None)

    def _grow(self) -> None:
        """Start one more worker (in the background; it takes the queue once up), unless one
        is being started or the pool holds ``2 * size`` already. Only streaming tasks can keep
        ``size`` workers busy without ``size`` ordinary ones running, so only they make it
        grow."""
        if self._growing or self._starting is None or not self._starting.done():
            return  # a worker is on its way: it takes the queue once up
        if self._grow_failed:
            return  # the tasks wait for a worker of the pool, as they would without growing
        if not any(
            w is not None and w.task is not None and w.task.streaming for w in self._workers
        ):
            return  # only ordinary tasks (or a worker being replaced): they wait their turn
        index = next((i for i, w in enumerate(self._workers) if w is None), None)
        if index is None:
            return
        self._growing.add(index)
        step = asyncio.ensure_future(self._spawn(index))
        self._replacing.add(step)

        def started(step: asyncio.Future[None]) -> None:
            self._replacing.discard(step)
            self._growing.discard(index)
            if not step.cancelled() and step.exception() is not None:
                self._grow_failed = True
                log.error(
                    "could not start another unpack worker: %s",
                    step.exception(),
                    extra={"worker": index},
                )

        step.add_done_callback(started)

    def _answered(self, worker: _Worker) -> None:
        """The worker's socket is readable: its answer, its plan's declared bytes, or its end
        (it died)."""
        try:
            answer = receive(worker.conn)
        except (EOFError, OSError):
            self._died(worker)
            return
        if answer[0] == "planned" and worker.task is not None:
            self._planned(worker.task, answer[1])
            return
        task, worker.task = worker.task, None
        if task is not None and not task.future.done():
            settle(task.future, answer)
        self._dispatch()

    def _planned(self, task: Task, declared: int) -> None:
        """A share's plan passed: its job's gate says when it writes (``jobs.Gate``);
        a task with no gate (its worker has no reason to ask) is told to halt."""
        task.waiting = True
        if task.gate is None:
            self._reply(task, ("halt",))
        else:
            task.gate.planned(task, declared)

    def _reply(self, task: Task, message: tuple[str]) -> None:
        """Answer a worker waiting after its plan (once)."""
        if not task.waiting or task.worker is None:
            return
        task.waiting = False
        worker = self._workers[task.worker]
        if worker is not None and not worker.dead:
            with contextlib.suppress(OSError):  # died meanwhile: its socket's end says so
                send(worker.conn, message)

    def _died(self, worker: _Worker) -> None:
        """A worker's socket ended: it died (it never leaves on its own while the pool is
        open). Its task fails once its exit status is known; another worker takes its place."""
        asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        worker.conn.close()
        worker.dead = True
        self.replaced += 1
        step = asyncio.ensure_future(self._replace(worker))
        self._replacing.add(step)
        step.add_done_callback(self._replacing.discard)

    async def _replace(self, worker: _Worker) -> None:
        status = await asyncio.to_thread(reap, worker.proc)
        how = how_it_ended(status)
        task, worker.task = worker.task, None
        log.error(
            "unpack worker %d (pid %d) %s%s; starting another",
            worker.index,
            worker.proc.pid,
            how,
            f" while unpacking {task.message[6]}" if task is not None else "",
            extra={
                "pid": worker.proc.pid,
                "worker": worker.index,
                "how": how,
                **({"uri": task.message[6]} if task is not None else {}),
            },
        )
        if task is not None and not task.future.done():
            task.future.set_exception(WorkerDied(worker.proc.pid, how))
        if self._closed:
            return
        try:
            await self._spawn(worker.index)
        except Exception:
            log.exception(
                "could not start an unpack worker in place of pid %d",
                worker.proc.pid,
                extra={"pid": worker.proc.pid, "worker": worker.index},
            )
            if not self.pids:  # nobody left to take the queue: it fails, the next call retries
                while self._queue:
                    queued = self._queue.popleft()
                    queued.future.set_exception(WorkerDied(worker.proc.pid, how))
