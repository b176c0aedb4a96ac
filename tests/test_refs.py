"""Unit and stateful property tests for the reference tables (env -> URIs, URI -> count)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.core.errors import EnvBusy, EnvNotFound
from agent.core.refs import RefTables
from agent.core.uris import UriKey, UriKind

X = UriKey(UriKind.PY_MODULES, "file:///x.zip")
Y = UriKey(UriKind.PY_MODULES, "file:///y.zip")
W = UriKey(UriKind.WORKING_DIR, "file:///x.zip")  # same URI as X, another kind


def created(tables: RefTables, env_id: str, keys: list[UriKey]) -> list[UriKey]:
    acquired = tables.begin_create(env_id, keys)
    tables.commit_create(env_id)
    return acquired


# -- unit tests ---------------------------------------------------------------------------------


def test_begin_create_counts_a_pending_reference_and_acquires_each_distinct_key() -> None:
    t = RefTables()
    assert t.begin_create("a", [X, W, X]) == [X, W]
    refs = t.env("a")
    assert refs is not None
    assert (refs.keys, refs.count, refs.pending) == ((X, W), 1, 1)
    assert (t.uri_count(X), t.uri_count(W), t.uri_count(Y)) == (1, 1, 0)
    t.check_invariants()


def test_second_create_of_an_env_counts_the_env_not_its_uris() -> None:
    t = RefTables()
    created(t, "a", [X])
    assert t.begin_create("a", [X]) == []
    assert t.env_count("a") == 2
    assert t.uri_count(X) == 1
    t.check_invariants()


def test_commit_makes_the_reference_deletable() -> None:
    t = RefTables()
    t.begin_create("a", [X, Y])
    with pytest.raises(EnvBusy, match="still in flight"):
        t.delete("a")
    assert t.env_count("a") == 1  # the refused delete changed nothing
    t.commit_create("a")
    assert t.delete("a") == (0, [X, Y])
    assert t.env("a") is None
    assert len(t) == 0
    assert list(t.uris()) == []
    t.check_invariants()


def test_a_hit_counts_one_committed_reference_on_a_counted_env_and_nothing_on_another() -> None:
    t = RefTables()
    created(t, "a", [X, Y])
    t.begin_create("a", [X, Y])  # a create in flight stays pending
    assert t.hit("a") == (X, Y)
    refs = t.env("a")
    assert refs is not None
    assert (refs.count, refs.pending) == (3, 1)
    assert (t.uri_count(X), t.uri_count(Y)) == (1, 1)  # the env's keys are counted once
    assert t.hit("b") is None
    assert t.env("b") is None
    t.check_invariants()
    assert t.delete("a") == (2, [])  # the hit's reference is deletable at once
    assert t.delete("a") == (1, [])
    with pytest.raises(EnvBusy):
        t.delete("a")  # only the pending one is left
    t.check_invariants()


def test_abort_of_the_only_create_releases_the_env_and_its_keys() -> None:
    t = RefTables()
    t.begin_create("a", [X, Y])
    assert t.abort_create("a") == [X, Y]
    assert t.env("a") is None
    assert t.uri_count(X) == 0
    t.check_invariants()


def test_abort_of_one_of_two_creates_keeps_the_env() -> None:
    t = RefTables()
    created(t, "a", [X])
    t.begin_create("a", [X])
    assert t.abort_create("a") == []
    refs = t.env("a")
    assert refs is not None
    assert (refs.count, refs.pending) == (1, 0)
    assert t.uri_count(X) == 1


def test_delete_of_an_unknown_env_is_env_not_found_and_changes_nothing() -> None:
    t = RefTables()
    created(t, "a", [X])
    with pytest.raises(EnvNotFound, match="unknown"):
        t.delete("nope")
    assert t.delete("a") == (0, [X])
    with pytest.raises(EnvNotFound):
        t.delete("a")  # no references left
    t.check_invariants()


def test_delete_while_only_pending_creates_is_env_busy() -> None:
    t = RefTables()
    t.begin_create("a", [X])
    t.begin_create("a", [X])
    with pytest.raises(EnvBusy) as info:
        t.delete("a")
    assert "2 create(s) still in flight" in info.value.message
    assert t.env_count("a") == 2


def test_delete_with_one_committed_and_one_pending_drops_the_committed_one() -> None:
    t = RefTables()
    created(t, "a", [X])
    t.begin_create("a", [X])
    assert t.delete("a") == (1, [])
    with pytest.raises(EnvBusy):
        t.delete("a")  # what is left belongs to the create in flight
    t.commit_create("a")
    assert t.delete("a") == (0, [X])


def test_a_uri_shared_by_two_envs_survives_the_first_env_release() -> None:
    t = RefTables()
    assert created(t, "a", [X, Y]) == [X, Y]
    assert created(t, "b", [Y, W]) == [W]  # Y already held by a
    assert t.uri_count(Y) == 2
    assert t.delete("a") == (0, [X])  # exactly X: Y is still b's
    assert t.uri_count(Y) == 1
    assert t.delete("b") == (0, [Y, W])
    assert dict(t.uris()) == {}
    t.check_invariants()


def test_same_uri_in_two_kinds_is_counted_and_released_separately() -> None:
    t = RefTables()
    created(t, "a", [X])
    created(t, "b", [W])
    assert t.delete("b") == (0, [W])
    assert t.uri_count(X) == 1


def test_commit_or_abort_without_a_create_in_flight_is_a_bug() -> None:
    t = RefTables()
    created(t, "a", [X])
    with pytest.raises(AssertionError, match="no create in flight"):
        t.commit_create("a")
    with pytest.raises(AssertionError, match="no create in flight"):
        t.abort_create("a")
    with pytest.raises(AssertionError, match="other keys"):
        t.begin_create("a", [Y])
    assert t.env_count("a") == 1


def test_check_invariants_catches_a_corrupted_uri_count() -> None:
    t = RefTables()
    created(t, "a", [X])
    t._uris[X] = 2
    with pytest.raises(AssertionError, match="I3/I4"):
        t.check_invariants()


# -- stateful property test ---------------------------------------------------------------------

KEYS = [
    UriKey(UriKind.WORKING_DIR, "file:///a.zip"),
    UriKey(UriKind.PY_MODULES, "file:///a.zip"),
    UriKey(UriKind.PY_MODULES, "file:///b.zip"),
    UriKey(UriKind.PY_MODULES, "file:///c.zip"),
]
# A small pool of envs that share keys; e3 names a key twice, e4 names none.
ENV_KEYS: dict[str, list[UriKey]] = {
    "e0": [KEYS[0], KEYS[2]],
    "e1": [KEYS[2], KEYS[3]],
    "e2": [KEYS[1], KEYS[2], KEYS[3]],
    "e3": [KEYS[3], KEYS[0], KEYS[3]],
    "e4": [],
}
ENVS = st.sampled_from(sorted(ENV_KEYS))
DERIVED = [UriKey(UriKind.UV_PROJECT, f"uvproject://{n}") for n in "ab"] + [KEYS[0]]


class RefTablesMachine(RuleBasedStateMachine):
    """Drives RefTables against a model: env -> list of "pending"/"committed" references."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = RefTables()
        self.model: dict[str, list[str]] = {}
        self.derived: dict[str, list[UriKey]] = {}  # keys a create derived, while the env lives

    def keys_of(self, env_id: str) -> tuple[UriKey, ...]:
        own = tuple(dict.fromkeys(ENV_KEYS[env_id]))
        return own + tuple(k for k in self.derived.get(env_id, []) if k not in own)

    def forget_dead(self) -> None:
        for env_id, refs in self.model.items():
            if not refs:
                self.derived.pop(env_id, None)

    def model_uri_counts(self) -> Counter[UriKey]:
        counts: Counter[UriKey] = Counter()
        for env_id, refs in self.model.items():
            if refs:
                counts.update(set(self.keys_of(env_id)))
        return counts

    def transitions(self, before: Counter[UriKey], after: Counter[UriKey]) -> set[UriKey]:
        return {key for key in before if after[key] == 0}

    @rule(env_id=ENVS)
    def begin_create(self, env_id: str) -> None:
        before = self.model_uri_counts()
        acquired = self.tables.begin_create(env_id, ENV_KEYS[env_id])
        self.model.setdefault(env_id, []).append("pending")
        after = self.model_uri_counts()
        assert len(acquired) == len(set(acquired))
        assert set(acquired) == {k for k in after if before[k] == 0}
        expected_order = list(dict.fromkeys(k for k in ENV_KEYS[env_id] if before[k] == 0))
        assert acquired == expected_order

    @precondition(lambda self: any("pending" in refs for refs in self.model.values()))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        env_id = data.draw(st.sampled_from(self.with_ref("pending")))
        self.tables.commit_create(env_id)
        refs = self.model[env_id]
        refs[refs.index("pending")] = "committed"

    @precondition(lambda self: any("pending" in refs for refs in self.model.values()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        env_id = data.draw(st.sampled_from(self.with_ref("pending")))
        before = self.model_uri_counts()
        released = self.tables.abort_create(env_id)
        self.model[env_id].remove("pending")
        after = self.model_uri_counts()
        self.forget_dead()
        assert set(released) == self.transitions(before, after)
        assert set(released) == self.transitions(before, self.model_uri_counts())
        assert len(released) == len(set(released))

    @precondition(lambda self: any("pending" in refs for refs in self.model.values()))
    @rule(data=st.data(), key=st.sampled_from(DERIVED))
    def derive(self, data: st.DataObject, key: UriKey) -> None:
        """A create in flight derives a key (a uv run project's venv): counted once for the
        env, acquired when new to the tables, dropped with the env's own keys."""
        env_id = data.draw(st.sampled_from(self.with_ref("pending")))
        before = self.model_uri_counts()
        acquired = self.tables.derive(env_id, [key])
        if key not in self.keys_of(env_id):
            self.derived.setdefault(env_id, []).append(key)
        assert set(acquired) == {k for k in self.model_uri_counts() if before[k] == 0}

    @rule(env_id=ENVS)
    def delete(self, env_id: str) -> None:
        before = self.model_uri_counts()
        refs = self.model.get(env_id, [])
        if not refs:
            with pytest.raises(EnvNotFound):
                self.tables.delete(env_id)
        elif "committed" not in refs:
            with pytest.raises(EnvBusy):
                self.tables.delete(env_id)
        else:
            left, released = self.tables.delete(env_id)
            refs.remove("committed")
            assert set(released) == self.transitions(before, self.model_uri_counts())
            self.forget_dead()
            assert left == len(refs)
            assert set(released) == self.transitions(before, self.model_uri_counts())
            assert len(released) == len(set(released))

    def with_ref(self, state: str) -> list[str]:
        return sorted(env_id for env_id, refs in self.model.items() if state in refs)

    @invariant()
    def tables_match_the_model(self) -> None:
        self.tables.check_invariants()
        live = {env_id: refs for env_id, refs in self.model.items() if refs}
        assert len(self.tables) == len(live)
        for env_id in ENV_KEYS:
            refs = live.get(env_id, [])
            assert self.tables.env_count(env_id) == len(refs)
            env = self.tables.env(env_id)
            if refs:
                assert env is not None
                assert env.pending == refs.count("pending")
                assert env.keys == self.keys_of(env_id)
            else:
                assert env is None
        assert dict(self.tables.uris()) == dict(self.model_uri_counts())
        for key in KEYS:
            assert self.tables.uri_count(key) == self.model_uri_counts()[key]


RefTablesMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
TestRefTablesStateMachine = RefTablesMachine.TestCase
