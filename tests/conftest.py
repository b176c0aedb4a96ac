"""Fixtures shared by the test tiers."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest

from agent.ops import loops
from tests.harness.pip_wheels import build_wheelhouse
from tests.harness.tempdirs import short_tempdir

# Each session gets a private temp dir that must be empty at its end (tests/harness/tmpguard.py);
# no garbage collection runs inside an AST parse (it crashed pytest on 3.11.7:
# tests/harness/gc_pause.py); on uvloop, children start without uvloop's fork (grpc's after-fork
# handlers crashed some: tests/harness/child_spawn.py); every test has one tier, each tier's time
# is said at the end (tests/harness/tiers.py).
pytest_plugins = [
    "tests.harness.tmpguard",
    "tests.harness.gc_pause",
    "tests.harness.child_spawn",
    "tests.harness.tiers",
]


@pytest.fixture
def base() -> Iterator[Path]:
    """A short directory (unix socket paths fit in it) for roots, sockets and logs, removed
    afterwards."""
    path = short_tempdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pip tests' offline wheelhouse, built once per session in pytest's own tmp_path
    folders (an atexit removal came after the temp-dir guard's check)."""
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


def _session_loop() -> tuple[str, loops.LoopFactory]:
    """The loop the agent would run on in this environment (``agent.ops.loops``: uvloop when
    installed, unless RTENV_EVENT_LOOP says), its name and factory. The in-process tests run on
    it, and the agent processes the tests start inherit RTENV_EVENT_LOOP: with uvloop installed
    the whole session runs on uvloop, as the agent of a user who installed the extra 'fast'."""
    factory = loops.loop_factory(os.environ)
    if factory is None:
        return "asyncio", asyncio.new_event_loop
    return factory.__module__.split(".")[0], factory


def pytest_report_header(config: pytest.Config) -> str:
    name, _ = _session_loop()
    return f"event loop: {name} ({loops.ENV}: {os.environ.get(loops.ENV) or 'unset'})"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, loops.LoopFactory]:
    """pytest-asyncio's loops are the agent's loop (see ``_session_loop``), but for the tests
    of the simulated scheduler, which runs on asyncio's own loop (``asyncio.run`` in its CLI):
    its agents are its sidecar processes, which still choose theirs."""
    module = getattr(item, "module", None)
    if module is not None and _uses_the_scheduler(module):
        return {"asyncio": asyncio.new_event_loop}
    name, factory = _session_loop()
    return {name: factory}


def _uses_the_scheduler(module: ModuleType) -> bool:
    """Whether a test module imported anything of ``raylet_sim``."""
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.split(".")[0] == "raylet_sim":
            return True
    return False
