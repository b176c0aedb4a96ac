"""A cache bounded in bytes as well as in entries: what a client can make the agent remember
is bounded by what the agent allows, never by what the client sends.

Each value is weighed once, when it is put (an estimate of the bytes it holds); the oldest
entries are dropped until both bounds hold. A value heavier than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, weight: int) -> None:
        self.pop(key)
        if weight > self._max_bytes:
            return
        self._items[key] = (value, weight)
        self.bytes += weight
        while len(self._items) > self._max_entries or self.bytes > self._max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.bytes -= item[1]
        return item[0]
