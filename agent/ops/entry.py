"""The agent as a process: ``serve`` runs an ``Agent`` until a signal (SIGTERM, SIGINT, SIGHUP:
a graceful stop; a second one: exit at once) or the parent's death (fate sharing), both honoured
while the agent starts too, and tells systemd when it serves.

``agent.ops.server`` is one agent's lifecycle, usable in-process (the integration tests); this
module is what a process adds around it (the CLI's ``serve`` and ``ray-agent``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from agent.app.config import Settings
from agent.ops import keeper, loops
from agent.ops.sdnotify import Notifier
from agent.ops.server import Agent, LoadPlugins
from agent.ops.startup import check_parent

log = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    *,
    before_recovery: Callable[[], Awaitable[None]] | None = None,
    freeze_heap: bool = False,
    keeper_pid: int | None = None,
    load_plugins: LoadPlugins | None = None,
) -> int:
    """Run the agent until SIGTERM, SIGINT or SIGHUP (each a graceful stop) or the parent's
    death (or, with ``keeper_pid``, its keeper's: ``agent.ops.keeper``); return the exit
    code. Both are honoured while the agent starts too (the Ray door
    listens before recovery, which may be long): the start is cancelled, and cleans up.
    ``before_recovery``: as ``Agent``'s (a test's hook). ``freeze_heap``: as ``Agent``'s
    (process-wide: the CLI's process asks for it, not a test that runs agents in its own).
    ``load_plugins``: as ``Agent``'s (the entry point's, which may import Ray)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    signalled = False  # a signal came (the parent's death also sets ``stop``: not a signal)

    def on_signal() -> None:
        nonlocal signalled
        if signalled:  # a second signal: the operator wants it gone now
            log.warning("second signal: exiting at once")
            os._exit(1)
        signalled = True
        stop.set()

    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    try:  # the handlers stay until the agent has stopped: a second signal during the
        # graceful stop must still exit at once
        return await _serve(settings, stop, before_recovery, freeze_heap, keeper_pid, load_plugins)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _serve(
    settings: Settings,
    stop: asyncio.Event,
    before_recovery: Callable[[], Awaitable[None]] | None,
    freeze_heap: bool,
    keeper_pid: int | None,
    load_plugins: LoadPlugins | None,
) -> int:
    watchers = []
    try:
        if settings.parent_pid is not None:
            check_parent(settings.parent_pid)
            watch = _watch_parent(settings.parent_pid, stop, "parent", keeper_pid)
            watchers.append(asyncio.create_task(watch, name="parent"))
        if keeper_pid is not None:  # the raylet kills the keeper: this agent stops cleanly
            watch = _watch_parent(keeper_pid, stop, "keeper", keeper_pid)
            watchers.append(asyncio.create_task(watch, name="keeper"))
        notifier = Notifier.from_environment()  # systemd Type=notify, when NOTIFY_SOCKET is set
        agent = Agent(
            settings,
            before_recovery=before_recovery,
            freeze_heap=freeze_heap,
            load_plugins=load_plugins,
        )
        if not await _start_unless_stopped(agent, stop):
            log.info("stopped while starting")
            return 0
        loop = describe_loop(asyncio.get_running_loop())
        log.info("event loop: %s", loop, extra={"event_loop": loop})
        print(f"rtenv-agent serving on {agent.address}", flush=True)
        if agent.ray_address:
            print(f"rtenv-agent serving Ray's protocol on {agent.ray_address}", flush=True)
        notifier.send(f"READY=1\nSTATUS=serving on {agent.address}")
        await stop.wait()
        log.info("shutting down")
        notifier.send("STOPPING=1")
    finally:
        for watcher in watchers:
            await _end(watcher)
    await agent.stop()
    return 0


async def _start_unless_stopped(agent: Agent, stop: asyncio.Event) -> bool:
    """Start ``agent``; False if ``stop`` was set first (the start cancelled, and waited for:
    it releases what it took). The start's own error is raised."""
    starting = asyncio.create_task(agent.start(), name="start")
    stopped = asyncio.create_task(stop.wait(), name="stop-while-starting")
    try:
        await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not starting.done():  # stopped first, or serve itself cancelled
            starting.cancel()
            await asyncio.wait([starting])
    if starting.cancelled():
        return False
    starting.result()
    return True


async def _end(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has finished (its ``finally`` blocks run); log what it
    died of, if it died of something else."""
    task.cancel()
    await asyncio.wait([task])  # never raises the task's own exception
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "task %s had died",
            task.get_name(),
            exc_info=task.exception(),
            extra={"task": task.get_name()},
        )


def describe_loop(loop: asyncio.AbstractEventLoop) -> str:
    """'uvloop 0.21.0', or 'asyncio' and why: chosen by RTENV_EVENT_LOOP, or how to get uvloop."""
    module = type(loop).__module__
    if module.startswith("uvloop"):
        version = getattr(sys.modules.get("uvloop"), "__version__", "")
        return f"uvloop {version}".strip()
    if os.environ.get(loops.ENV, "").strip().lower() == loops.LoopChoice.ASYNCIO.value:
        return f"asyncio (chosen by {loops.ENV})"
    return "asyncio (uvloop not in use; pip install uvloop for less overhead per RPC)"


async def _watch_parent(
    pid: int, stop: asyncio.Event, who: str = "parent", keeper_pid: int | None = None
) -> None:
    """Set ``stop`` when process ``pid`` (the parent, or ``who``) exits (fate sharing), saying
    so as ``keeper.end_line`` words it (unless another watch said it first)."""
    await _exited(pid)
    if stop.is_set():
        return  # said already (the other watch woke first), or a signal came
    level, line = keeper.end_line(who, pid, keeper_pid, os.getppid())
    log.log(level, "%s", line, extra={"parent_pid": pid})
    stop.set()


async def _exited(pid: int) -> None:
    """Return once process ``pid`` has exited (at once if it is gone already)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone since check_parent
        return
    except OSError:  # no pidfd (old kernel): poll
        while _alive(pid):  # noqa: ASYNC110 - nothing to wait on without a pidfd
            await asyncio.sleep(0.5)
    else:
        gone = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_reader(fd, gone.set)
            try:
                await gone.wait()
            finally:
                loop.remove_reader(fd)  # also when cancelled: no reader left on a closed fd
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
