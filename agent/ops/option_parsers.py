"""How a setting's text becomes its value, for the forms that are the agent's own: a disk
floor, a door's HOST:PORT, a boolean, a worker count, a positive number, one of some words.
(Sizes, durations and plain numbers are ``agent.core.units``'.) Each raises ValueError saying
what it takes; ``option_sources.resolve`` names the setting and where its text came from.

Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.app.config import RaySettings
from agent.core.errors import StartupError
from agent.core.units import parse_bytes, parse_float, parse_int, quoted
from agent.install.disk.root import DiskFloor
from agent.ops.startup import split_host_port


def parse_floor(text: str) -> DiskFloor:
    """'1GiB', '5%' or 'auto' (the smaller of 1 GiB and 5% of the file system)."""
    text = str(text).strip().lower()
    if text == "auto":
        return DiskFloor()
    if text.endswith("%"):
        percent = parse_float(text[:-1])
        if not 0 <= percent < 100:
            raise ValueError(f"{quoted(text)}: a percentage from 0 to 100")
        return DiskFloor(bytes_=None, percent=percent)
    return DiskFloor(bytes_=parse_bytes(text), percent=None)


def parse_ray_address(text: str) -> RaySettings | None:
    """``--ray-address``: HOST:PORT of the Ray door ("" = off); loopback unless allow-remote
    (checked at start, as for ``address``)."""
    if not text.strip():
        return None
    try:
        host, port = split_host_port(text.strip())
    except StartupError as exc:
        raise ValueError(exc.message) from exc
    return RaySettings(host=host, port=port)


def parse_bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{quoted(text)} is not a boolean (true/false)")


def parse_workers(text: str) -> int | None:
    """``--extract-workers``: 'auto' (None: one per core, at most 4) or a count from 0."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        value = parse_int(text)
    except ValueError:
        value = -1  # said below, with what is allowed
    if not 0 <= value <= 256:
        raise ValueError(f"{quoted(text)}: auto, or a count from 0 to 256")
    return value


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise ValueError(f"{quoted(text)} must be above 0")
        return value

    return parse


def one_of(*choices: str) -> Callable[[str], str]:
    """One of ``choices``, in any case ('debug' is DEBUG)."""
    by_folded = {choice.casefold(): choice for choice in choices}

    def parse(text: str) -> str:
        choice = by_folded.get(str(text).strip().casefold())
        if choice is None:
            raise ValueError(f"{quoted(text)} is not one of {', '.join(choices)}")
        return choice

    return parse
