"""Ray's per-job setup logs: where a build's progress lines reach the job's driver.

Ray's own agent writes what it does while it sets up a job's runtime env into
``<log-dir>/runtime_env_setup-<job_id>.log`` (its per-job logger, ``get_or_create_logger`` in
``ray/_private/runtime_env/agent/runtime_env_agent.py``), each line in Ray's ``LOGGER_FORMAT``
(``%(asctime)s\\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s``). Ray's log monitor
(``ray/_private/log_monitor.py``) streams ``runtime_env*.log`` of the session's log dir to the
drivers when the node's ``RAY_RUNTIME_ENV_LOG_TO_DRIVER_ENABLED=1`` (off by default, in Ray 2.51
to 2.60 alike): the driver prints each line as ``(pid=runtime_env) <line>``, to the job whose id
the file name carries (a decimal id: other files go to every driver). Without that variable the
file is still there, where Ray's docs say a setup's log is.

``SetupLogs.write`` appends one line for a job, in that format, in a thread (never on the loop),
one thread hop at a time in order; a job id that is not one of Ray's (hex text) is not made a
file name; a file past ``MAX_FILE_BYTES`` gets no more lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

RAY_FORMAT = "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"  # Ray's
MAX_FILE_BYTES = 16 * 1024 * 1024  # of one job's setup log: no more lines past it
_JOB_ID = re.compile(r"[0-9A-Za-z_]{1,64}")


def setup_log_path(log_dir: Path, job_id: str) -> Path | None:
    """The job's setup log, as Ray's agent names it; None for a job id Ray would not send."""
    if not _JOB_ID.fullmatch(job_id):
        return None
    return log_dir / f"runtime_env_setup-{job_id}.log"


def ray_line(message: str, created: float) -> str:
    """``message`` as Ray's per-job logger writes a line (INFO, this agent as its source)."""
    record = logging.LogRecord("rtenv-agent", logging.INFO, "rtenv-agent", 0, message, None, None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000)
    return logging.Formatter(RAY_FORMAT).format(record) + "\n"


class SetupLogs:
    """The Ray door's sink for progress lines (``AgentService.waiting.sink``)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._lock = threading.Lock()  # one append at a time: the lines stay in order
        self._tasks: set[asyncio.Future[None]] = set()

    def write(self, job_id: str, line: str) -> None:
        """Append ``line`` to the job's setup log, in the background."""
        path = setup_log_path(self.log_dir, job_id)
        if path is None:
            return
        text = ray_line(line, time.time())
        task = asyncio.ensure_future(asyncio.to_thread(self._append, path, text))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)

    async def drain(self) -> None:
        """Wait for the lines being written (tests, stop)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _append(self, path: Path, text: str) -> None:
        with self._lock:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                error = exc.strerror or str(exc)
                log.warning(
                    "cannot write Ray's setup log %s: %s",
                    path,
                    error,
                    extra={"path": str(path), "error": error},
                )
                return
            try:
                if os.fstat(fd).st_size < MAX_FILE_BYTES:
                    os.write(fd, text.encode("utf-8", "replace"))
            finally:
                os.close(fd)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("a line of Ray's setup log was not written: %s", exc, extra={"error": str(exc)})
