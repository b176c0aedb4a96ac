"""The LRU ledger: which installed packages are unused, how big, in which order they go.

Pure: no asyncio, no I/O; generic over the key. It knows neither paths nor files nor the index:
it decides, and its caller applies each decision. Its caller is a pass over the root's shared
index (``agent.state.index.sweep``), which fills a ledger with the ready packages no live agent
references, least recently used first, asks it which to evict, and evicts them in the same
transaction.

A key is *unused* while it is installed and nothing references it: cached, evictable
(``release``); ``use`` takes it back out. Keys in use, and installs in flight, are not in the
ledger at all, so they can never be chosen for eviction.

Evictions take the least recently released key first, and only as many as needed:
``evict_over_budget`` until the unused bytes fit the budget; ``evict_for(n)`` until at least
``n`` bytes are freed, or none at all when even evicting every unused key would not free ``n``
(the disk floor then refuses the install and keeps the cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class _Slot:
    size: int  # bytes of the package, >= 0
    seq: int  # when it was released: a ledger-wide counter, never reused


class Ledger(Generic[K]):
    """The unused keys in least-recently-used order, their sizes and bytes, and the budget.

    Invariants (``check_invariants`` asserts L1, L2 and L4; the property tests check L3 after
    every eviction):
      L1. ``unused_bytes`` is the sum of the sizes of the unused keys.
      L2. the unused keys are in the order they were released, least recent first; every
          eviction takes them from the front, so the least recently used key goes first.
      L3. after ``evict_over_budget``, ``unused_bytes <= budget_bytes``, and no key was evicted
          that did not have to be (before the last one went the bytes were over the budget).
      L4. every size is >= 0, and a key is unused at most once (``release`` of an unused key is
          a bug in the caller).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes  # L3: evict_over_budget brings unused_bytes under it
        # L2: insertion order is release order (seq strictly increasing); evictions pop the front.
        # L4: one slot per key, each size >= 0.
        self._unused: OrderedDict[K, _Slot] = OrderedDict()
        self._unused_bytes = 0  # L1: == sum of the slots' sizes
        self._seq = 0  # L2: above every slot's seq

    # -- queries ---------------------------------------------------------------------------
    @property
    def unused_bytes(self) -> int:
        return self._unused_bytes

    def is_unused(self, key: K) -> bool:
        return key in self._unused

    def size_of(self, key: K) -> int | None:
        """The unused key's size, or None if it is not unused."""
        slot = self._unused.get(key)
        return None if slot is None else slot.size

    def __len__(self) -> int:
        return len(self._unused)

    def __iter__(self) -> Iterator[K]:
        """The unused keys, least recently used (the next to be evicted) first."""
        return iter(self._unused)

    # -- mutations -------------------------------------------------------------------------
    def release(self, key: K, size: int) -> None:
        """The key's count reached 0 (or recovery adopted it): unused, the most recent."""
        if key in self._unused:
            raise AssertionError(f"{key} released while already unused")
        if size < 0:
            raise AssertionError(f"{key} released with a negative size {size}")
        self._unused[key] = _Slot(size, self._seq)
        self._seq += 1
        self._unused_bytes += size

    def use(self, key: K) -> bool:
        """The key's count went from 0 to 1: no longer evictable. False if it was not unused
        (an install in flight or a key not installed: it joins the ledger when released)."""
        slot = self._unused.pop(key, None)
        if slot is None:
            return False
        self._unused_bytes -= slot.size
        return True

    def evict_over_budget(self) -> list[K]:
        """Evict least recently used keys until the unused bytes fit the budget (L3); return
        them in eviction order. The caller removes their packages."""
        return self._evict_while(lambda: self._unused_bytes > self.budget_bytes)

    def evict_for(self, needed: int) -> list[K]:
        """Evict least recently used keys until at least ``needed`` bytes are freed; return
        them in eviction order. If all the unused bytes would not free ``needed``, evict none:
        emptying the cache would not make the room, so keep it."""
        if needed <= 0 or self._unused_bytes < needed:
            return []
        before = self._unused_bytes
        return self._evict_while(lambda: before - self._unused_bytes < needed)

    def _evict_while(self, go_on: Callable[[], bool]) -> list[K]:
        evicted = []
        while self._unused and go_on():
            key, slot = self._unused.popitem(last=False)  # L2: the least recent
            self._unused_bytes -= slot.size  # L1
            evicted.append(key)
        return evicted

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        total = sum(slot.size for slot in self._unused.values())
        assert total == self._unused_bytes, f"L1: unused bytes {self._unused_bytes} != {total}"
        seqs = [slot.seq for slot in self._unused.values()]
        assert seqs == sorted(set(seqs)), f"L2: unused keys out of release order: {seqs}"
        assert all(s < self._seq for s in seqs), f"L2: a release stamp from the future: {seqs}"
        sizes = [slot.size for slot in self._unused.values()]
        assert all(size >= 0 for size in sizes), f"L4: a negative size: {sizes}"
