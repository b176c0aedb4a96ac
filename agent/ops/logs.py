"""Logging: one line per event that matters, as text for people or JSON for machines.

The text format shows the message. The JSON format writes ``time`` (ISO-8601 in UTC with
milliseconds and the zone, ``2026-12-01T01:02:03.456+00:00``), ``level``, ``logger`` and
``message``, then every field the line has as a key of its own; ``traceback`` for a bug. A line
has two sorts of fields:

- Bound to the request that wrote it (``agent.core.logfields``), on every line a request
  writes, an install or eviction it started included: ``rpc`` and ``request_id`` (as the gRPC
  door received them; the Ray door's ``rpc`` is ``ray:<path>``, with Ray's ``job_id`` and
  ``source_process``), ``env_id`` (once the service knows the env).
- Passed by the event itself (``extra``; these win over bound ones of the same name; every log
  call that formats values into its message passes them so, ``tests/test_log_fields.py``):
  at start ``address``, ``root``, ``budget_bytes``, ``seconds``, ``metrics_address``,
  ``ray_address``, ``port_file``, ``event_loop``, ``objects`` (the frozen heap), under Ray
  ``node_id``, ``parent_pid``, ``flags`` (unknown ones), ``ray_version``, and recovery's
  counts (``rows_kept``, ``bytes_freed``...); for a package ``uri`` (its kind and URI),
  ``fetched_bytes``,
  ``unpacked_bytes``, ``seconds``, ``download_seconds``, ``unpack_seconds``, ``overlapped``,
  ``bytes`` (evicted, or a cleared wheel cache's), ``attempt`` (a download retried), ``url`` and
  ``failure`` (a ranged read refused), ``installer`` and ``options``; for an unpack worker
  ``pid``, ``worker``, ``how`` (its end), ``error``; for a root's holders ``holder``; for a file
  met ``path`` (and ``moved_to``); for a subprocess ``exit_code``; at a stop ``step``; for a
  failed request ``code`` (the gRPC status; at the Ray door FAILED or the HTTP status) and
  ``kind`` (the error's ``ErrorKind`` value, ``bug``, or the Ray door's refusal).
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import logging.handlers
import queue
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from agent.core import logfields
from agent.core.errors import echo

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def iso_time(created: float) -> str:
    """A record's time as ISO-8601, UTC, with milliseconds and the zone."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


class BoundFields(logging.Filter):
    """Puts the fields bound where the line is written (``logfields.bound()``) on the record,
    where its own ``extra`` fields have not already put them. Runs in the writer's context, as
    a handler's filter does."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in logfields.bound().items():
            if key not in _STANDARD and not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _ToQueue(logging.handlers.QueueHandler):
    """Hands a record to the writer thread as it is: its message made (the arguments may change
    once the caller goes on), its ``exc_info`` kept for the formatter (the queue never leaves
    the process, so nothing needs pickling)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        return record


# The writer thread of a threaded configure() while it runs; None otherwise. Guarded by _lock.
_listener: logging.handlers.QueueListener | None = None
_lock = threading.Lock()


def configure(
    level: str,
    fmt: str,
    *,
    handler: logging.Handler | None = None,
    text_format: str | None = None,
    threaded: bool = False,
) -> None:
    """Send the agent's logs to ``handler`` (default stderr; ``ray-agent`` passes Ray's rotated
    log file) at ``level`` in ``fmt`` ("text" or "json"); ``text_format`` replaces the text
    format's line layout (a ``logging`` format string, as Ray's --logging-format: a bad one is
    a ValueError here, not a failure on every line). ``threaded``: the handler writes in a
    thread of its own (a file's writes and rotation never block the event loop); the writers
    put records on a queue; ``shutdown()`` (also at exit) writes what is queued and stops it."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log-format must be text or json, not {fmt!r}")
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter()
    else:
        layout = text_format or "%(asctime)s %(levelname)s %(name)s: %(message)s"
        formatter = _text_formatter(layout)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    shutdown()
    front = handler
    if threaded:
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        front = _ToQueue(records)
        listener = logging.handlers.QueueListener(records, handler)
        with _lock:
            global _listener
            _listener = listener
        listener.start()
        atexit.register(shutdown)
    if fmt == "json":
        front.addFilter(BoundFields())  # in the writer's context, where the fields are bound
    root = logging.getLogger()
    root.handlers[:] = [front]
    root.setLevel(level.upper())


def shutdown() -> None:
    """Write the records queued for the writer thread, stop it and close its handler. Idempotent;
    the root logger keeps its queue handler (a record logged after this is dropped)."""
    global _listener
    with _lock:
        listener, _listener = _listener, None
    if listener is None:
        return
    listener.stop()  # writes what is queued, then joins the thread
    for handler in listener.handlers:
        handler.flush()
        handler.close()


def _text_formatter(layout: str) -> logging.Formatter:
    """A formatter for ``layout``, checked on a probe record: a field no record has, or a
    malformed layout, is refused here with the layout named."""
    try:
        formatter = logging.Formatter(layout)
        formatter.format(logging.makeLogRecord({"msg": "probe"}))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(
            f"the logging format {echo(layout)} is not a Python logging format "
            f"({type(exc).__name__}: {echo(str(exc))})"
        ) from None
    return formatter
