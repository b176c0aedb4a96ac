"""The reference tables: env id -> (URI keys, count) and URI key -> count.

Pure: no asyncio, no I/O. The service calls these methods between awaits, so each RPC's
bookkeeping is one atomic step. Owning both maps here is what closes the race in which a URI is
deleted while another env that needs it is still being created: a create takes its URI references
*before* its first await, so the URI's count is above zero for as long as anyone needs it.

A create holds its reference from ``begin_create`` on; while it is in flight the reference is
*pending*. ``commit_create`` makes it an ordinary reference a ``delete`` may drop;
``abort_create`` (failure, timeout, cancellation) gives it back. A delete never drops a pending
reference: that one belongs to a create that has not answered yet.

An agent may hold 100,000 envs, most of them naming the same few packages: an env's entry is a
small slotted object, and equal tuples of keys are shared between envs through a bounded pool
(a tuple forgotten by the pool stays valid where it is kept; it is only shared less).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from agent.core.bounded import BoundedCache
from agent.core.errors import EnvBusy, EnvNotFound
from agent.core.uris import UriKey

_SHARED_KEY_TUPLES = 1024  # distinct tuples of keys in the pool
_SHARED_KEY_BYTES = 8 * 1024 * 1024  # the URIs they hold, about


@dataclass(slots=True)
class EnvRefs:
    keys: tuple[UriKey, ...]  # distinct: the env's own, then those derived (``derive``)
    count: int  # all references: committed ones plus pending creates
    pending: int  # creates in flight, each holding one of `count`
    static: int = -1  # how many of ``keys`` the env names itself; -1: all of them


class RefTables:
    """Both maps, changed together.

    Invariants (``check_invariants`` asserts them; the property tests call it after every step):
      I1. every env in ``_envs`` has ``count >= 1`` and ``0 <= pending <= count``; an env whose
          count reaches 0 is removed at once.
      I2. an env's keys are distinct.
      I3. for every key, ``_uris[key]`` equals the number of envs in ``_envs`` whose keys contain
          it: a URI is counted once per env, however often the env names it.
      I4. no key in ``_uris`` has a count below 1; a key whose count reaches 0 is removed, and
          the caller is told so that the URI becomes unused (cached, evictable).
    """

    def __init__(self) -> None:
        self._envs: dict[str, EnvRefs] = {}
        self._uris: dict[UriKey, int] = {}
        # equal key tuples, shared (not part of the tables: forgetting one changes nothing)
        self._shared: BoundedCache[tuple[UriKey, ...], tuple[UriKey, ...]] = BoundedCache(
            _SHARED_KEY_TUPLES, _SHARED_KEY_BYTES
        )

    # -- queries ---------------------------------------------------------------------------
    def env(self, env_id: str) -> EnvRefs | None:
        return self._envs.get(env_id)

    def env_count(self, env_id: str) -> int:
        refs = self._envs.get(env_id)
        return refs.count if refs else 0

    def uri_count(self, key: UriKey) -> int:
        return self._uris.get(key, 0)

    def envs(self) -> Iterator[tuple[str, EnvRefs]]:
        return iter(self._envs.items())

    def uris(self) -> Iterator[tuple[UriKey, int]]:
        return iter(self._uris.items())

    def __len__(self) -> int:
        return len(self._envs)

    # -- mutations -------------------------------------------------------------------------
    def begin_create(self, env_id: str, keys: Iterable[UriKey]) -> list[UriKey]:
        """Count one pending reference on the env; return the keys that went from 0 to 1."""
        refs = self._envs.get(env_id)
        if refs is not None:
            own = refs.keys if refs.static < 0 else refs.keys[: refs.static]
            if keys is not own and tuple(dict.fromkeys(keys)) != own:
                raise AssertionError(f"env {env_id} was created with other keys")
            refs.count += 1
            refs.pending += 1
            return []
        distinct = self._share(tuple(dict.fromkeys(keys)))
        self._envs[env_id] = EnvRefs(keys=distinct, count=1, pending=1)
        return self._count(distinct)

    def derive(self, env_id: str, keys: Iterable[UriKey]) -> list[UriKey]:
        """Add keys an env's create found it needs once its own packages were installed (a
        ``uv run`` project's venv, named by the project's lock): counted once for the env, as
        its own keys are (I3), and dropped with them. Only while a create of the env is in
        flight; return the keys that went from 0 to 1."""
        refs = self._envs.get(env_id)
        if refs is None or refs.pending < 1:
            raise AssertionError(f"derive on env {env_id} with no create in flight")
        new = [key for key in dict.fromkeys(keys) if key not in refs.keys]
        if not new:
            return []
        if refs.static < 0:
            refs.static = len(refs.keys)
        refs.keys = (*refs.keys, *new)
        return self._count(new)

    def _count(self, keys: Iterable[UriKey]) -> list[UriKey]:
        """One more env on each of ``keys`` (distinct); return those that went from 0 to 1."""
        acquired = []
        for key in keys:
            before = self._uris.get(key, 0)
            self._uris[key] = before + 1
            if before == 0:
                acquired.append(key)
        return acquired

    def _share(self, keys: tuple[UriKey, ...]) -> tuple[UriKey, ...]:
        """An equal tuple another env keeps, if the pool knows one; else ``keys``, remembered."""
        shared = self._shared.get(keys)
        if shared is None:
            self._shared.put(keys, keys, 100 + sum(len(key.uri) + 100 for key in keys))
            return keys
        return shared

    def hit(self, env_id: str) -> tuple[UriKey, ...] | None:
        """One more reference on an env the tables count already, committed at once (a create
        with nothing to wait for: ``begin_create`` and ``commit_create`` in one step, no key
        going 0 -> 1); return the env's keys, or None (nothing done) if it is not counted."""
        refs = self._envs.get(env_id)
        if refs is None:
            return None
        refs.count += 1
        return refs.keys

    def commit_create(self, env_id: str) -> None:
        """The create answered success: its pending reference becomes an ordinary one."""
        refs = self._envs[env_id]
        if refs.pending < 1:
            raise AssertionError(f"commit of env {env_id} with no create in flight")
        refs.pending -= 1

    def abort_create(self, env_id: str) -> list[UriKey]:
        """The create failed or was cancelled: give its reference back.

        Returns the keys whose count reached 0 (now unused).
        """
        refs = self._envs[env_id]
        if refs.pending < 1:
            raise AssertionError(f"abort of env {env_id} with no create in flight")
        refs.pending -= 1
        return self._drop(env_id, refs)

    def delete(self, env_id: str) -> tuple[int, list[UriKey]]:
        """Drop one committed reference; return (references left, keys now unused)."""
        refs = self._envs.get(env_id)
        if refs is None:
            raise EnvNotFound(f"runtime env {env_id} is unknown or has no references left")
        if refs.count - refs.pending < 1:
            raise EnvBusy(
                f"runtime env {env_id} has no completed create to delete: {refs.pending} "
                "create(s) still in flight; delete after a create has returned, or cancel it"
            )
        released = self._drop(env_id, refs)
        return refs.count, released

    def _drop(self, env_id: str, refs: EnvRefs) -> list[UriKey]:
        refs.count -= 1
        if refs.count > 0:
            return []
        del self._envs[env_id]
        released = []
        for key in refs.keys:
            left = self._uris[key] - 1
            if left == 0:
                del self._uris[key]
                released.append(key)
            else:
                self._uris[key] = left
        return released

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        expected: dict[UriKey, int] = {}
        for env_id, refs in self._envs.items():
            assert refs.count >= 1, f"I1: env {env_id} kept at count {refs.count}"
            assert 0 <= refs.pending <= refs.count, f"I1: env {env_id} pending {refs.pending}"
            assert len(set(refs.keys)) == len(refs.keys), f"I2: env {env_id} repeats a key"
            for key in refs.keys:
                expected[key] = expected.get(key, 0) + 1
        assert self._uris == expected, f"I3/I4: uri counts {self._uris} != {expected}"
