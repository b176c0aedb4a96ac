"""One process of the unpack pool (``pool.py``): ``python -S -m
agent.install.unpack.worker SOCKET_FD STOPS_FD INDEX PARENT_PID NICE`` (no site: the standard
library and the agent's own package, found by PYTHONPATH, are all it imports).

It lowers its priority (``os.nice``: the agent's event loop wins the CPU when it wakes), then
answers tasks on its socket (``send``/``receive``: length-prefixed pickled tuples), one at a
time, until the socket ends (the agent closed it, or died):

- ``("whole", job, archive, dest, strip, limits, label, growing, 0, 1, gated)``: plan, write
  every entry, finish (``archive.extract_zip``'s steps);
- ``("share", job, archive, dest, strip, limits, label, growing, k, n, gated)``: plan (every
  check of the central directory, made again here: the checks run where the extraction runs),
  then write share ``k`` of ``n`` (``shares.shares``) into ``dest``, made if no other share
  made it yet;
- ``("finish", job, archive, dest, strip, limits, label, growing, 0, n, False)``: the links,
  then the final modes (the plan is kept from this worker's share of the job, or made again).

``growing``: None for a complete archive; ``(size, tail_offset, tail_file)`` for one whose
download is still under way (``growing.GrowingZip``: the tail, read from its file, known; the
rest read as it arrives).

``gated``: once the plan passed, and before anything is written, the worker sends
``("planned", declared_bytes)`` and waits for ``("go",)`` (the agent found the disk room for
them); any other reply ends the task (``("stopped",)``).

Each answer is ``("ok", bytes_written)``, ``("stopped",)``, or ``("error", name, message,
errno, detail)``: an expected error's class name (``UnsafeArchive``, ``FailedPrecondition``) and
message, an ``OSError``'s errno (a full disk is the store's to word), or anything else with its
traceback in ``detail``.

Stopping: byte ``INDEX`` of the shared memory ``STOPS_FD`` is set by the agent when this
worker's task must end (its install was cancelled, or another share failed); it is read before
every entry and chunk, and so is the parent's pid (an agent killed outright: the worker stops
writing, then its socket ends). Imports only the zip modules (``plan``, ``shares``,
``write``, ``finish``), the core's errors and ``agent.crash`` (a crash point a test arms kills
the agent, then this worker: the agent dies mid-extract): a worker starts in a fraction of the
agent's time.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path
from typing import Any

from agent.core.errors import AgentError
from agent.crash import kills_agent
from agent.install.unpack.finish import finish
from agent.install.unpack.growing import Growing, GrowingZip
from agent.install.unpack.plan import ArchiveLimits, Plan, opened_zip, plan_zip
from agent.install.unpack.shares import allowance, shares
from agent.install.unpack.stop import Stopped
from agent.install.unpack.write import write_share

# A signal to the agent's whole group (a terminal's ^C or hang-up; systemd's stop, which sends
# SIGTERM to every process of the unit) is the agent's to handle: it ends its workers itself
# (their sockets closed, then their PIDs killed past a grace). A worker that died of it was
# replaced while the agent began to stop. The pool starts each worker with these blocked (a
# blocked signal stays pending across exec), and the worker ignores them before it unblocks
# them, so even one sent while the worker still imports is ignored.
AGENTS_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})

Answer = tuple[Any, ...]


class _Worker:
    def __init__(self, sock: socket.socket, stops: mmap.mmap, index: int, parent: int) -> None:
        self._sock = sock
        self._stops = stops
        self._index = index
        self._parent = parent
        self._plans: dict[int, Plan] = {}  # job -> its plan, for the finish (the latest two)

    def halted(self) -> bool:
        return self._stops[self._index] != 0 or os.getppid() != self._parent

    def _gate(self, declared: int) -> None:
        """The plan passed: tell the agent what it declares, and write only once the agent
        has the room for it (``go``); anything else ends the task."""
        send(self._sock, ("planned", declared))
        if receive(self._sock) != ("go",):
            raise Stopped

    def run(self, task: tuple[Any, ...]) -> Answer:
        kind, job, archive, dest, strip, limits, label, growing, k, n, gated = task
        try:
            written = self._step(
                kind, job, Path(archive), Path(dest), strip, limits, label, growing, k, n, gated
            )
            return ("ok", written)
        except Stopped:
            return ("stopped",)
        except AgentError as exc:
            return ("error", type(exc).__name__, exc.message, None, "")
        except OSError as exc:
            return ("error", "OSError", exc.strerror or str(exc), exc.errno, str(exc.filename))
        except Exception as exc:  # a bug: the agent logs it, with this traceback
            detail = "".join(traceback.format_exception(exc))
            return ("error", type(exc).__name__, str(exc), None, detail)

    def _step(
        self,
        kind: str,
        job: int,
        archive: Path,
        dest: Path,
        strip: bool,
        limits: ArchiveLimits,
        label: str,
        growing: Growing | None,
        k: int,
        n: int,
        gated: bool,
    ) -> int:
        if kind == "finish":
            kept = self._plans.pop(job, None)
            if kept is not None and not kept.links:  # the modes only: no need of the archive
                return finish(None, kept, dest.resolve(), label, self.halted)
            if kept is not None:
                self._plans[job] = kept
        with contextlib.ExitStack() as stack:
            if growing is None:
                source: Path | GrowingZip = archive
                size = archive.stat().st_size
            else:
                size, tail_offset, tail_file = growing
                tail = Path(tail_file).read_bytes()
                source = stack.enter_context(
                    GrowingZip(str(archive), size, tail_offset, tail, self.halted)
                )
            zf = stack.enter_context(opened_zip(source, label))
            plan = self._plans.pop(job, None) if kind == "finish" else None
            if plan is None:
                plan = plan_zip(zf, size, strip, limits, label)
            if gated:
                self._gate(plan.declared)
            if kind == "finish":
                return finish(zf, plan, dest.resolve(), label, self.halted)
            with contextlib.suppress(FileExistsError):
                os.mkdir(dest, 0o700)  # the first share makes it, private
            root = dest.resolve()
            share = shares(plan, n)[k] if n > 1 else plan.entries
            allowed = allowance(plan, share, n, limits)
            written = write_share(zf, share, root, allowed, label, self.halted)
            if kind == "whole":
                return written + finish(zf, plan, root, label, self.halted)
            self._plans[job] = plan
            while len(self._plans) > 2:
                del self._plans[next(iter(self._plans))]
            return written


def main(argv: list[str]) -> None:
    sock_fd, stops_fd, index, parent, nice = (int(a) for a in argv)
    kills_agent(parent)  # a crash point reached here (tests) is the agent's death
    for sig in AGENTS_SIGNALS:  # ignored before they are unblocked: none is lost nor fatal
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, AGENTS_SIGNALS)
    os.nice(nice)
    stops = mmap.mmap(stops_fd, 0)
    os.close(stops_fd)
    sock = socket.socket(fileno=sock_fd)
    worker = _Worker(sock, stops, index, parent)
    while True:
        try:
            task = receive(sock)
        except (EOFError, OSError):
            return  # the agent closed the pool, or died
        answer = worker.run(task)
        try:
            send(sock, answer)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                return
            raise


_LENGTH = struct.Struct("!I")


def send(sock: socket.socket, message: tuple[Any, ...]) -> None:
    """One message: its pickle's length (4 bytes), then the pickle, in one write."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(body)) + body)


def receive(sock: socket.socket) -> Any:
    """The next message; ``EOFError`` at the socket's end."""
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return pickle.loads(_exactly(sock, length))


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
