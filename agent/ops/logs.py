"""Logging: one line per event that matters, as text for people or JSON for machines.

Events carry their facts as ``extra`` fields (address, budget_bytes, env_id, request_id, uri,
sizes in bytes, seconds); the text format shows the message, the JSON format adds every extra
field as a key, and its ``time`` is ISO-8601 in UTC with milliseconds and the zone
(``2026-12-01T01:02:03.456+00:00``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def iso_time(created: float) -> str:
    """A record's time as ISO-8601, UTC, with milliseconds and the zone."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


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


def configure(level: str, fmt: str) -> None:
    """Send the agent's logs to stderr at ``level`` in ``fmt`` ("text" or "json")."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log-format must be text or json, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
