"""The service's logic without sockets: a real ``AgentService`` over a real ``UriStore`` whose
fetcher talks to a ``MockTransport`` serving in-memory zips (``MockPackages``), with an injected
clock, over an index in memory (as --no-state-db keeps it), or a real SQLite file where the
file is the point.

Pinned: concurrent creates of one env send one request per package, a hit does no I/O and never
suspends, a setup timeout or a cancelled create gives back every reference and cancels the
installs nobody else waits for, delete makes packages unused, a failed create holds nothing and
the next one retries. The service's invariants (which include the store's) are checked after
every step. The gRPC tiers (test_stampede.py, test_lifecycle.py...) stay.

``service_rig`` is the one place that knows how the service is built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent.core.dialect import RAY
from agent.core.errors import EnvNotFound, InvalidRuntimeEnv, PackageNotFound, SetupTimeout
from tests.harness.packages import env_json
from tests.harness.polling import wait_until
from tests.harness.service_rig import service_rig
from tests.harness.store_rig import key_of

T = TypeVar("T")


def without_suspending(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end in one step: it must not await anything that suspends (no I/O,
    no lock, no thread, no timer)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the coroutine suspended")


# -- creates ------------------------------------------------------------------------------------


async def test_concurrent_creates_of_one_env_send_one_request_per_package(tmp_path: Path) -> None:
    async with service_rig(tmp_path) as r:
        a, b = r.packages.add("a"), r.packages.add("b")
        gate = r.packages.hold("a")
        env = env_json(py_modules=[a, b])
        creates = [asyncio.create_task(r.create(env)) for _ in range(10)]
        await wait_until(lambda: r.installed(b), what="b installed while a is held")
        assert r.packages.gets == {"a": 1, "b": 1}
        assert r.references(a) == r.references(b) == 1  # one env, counted ten times
        assert not any(c.done() for c in creates)
        r.check()

        gate.set()
        replies = await asyncio.wait_for(asyncio.gather(*creates), timeout=10)
        assert r.packages.gets == {"a": 1, "b": 1}
        assert len({c.env_id for c in replies}) == 1
        assert not any(c.hit for c in replies)
        env_id = replies[0].env_id
        assert r.service.tables.env_count(env_id) == 10
        for _ in range(10):
            await r.delete(env_id)
        assert r.unused(a)
        assert r.unused(b)


async def test_a_create_hit_answers_without_a_request_and_without_suspending(
    tmp_path: Path,
) -> None:
    async with service_rig(tmp_path) as r:
        a = r.packages.add("a")
        env = env_json(py_modules=[a], env_vars={"K": "v"})
        first = await r.create(env)
        assert not first.hit
        requests = len(r.packages.transport.requests)

        second = without_suspending(r.service.create(env, 0, ""))
        r.check()
        assert second.hit
        assert second.env_id == first.env_id
        assert second.context == first.context
        assert len(r.packages.transport.requests) == requests
        assert r.service.tables.env_count(first.env_id) == 2


async def test_a_failed_create_holds_no_reference_is_remembered_and_the_next_one_retries(
    tmp_path: Path,
) -> None:
    async with service_rig(tmp_path) as r:
        a, b = r.packages.add("a", statuses=(404,)), r.packages.add("b")
        await r.delete((await r.create(env_json(py_modules=[b]))).env_id)  # b: installed, unused
        env = env_json(py_modules=[a, b])
        with pytest.raises(PackageNotFound):
            await r.create(env)  # takes b from the unused, then gives it back
        r.check()
        failed_id = r.service.failures[-1].env.env_id
        assert len(r.service.tables) == 0
        assert r.references(a) == r.references(b) == 0
        # b's re-take may have been cut off in its index transaction, its outcome unknown: once
        # it ends, the view reads the ready packages again in the pass it asks for
        store = r.service.store
        await wait_until(lambda: store.installs_in_flight() == 0, what="b's re-take to end")
        await r.service.caught_up()
        assert r.unused(b)
        assert [f.error for f in r.service.failures] == [f"py_modules:{a}: the server answered 404"]

        created = await r.create(env)  # the failure is not remembered as an answer
        assert created.env_id == failed_id
        assert r.packages.gets["a"] == 2
        assert r.installed(a)
        assert r.installed(b)


# -- giving references back ---------------------------------------------------------------------


async def test_a_setup_timeout_releases_the_references_and_its_build_goes_on_for_a_retry(
    tmp_path: Path,
) -> None:
    """The create fails at its timeout, its references given back; the install it started goes
    on (kept by the store), ends as an unused package, and a retry uses it: one download."""
    async with service_rig(tmp_path, max_setup_timeout_s=0.1) as r:
        a, b = r.packages.add("a"), r.packages.add("b")
        kept = await r.create(env_json(py_modules=[b]))
        gate = r.packages.stall("a")  # a's body stops half-way: the env cannot be set up in time
        with pytest.raises(SetupTimeout) as timed_out:
            await r.create(env_json(py_modules=[a, b]), timeout_s=-1)  # -1: the longest, 0.1s
        r.check()
        assert "was not set up within 0.1s (setup_timeout_seconds)" in timed_out.value.message
        assert "1 build(s) go on" in timed_out.value.message
        assert r.references(a) == 0
        assert r.references(b) == 1  # the other env's
        entry = r.service.store.entry(key_of(a))
        assert entry is not None
        assert entry.kept
        assert [f.error for f in r.service.failures] == ["setup timed out"]
        assert list(r.service.records) == [kept.env_id]
        gate.set()
        await wait_until(lambda: r.installed(a), what="a's build finished")
        await r.service.caught_up()
        assert r.unused(a)  # nobody wanted it at its end: an unused package, evictable
        await r.create(env_json(py_modules=[a, b]))  # the retry: a hit
        assert r.packages.gets["a"] == 1
        r.check()


async def test_a_create_waits_each_attempts_timeout_while_its_one_build_goes_on(
    tmp_path: Path,
) -> None:
    """With 3 attempts (Ray's agent's), a build longer than one setup timeout but shorter than
    three ends in the create's success (Ray's agent would start it again twice); a build
    longer than three fails, the message naming the attempts."""
    async with service_rig(tmp_path, max_setup_timeout_s=1.0, setup_attempts=3) as r:
        a = r.packages.add("a")
        gate = r.packages.stall("a")
        create = asyncio.ensure_future(r.create(env_json(py_modules=[a]), timeout_s=-1))
        await asyncio.sleep(1.5)  # the stimulus: a build past one timeout (1s), within three
        assert not create.done()
        gate.set()
        await asyncio.wait_for(create, timeout=10)
        assert r.packages.gets["a"] == 1
    (tmp_path / "2").mkdir()
    async with service_rig(tmp_path / "2", max_setup_timeout_s=0.1, setup_attempts=2) as r:
        b = r.packages.add("b")
        gate = r.packages.stall("b")
        with pytest.raises(SetupTimeout) as timed_out:
            await r.create(env_json(py_modules=[b]), timeout_s=-1)
        message = timed_out.value.message
        assert "within 0.2s (2 attempts of setup_timeout_seconds, 0.1s each)" in message
        gate.set()
        r.check()


async def test_a_cancelled_create_gives_back_its_references_and_cancels_its_install(
    tmp_path: Path,
) -> None:
    async with service_rig(tmp_path) as r:
        a = r.packages.add("a")
        r.packages.stall("a")
        create = asyncio.create_task(r.create(env_json(py_modules=[a])))
        await wait_until(lambda: r.packages.transport.open_streams == 1, what="a's download")
        r.check()
        create.cancel()
        with pytest.raises(asyncio.CancelledError):
            await create
        r.check()
        assert len(r.service.tables) == 0
        assert r.service.records == {}
        await wait_until(lambda: r.service.store.entry(key_of(a)) is None, what="a's cancel")
        await r.service.store.drain()
        assert r.listing("tmp") == []
        assert r.listing("uris") == []
        assert r.packages.transport.open_streams == 0


async def test_delete_releases_the_references_and_makes_the_uris_unused(tmp_path: Path) -> None:
    async with service_rig(tmp_path) as r:
        a, b = r.packages.add("a"), r.packages.add("b")
        one = await r.create(env_json(py_modules=[a, b]))
        other = await r.create(env_json(py_modules=[b]))
        await r.create(env_json(py_modules=[a, b]))
        assert (r.references(a), r.references(b)) == (1, 2)  # per env, not per create

        assert await r.delete(one.env_id) == 1
        assert not r.unused(a)
        assert await r.delete(one.env_id) == 0
        assert r.unused(a)
        assert not r.unused(b)  # the other env still holds it
        assert one.env_id not in r.service.records
        with pytest.raises(EnvNotFound):
            await r.delete(one.env_id)
        r.check()

        assert await r.delete(other.env_id) == 0
        assert r.unused(b)
        assert len(r.service.tables) == 0
        requests = len(r.packages.transport.requests)
        again = await r.create(env_json(py_modules=[a, b]))  # unused, still installed
        assert again.env_id == one.env_id
        assert len(r.packages.transport.requests) == requests
        assert not r.unused(a)
        assert not r.unused(b)


async def test_deleting_the_last_reference_evicts_over_the_budget_least_recently_used_first(
    tmp_path: Path,
) -> None:
    async with service_rig(tmp_path, cache_budget_bytes=1500) as r:  # one package fits
        a, b = r.packages.add("a"), r.packages.add("b")
        env_a = await r.create(env_json(py_modules=[a]))
        env_b = await r.create(env_json(py_modules=[b]))
        r.clock.tick()
        await r.delete(env_a.env_id)
        assert r.unused(a)
        r.clock.tick()
        await r.delete(env_b.env_id)  # two unused do not fit: a, released first, goes
        await r.service.store.settle()  # at the pass the release asked for
        r.check()
        assert r.service.store.entry(key_of(a)) is None
        assert r.unused(b)
        assert r.listing("uris") == [r.service.store.path_for(key_of(b)).name]
        assert r.listing("trash") == []


# -- with the index -----------------------------------------------------------------------------


async def test_an_install_is_in_the_state_db_before_the_create_answers(tmp_path: Path) -> None:
    async with service_rig(tmp_path, persist=True) as r:
        a = r.packages.add("a")
        await r.create(env_json(py_modules=[a]))
        uris = (await r.db.load()).uris
        assert [(row.kind, row.uri, row.last_used_ms) for row in uris] == [
            ("py_modules", a, int(r.clock.now * 1000))
        ]


async def test_two_spellings_of_one_env_keep_each_its_own_config(tmp_path: Path) -> None:
    """``config`` is not part of an env's identity, so two texts of one env share its id; each
    still gets its own setup timeout and eager flag, in whichever order they are parsed."""
    async with service_rig(tmp_path) as r:
        config = {"eager_install": True, "setup_timeout_seconds": 5}
        eager = json.dumps({"env_vars": {"X": "1"}, "config": config})
        plain = json.dumps({"env_vars": {"X": "1"}})
        for _ in range(2):  # the second round reads both from the parse cache
            a, b = r.service._parses.parse(eager), r.service._parses.parse(plain)
            assert a.env_id == b.env_id
            assert (a.setup_timeout_seconds, a.eager_install) == (5, True)
            assert (b.setup_timeout_seconds, b.eager_install) == (None, None)
        created = await r.create(eager)
        assert r.service.records[created.env_id].eager_install is True
        await r.create(plain)  # the latest create's flag is the one shown
        assert r.service.records[created.env_id].eager_install is False


# -- Ray's runtime env plugins -------------------------------------------------------------------


async def test_plugin_fields_are_refused_but_at_the_ray_door(tmp_path: Path) -> None:
    """With the node's plugin fields accepted, a create that cannot run them (gRPC's) is
    refused naming them; the Ray front's (``dialect=RAY``) counts the env, nothing installed."""
    async with service_rig(tmp_path) as r:
        r.service.accept_plugin_fields(frozenset({"MyPlugin"}))
        env = '{"MyPlugin": {"a": 1}}'
        with pytest.raises(InvalidRuntimeEnv, match="MyPlugin are run only for Ray"):
            await r.create(env)
        created = await r.service.create(env, 0, "", dialect=RAY)
        assert r.service.tables.env_count(created.env_id) == 1
        assert r.packages.gets == {}
