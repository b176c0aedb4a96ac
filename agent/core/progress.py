"""What a build in flight says while it runs: one progress line, and when the next one is due.

A build (a package's install under this agent's claim: a zip fetched and unpacked, a venv made by
pip or uv) can take longer than a create waits (``setup_timeout_seconds``). While it runs, every
``PROGRESS_EVERY_S`` a line says what it builds (its label and kind), how far it is (the packages
installed so far, of the total where it is known; bytes so far in its staging folder) and for how
long. The agent's log carries each line; under Ray the setup log of each job waiting on the
build does too (``agent.doors.ray_setup_log``), which Ray's log monitor streams to the driver.

Pure: the clock is the caller's (``Throttle.due`` is handed the time), nothing here sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.units import human_bytes

PROGRESS_EVERY_S = 5.0  # between two lines of one build


@dataclass(frozen=True)
class BuildProgress:
    """A build in flight as a line says it (and info shows it)."""

    label: str  # the package, as messages name it (``UriKey.label``: ``<kind>:<uri>``)
    kind: str  # its kind's name (``UriKind.value``)
    elapsed_s: float  # since its install began (its queue for a slot included)
    bytes_so_far: int  # in its staging folder at the last look (downloads, unpacked files)
    packages_done: int | None = None  # packages installed so far, where known (a venv's)
    packages_total: int | None = None  # of how many, where the installer says
    queued: bool = False  # waiting for one of the install slots


def progress_line(progress: BuildProgress) -> str:
    """One line: ``building pip:pip://ab12...: 3/7 packages, 12.5 MiB so far, 42s`` (the
    label names the kind first)."""
    parts: list[str] = []
    if progress.queued:
        parts.append("queued for an install slot")
    done, total = progress.packages_done, progress.packages_total
    if total is not None:
        parts.append(f"{done or 0}/{total} packages")
    elif done is not None:
        parts.append(f"{done} packages installed")
    parts.append(f"{human_bytes(progress.bytes_so_far)} so far")
    parts.append(f"{progress.elapsed_s:.0f}s")
    return f"building {progress.label}: {', '.join(parts)}"


@dataclass
class Throttle:
    """When each build's next line is due: its first ``every_s`` after it began (a build that
    ends sooner says nothing), then every ``every_s``. Keyed by whatever names a build."""

    every_s: float = PROGRESS_EVERY_S
    _last: dict[object, float] = field(default_factory=dict)

    def due(self, key: object, started: float, now: float) -> bool:
        """Whether ``key``'s line is due at ``now`` (noted as said when it is)."""
        last = self._last.get(key, started)
        if now - last < self.every_s:
            return False
        self._last[key] = now
        return True

    def forget(self, keep: set[object]) -> None:
        """Drop what is kept of builds not in ``keep`` (ended ones)."""
        for key in [k for k in self._last if k not in keep]:
            del self._last[key]
