"""A pytest plugin: on uvloop, the test process starts its children as the agent does, without
uvloop's fork.

uvloop starts a process with ``fork()`` and runs code in the child before its ``exec``: the
interpreter's after-fork hooks (``threading``'s, every ``os.register_at_fork`` one) and every
``pthread_atfork`` handler, grpc's among them. The test process holds gRPC channels and servers,
whose threads are busy, and grpc's handlers then crash the child now and then with SIGSEGV
before it runs anything (CI's uvloop pass: ``rtenv-agent info`` exited -11 with no output; on
this machine 78 of 1,500 ``/bin/true`` spawned so beside a busy gRPC channel, none with
``GRPC_ENABLE_FORK_SUPPORT=0``, none as here). A collection in that child could also finalize a
grpc object of the parent and spin for ever in ``Thread.join``.

So, under a loop that is not asyncio's own, ``asyncio.create_subprocess_exec`` and ``_shell``
start the child with ``subprocess.Popen`` (CPython's ``fork_exec``: ``vfork`` and ``exec``, no
Python and no after-fork handler in the child, as ``agent.install.venvs.spawn`` starts the agent's
installers) and watch its exit through a pidfd on the loop; the process they return is asyncio's
own ``Process``, its pipes the loop's. On asyncio's loop (raylet-sim's tests) they are left as
they are: that loop already starts children so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from asyncio import subprocess as aio_subprocess
from asyncio import unix_events
from typing import Any

import pytest

_EXEC = asyncio.create_subprocess_exec
_SHELL = asyncio.create_subprocess_shell
_LIMIT = 2**16  # asyncio.streams' default buffer limit


async def _start(
    args: Any, shell: bool, stdin: Any, stdout: Any, stderr: Any, limit: int, kwds: Any
) -> aio_subprocess.Process:
    """asyncio's ``_make_subprocess_transport`` with a pidfd in place of a child watcher."""
    loop = asyncio.get_running_loop()
    protocol = aio_subprocess.SubprocessStreamProtocol(limit=limit, loop=loop)
    waiter: asyncio.Future[None] = loop.create_future()
    transport: Any = unix_events._UnixSubprocessTransport(  # type: ignore[attr-defined]
        loop, protocol, args, shell, stdin, stdout, stderr, 0, waiter=waiter, **kwds
    )  # the Popen happens here
    pidfd = os.pidfd_open(transport.get_pid())  # not reaped yet: it is ours to reap

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        popen: subprocess.Popen[bytes] = transport._proc
        transport._process_exited(popen.wait())  # it has exited: the reap does not block

    loop.add_reader(pidfd, exited)
    try:
        await waiter  # its pipes are connected
    except BaseException:
        transport.close()  # kills it; its exit is still reaped by ``exited``
        with contextlib.suppress(BaseException):
            await transport._wait()
        raise
    return aio_subprocess.Process(transport, protocol, loop)


def _asyncios_own(loop: asyncio.AbstractEventLoop) -> bool:
    """asyncio's loops start children by ``fork_exec`` already (uvloop's is not one of them)."""
    return isinstance(loop, asyncio.BaseEventLoop)


async def create_subprocess_exec(
    program: Any, *args: Any, stdin: Any = None, stdout: Any = None, stderr: Any = None,
    limit: int = _LIMIT, **kwds: Any,
) -> aio_subprocess.Process:  # fmt: skip
    if _asyncios_own(asyncio.get_running_loop()):
        return await _EXEC(
            program, *args, stdin=stdin, stdout=stdout, stderr=stderr, limit=limit, **kwds
        )
    return await _start((program, *args), False, stdin, stdout, stderr, limit, kwds)


async def create_subprocess_shell(
    cmd: Any, stdin: Any = None, stdout: Any = None, stderr: Any = None, limit: int = _LIMIT,
    **kwds: Any,
) -> aio_subprocess.Process:  # fmt: skip
    if _asyncios_own(asyncio.get_running_loop()):
        return await _SHELL(cmd, stdin=stdin, stdout=stdout, stderr=stderr, limit=limit, **kwds)
    return await _start(cmd, True, stdin, stdout, stderr, limit, kwds)


_REPLACED: dict[str, tuple[Any, Any]] = {  # name: (asyncio's, the plugin's)
    "create_subprocess_exec": (_EXEC, create_subprocess_exec),
    "create_subprocess_shell": (_SHELL, create_subprocess_shell),
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, (original, replacement) in _REPLACED.items():
        if getattr(asyncio, name) is original:
            setattr(asyncio, name, replacement)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    for name, (original, replacement) in _REPLACED.items():
        if getattr(asyncio, name) is replacement:
            setattr(asyncio, name, original)
