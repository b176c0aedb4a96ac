"""Logging: one line per event that matters, as text for people or JSON for machines.

The text format shows the message. The JSON format writes ``time`` (ISO-8601 in UTC with
milliseconds and the zone, ``2026-12-01T01:02:03.456+00:00``), ``level``, ``logger`` and
``message``, then every field the line has as a key of its own; ``traceback`` for a bug. A line
has two sorts of fields:

- Bound to the request that wrote it (``agent.core.logfields``), on every line a request
  writes, an install or eviction it started included: ``rpc`` and ``request_id`` (as the gRPC
  door received them), ``env_id`` (once the service knows the env).
- Passed by the event itself (``extra``; these win over bound ones of the same name): at start
  ``address``, ``root``, ``budget_bytes``, ``seconds``, ``metrics_address``, and recovery's
  counts (``rows_kept``, ``bytes_freed``...); for a package ``uri`` (its kind and URI),
  ``fetched_bytes``, ``unpacked_bytes``, ``seconds``, ``bytes`` (evicted), ``attempt`` (a
  download retried); for a failed request ``code`` (the gRPC status) and ``kind`` (the error's
  ``ErrorKind`` value).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from agent.core import logfields

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


def configure(
    level: str,
    fmt: str,
    *,
    handler: logging.Handler | None = None,
    text_format: str | None = None,
) -> None:
    """Send the agent's logs to ``handler`` (default stderr; ``ray-agent`` passes Ray's rotated
    log file) at ``level`` in ``fmt`` ("text" or "json"); ``text_format`` replaces the text
    format's line layout (a ``logging`` format string, as Ray's --logging-format)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log-format must be text or json, not {fmt!r}")
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        handler.addFilter(BoundFields())
    else:
        layout = text_format or "%(asctime)s %(levelname)s %(name)s: %(message)s"
        handler.setFormatter(logging.Formatter(layout))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
