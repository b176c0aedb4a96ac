"""Numbers as people write and read them: sizes (``10GiB``, ``1.5G``, ``10GB``), durations
(``90s``, ``10m``, ``1h``) and counts of things. Pure.

Sizes: a bare K, M, G, T, or KiB, MiB, GiB, TiB, is binary (powers of 1024); kB, MB, GB, TB are
decimal (powers of 1000), as disks and most tools count them. ``B`` alone, or no unit, is bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from agent.core.errors import echo

_BINARY = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DECIMAL = {"k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*")
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*")
_SECONDS: dict[str | None, Decimal] = {
    None: Decimal(1),
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_SHOWN = 40  # characters of a bad value echoed back


def quoted(text: object, limit: int = _SHOWN) -> str:
    """A value echoed in a command-line error: ``errors.echo`` (the one way input is echoed),
    cut to a few dozen characters by default."""
    return echo(str(text), limit)


def parse_bytes(text: str) -> int:
    """'4096', '500M', '1.5GiB' (binary) or '10GB' (decimal) -> bytes, rounded down."""
    match = _SIZE.fullmatch(str(text).lower())
    if match is None:
        raise ValueError(f"{quoted(text)} is not a size such as 4096, 500M, 1.5GiB or 10GB")
    number, prefix, suffix = match.groups()
    scale = _DECIMAL[prefix] if prefix and suffix == "b" else _BINARY[prefix]
    return int(Decimal(number) * scale)


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1.5h', '500ms' -> seconds (a bare number is seconds)."""
    match = _DURATION.fullmatch(str(text).lower())
    if match is None:
        raise ValueError(f"{quoted(text)} is not a duration such as 90, 90s, 10m or 1.5h")
    return float(Decimal(match.group(1)) * _SECONDS[match.group(2)])


def parse_int(text: str) -> int:
    """A whole number, said so when it is not (int()'s message names Python's literals)."""
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"{quoted(text)} is not a whole number") from None


def parse_float(text: str) -> float:
    try:
        return float(Decimal(str(text).strip()))
    except (InvalidOperation, ValueError):
        raise ValueError(f"{quoted(text)} is not a number") from None


def human_bytes(size: int) -> str:
    """1073741824 -> '1.0 GiB'; 512 -> '512 B' (one decimal: for reading, not for parsing)."""
    if size < 1024:
        return f"{size} B"
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 1024:.1f} KiB"


def exact_bytes(size: int) -> str:
    """A setting's size for people: ``human_bytes``, with the exact count when it rounds."""
    shown = human_bytes(size)
    return shown if parse_bytes(shown) == size else f"{shown} ({size} B)"


def human_duration(seconds: float) -> str:
    """600 -> '10m', 3600 -> '1h', 12.5 -> '12.5s' (each parses back to the same value)."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def plural(count: int, singular: str, many: str | None = None) -> str:
    """'1 package', '2 packages', '0 packages'."""
    return f"{count} {singular if count == 1 else (many or singular + 's')}"
