"""The agent's doors by their addresses, checked before its start touches the root: the gRPC door
(``--address``), the metrics door (``--metrics-address``) and the Ray door (the flag that named
it), each with the flag a refusal names; ``probe_doors`` finds each free (``agent.ops.startup``
holds the checks themselves).
"""

from __future__ import annotations

from agent.app.config import Settings
from agent.ops.startup import check_door_address, probe_address

METRICS_FLAG = "--metrics-address"


def every_door(settings: Settings, address: str) -> list[tuple[str, str]]:
    """Every door, as (the flag that names it, its checked HOST:PORT or unix:PATH): the gRPC
    door at ``address`` (checked already) first."""
    return [("--address", address), *_other_doors(settings)]


def _other_doors(settings: Settings) -> list[tuple[str, str]]:
    """The doors beside the gRPC one, as (the flag that names it, its checked HOST:PORT)."""
    doors = []
    if settings.metrics_address:
        doors.append(
            (
                METRICS_FLAG,
                check_door_address(METRICS_FLAG, settings.metrics_address, settings.allow_remote),
            )
        )
    if settings.ray is not None:
        host = settings.ray.host.strip("[]")
        shown = f"[{host}]" if ":" in host else host
        flag = settings.ray.named_by
        doors.append(
            (flag, check_door_address(flag, f"{shown}:{settings.ray.port}", settings.allow_remote))
        )
    return doors


def probe_doors(doors: list[tuple[str, str]]) -> None:
    """Every door's address free, before the root is touched (blocking: call in a thread)."""
    for flag, address in doors:
        probe_address(address, flag)
