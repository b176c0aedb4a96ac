"""Unit and stateful property tests for the LRU ledger: unused keys, their bytes, eviction order."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agent.core.ledger import Ledger

# -- unit tests ---------------------------------------------------------------------------------


def test_release_makes_a_key_unused_and_use_takes_its_bytes_back() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=100)
    ledger.release("a", 30)
    ledger.release("b", 20)
    assert (ledger.unused_bytes, ledger.is_unused("a"), ledger.size_of("a")) == (50, True, 30)
    assert ledger.use("a") is True
    assert (ledger.unused_bytes, ledger.is_unused("a"), ledger.size_of("a")) == (20, False, None)
    assert list(ledger) == ["b"]
    ledger.check_invariants()


def test_use_of_a_key_not_unused_changes_nothing() -> None:
    """An install in flight, or a key never installed, is not in the ledger: nothing to take."""
    ledger: Ledger[str] = Ledger(budget_bytes=100)
    ledger.release("a", 10)
    assert ledger.use("x") is False
    assert (ledger.unused_bytes, list(ledger)) == (10, ["a"])


def test_evict_over_budget_takes_the_least_recently_released_first_and_no_more() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=50)
    for key in ("a", "b", "c"):
        ledger.release(key, 20)
    ledger.use("a")
    ledger.release("a", 20)  # used again: now the most recent
    assert list(ledger) == ["b", "c", "a"]
    assert ledger.evict_over_budget() == ["b"]  # 60 -> 40: one is enough
    assert (ledger.unused_bytes, list(ledger)) == (40, ["c", "a"])
    assert ledger.evict_over_budget() == []
    ledger.budget_bytes = 0
    assert ledger.evict_over_budget() == ["c", "a"]
    assert ledger.unused_bytes == 0
    ledger.check_invariants()


def test_evict_for_frees_at_least_what_is_needed_least_recent_first() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=1000)
    for key, size in (("a", 10), ("b", 30), ("c", 5)):
        ledger.release(key, size)
    assert ledger.evict_for(11) == ["a", "b"]  # a alone frees 10 < 11
    assert (ledger.unused_bytes, list(ledger)) == (5, ["c"])


def test_evict_for_evicts_nothing_when_even_all_would_not_free_enough() -> None:
    """The disk floor keeps the cache when emptying it would not make the room anyway."""
    ledger: Ledger[str] = Ledger(budget_bytes=1000)
    ledger.release("a", 10)
    ledger.release("b", 10)
    assert ledger.evict_for(21) == []
    assert ledger.evict_for(0) == []
    assert (ledger.unused_bytes, list(ledger)) == (20, ["a", "b"])
    assert ledger.evict_for(20) == ["a", "b"]


def test_a_zero_byte_key_is_evicted_in_its_turn() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=0)
    ledger.release("empty", 0)
    ledger.release("a", 5)
    assert ledger.evict_over_budget() == ["empty", "a"]


def test_releasing_an_unused_key_or_a_negative_size_is_a_bug() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=100)
    ledger.release("a", 10)
    with pytest.raises(AssertionError, match="already unused"):
        ledger.release("a", 10)
    with pytest.raises(AssertionError, match="negative size"):
        ledger.release("b", -1)
    assert (ledger.unused_bytes, list(ledger)) == (10, ["a"])


def test_check_invariants_catches_wrong_bytes_and_a_broken_order() -> None:
    ledger: Ledger[str] = Ledger(budget_bytes=100)
    ledger.release("a", 10)
    ledger.release("b", 10)
    ledger._unused_bytes = 25
    with pytest.raises(AssertionError, match="L1"):
        ledger.check_invariants()
    ledger._unused_bytes = 20
    ledger._unused.move_to_end("a")  # a now looks more recent than b, though released first
    with pytest.raises(AssertionError, match="L2"):
        ledger.check_invariants()


# -- stateful property test ---------------------------------------------------------------------

KEYS = st.sampled_from(["k0", "k1", "k2", "k3", "k4"])
SIZES = st.integers(min_value=0, max_value=40)


class LedgerMachine(RuleBasedStateMachine):
    """Drives the ledger against a model: the unused keys as a list, least recent first, with
    their sizes. Evictions must match the model's (least recent first, only as many as needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger: Ledger[str] = Ledger(budget_bytes=60)
        self.model: list[tuple[str, int]] = []  # least recently released first

    def model_bytes(self) -> int:
        return sum(size for _, size in self.model)

    def model_has(self, key: str) -> bool:
        return any(k == key for k, _ in self.model)

    @rule(key=KEYS, size=SIZES)
    def release(self, key: str, size: int) -> None:
        if self.model_has(key):
            with pytest.raises(AssertionError, match="already unused"):
                self.ledger.release(key, size)
            return
        self.ledger.release(key, size)
        self.model.append((key, size))

    @rule(key=KEYS)
    def use(self, key: str) -> None:
        assert self.ledger.use(key) == self.model_has(key)
        self.model = [(k, s) for k, s in self.model if k != key]

    @rule(budget=st.integers(min_value=0, max_value=120))
    def set_budget(self, budget: int) -> None:
        self.ledger.budget_bytes = budget

    @rule()
    def evict_over_budget(self) -> None:
        evicted = self.ledger.evict_over_budget()
        expected = []
        while self.model_bytes() > self.ledger.budget_bytes:
            expected.append(self.model.pop(0))
        assert evicted == [k for k, _ in expected], "L2: least recent first"
        assert self.ledger.unused_bytes <= self.ledger.budget_bytes, "L3: fits the budget"
        if expected:  # L3: the last one had to go
            assert self.ledger.unused_bytes + expected[-1][1] > self.ledger.budget_bytes

    @rule(needed=st.integers(min_value=-5, max_value=150))
    def evict_for(self, needed: int) -> None:
        before = self.model_bytes()
        evicted = self.ledger.evict_for(needed)
        expected = []
        if 0 < needed <= before:
            while before - self.model_bytes() < needed:
                expected.append(self.model.pop(0))
        assert evicted == [k for k, _ in expected], "least recent first, only as many as needed"
        freed = before - self.ledger.unused_bytes
        assert freed == sum(size for _, size in expected)
        if evicted:
            assert freed >= needed
            assert freed - expected[-1][1] < needed, "no key evicted that did not have to be"

    @invariant()
    def ledger_matches_the_model(self) -> None:
        self.ledger.check_invariants()
        assert self.ledger.unused_bytes == self.model_bytes(), "L1"
        assert list(self.ledger) == [k for k, _ in self.model], "L2"
        assert len(self.ledger) == len(self.model)
        sizes = dict(self.model)
        for key in ("k0", "k1", "k2", "k3", "k4"):
            assert self.ledger.is_unused(key) == (key in sizes)
            assert self.ledger.size_of(key) == sizes.get(key)


LedgerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_ledger_state_machine = LedgerMachine.TestCase
