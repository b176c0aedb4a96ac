"""The event loop the agent runs on: uvloop when installed, RTENV_EVENT_LOOP to choose, a mistaken
choice refused in one line before anything is touched; and the tests run on that same loop."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agent.ops import loops
from tests.harness.agent_process import refused, run_cli, serving, wait_health_serving

UVLOOP = importlib.util.find_spec("uvloop") is not None
needs_uvloop = pytest.mark.skipif(not UVLOOP, reason="uvloop is not installed (the extra 'fast')")
LOOP_LINE = re.compile(r"INFO agent\.ops\.entry: event loop: (\w+)(.*)$", re.M)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, loops.LoopChoice.AUTO),
        ("", loops.LoopChoice.AUTO),
        ("auto", loops.LoopChoice.AUTO),
        (" UVLOOP ", loops.LoopChoice.UVLOOP),
        ("asyncio", loops.LoopChoice.ASYNCIO),
    ],
)
def test_the_variable_chooses_by_name_and_unset_is_auto(
    value: str | None, expected: loops.LoopChoice
) -> None:
    environ = {} if value is None else {loops.ENV: value}
    assert loops.choice(environ) is expected


def test_a_value_naming_no_loop_is_refused_with_the_names_and_a_cut_echo() -> None:
    with pytest.raises(loops.LoopUnavailable) as caught:
        loops.choice({loops.ENV: "tokio" + "x" * 500})
    message = str(caught.value)
    assert "RTENV_EVENT_LOOP='tokio" in message, message
    assert "(505 characters)" in message, message
    assert len(message) < 200, message
    assert "one of: auto, asyncio, uvloop" in message, message


def test_asyncio_is_asyncio_s_own_loop_even_where_uvloop_is_installed() -> None:
    assert loops.loop_factory({loops.ENV: "asyncio"}) is None


def test_auto_is_uvloop_exactly_when_it_is_installed() -> None:
    factory = loops.loop_factory({})
    assert (factory is not None) == UVLOOP
    if factory is not None:
        loop = factory()
        try:
            assert type(loop).__module__.startswith("uvloop"), type(loop)
        finally:
            loop.close()


def test_uvloop_asked_for_but_not_installed_is_refused_not_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert loops.loop_factory({}) is None, "auto falls back to asyncio"
    with pytest.raises(loops.LoopUnavailable, match=r"uvloop is not installed in this Python"):
        loops.loop_factory({loops.ENV: "uvloop"})


async def test_in_process_tests_run_on_the_loop_the_agent_would() -> None:
    """conftest's loop factories: with uvloop installed the tests' own agents run on it."""
    running = type(asyncio.get_running_loop()).__module__
    factory = loops.loop_factory()
    assert running.startswith("uvloop" if factory is not None else "asyncio"), running


@pytest.mark.parametrize("choice", ["asyncio", pytest.param("uvloop", marks=needs_uvloop), "auto"])
async def test_serve_runs_on_the_chosen_loop_and_logs_it(
    base: Path, monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    monkeypatch.setenv(loops.ENV, choice)
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        await wait_health_serving(agent.address)
        log = agent.log_text()
    found = LOOP_LINE.search(log)
    assert found, log
    expected = "uvloop" if choice == "uvloop" or (choice == "auto" and UVLOOP) else "asyncio"
    assert found[1] == expected, log
    if choice == "asyncio":  # no advice to install what may be installed
        assert found[2] == " (chosen by RTENV_EVENT_LOOP)", log


@pytest.mark.parametrize("value", ["tokio", "uvloop"])
async def test_serve_refuses_a_loop_it_cannot_run_in_one_line_before_touching_the_root(
    base: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A mistaken name, and uvloop asked for where it is not installed (hidden from a child
    Python by a uvloop module that fails to import, first on its path)."""
    monkeypatch.setenv(loops.ENV, value)
    shadow = base / "shadow"
    shadow.mkdir()
    (shadow / "uvloop.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow))
    root = base / "root"
    code, err = await refused(base / "agent.log", "--root", str(root))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    words = "names no event loop" if value == "tokio" else "uvloop is not installed"
    assert lines[0].startswith("rtenv-agent: RTENV_EVENT_LOOP="), err
    assert words in lines[0], err
    assert not root.exists(), "the root was touched before the loop was chosen"


async def test_config_refuses_a_loop_serve_would_refuse(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(loops.ENV, "tokio")
    code, out, err = await run_cli("config", "--root", str(base / "root"))
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert "names no event loop" in err, err


def test_the_schedulers_tests_run_on_asyncio_as_raylet_sim_itself_does() -> None:
    from raylet_sim.pool import WorkerPool
    from tests import conftest

    scheduler_tests = ModuleType("scheduler_tests")  # as test_pool_unit: it imports the pool
    vars(scheduler_tests)["WorkerPool"] = WorkerPool
    assert conftest._uses_the_scheduler(scheduler_tests)
    assert not conftest._uses_the_scheduler(sys.modules[__name__])
