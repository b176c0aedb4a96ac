"""Log events carry their values as fields: a log call of ``agent/`` that formats values into
its message (arguments after it, or an f-string, ``%`` or ``.format`` message) passes them as
``extra={...}`` too, so the JSON format gives each fact a key of its own (``agent/ops/logs.py``
names them). Read from the sources with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOGGERS = {"log", "logger", "_log"}
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def prose_log_calls(source: str) -> list[int]:
    """The lines of the log calls in ``source`` that format values without ``extra=``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in LOGGERS
        ):
            continue
        if any(keyword.arg == "extra" for keyword in node.keywords):
            continue
        message = node.args[0] if node.args else None
        formats = (
            len(node.args) > 1
            or isinstance(message, ast.JoinedStr)
            or (isinstance(message, ast.BinOp) and isinstance(message.op, ast.Mod))
            or (
                isinstance(message, ast.Call)
                and isinstance(message.func, ast.Attribute)
                and message.func.attr == "format"
            )
        )
        if formats:
            found.append(node.lineno)
    return found


@pytest.mark.parametrize(
    "path", sorted((ROOT / "agent").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_log_call_that_formats_values_passes_them_as_fields(path: Path) -> None:
    lines = prose_log_calls(path.read_text())
    assert lines == [], f"{path.relative_to(ROOT)}: log calls without extra= at lines {lines}"


def test_the_oracle_sees_each_way_of_formatting_a_message_into_prose() -> None:
    planted = (
        "log.info('installed %s', uri)\n"
        "logger.warning(f'gone {pid}')\n"
        "_log.error('bad %s' % thing)\n"
        "log.debug('took {}'.format(seconds))\n"
        "log.info('stopped')\n"
        "log.info('installed %s', uri, extra={'uri': uri})\n"
        "other.info('not a logger %s', x)\n"
    )
    assert prose_log_calls(planted) == [1, 2, 3, 4]
