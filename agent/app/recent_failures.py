"""The recent failures a front keeps for info: per key (a Ray door's serialized string), the
latest failure's message and how long its create took, oldest dropped first.

Pure: no I/O. Bounded in count (``max_kept``) and in bytes (``max_bytes``: each key and message
weighed); a failure heavier than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Failed:
    error: str
    creation_time_ms: int

    def weight(self, key: str) -> int:
        return len(key) + len(self.error) + 200


class RecentFailures:
    def __init__(self, max_kept: int, max_bytes: int) -> None:
        self._max_kept = max_kept
        self._max_bytes = max_bytes
        # oldest first: at most max_kept entries and max_bytes of their weight (``_bytes``)
        self._failed: OrderedDict[str, Failed] = OrderedDict()
        self._bytes = 0

    def __contains__(self, key: str) -> bool:
        return key in self._failed

    def remember(self, key: str, error: str, creation_time_ms: int) -> None:
        """``key``'s latest failure, in place of any it had."""
        self.forget(key)
        failed = Failed(error, creation_time_ms)
        weight = failed.weight(key)
        if weight > self._max_bytes:
            return
        self._failed[key] = failed
        self._bytes += weight
        while len(self._failed) > self._max_kept or self._bytes > self._max_bytes:
            text, dropped = self._failed.popitem(last=False)
            self._bytes -= dropped.weight(text)

    def forget(self, key: str) -> None:
        failed = self._failed.pop(key, None)
        if failed is not None:
            self._bytes -= failed.weight(key)

    def newest_first(self) -> Iterator[tuple[str, Failed]]:
        return reversed(self._failed.items())

    def check_invariants(self) -> None:
        weight = sum(f.weight(t) for t, f in self._failed.items())
        assert weight == self._bytes, f"failures weigh {weight}, noted {self._bytes}"
        assert len(self._failed) <= self._max_kept, f"{len(self._failed)} failures kept"
        assert weight <= self._max_bytes, f"failures weigh {weight}"
