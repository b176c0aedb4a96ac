"""Ray's runtime env plugins on a stock Ray node whose raylet launches this agent (issue 31):
the classes ``RAY_RUNTIME_ENV_PLUGINS`` names (``tests/harness/ray_plugins.py``, imported by the
agent through the node's ``PYTHONPATH``) run as Ray's agent runs them: in priority order, retried
``RUNTIME_ENV_RETRY_TIMES`` times, under the setup timeout, a URI created once while used and
deleted through ``delete_uri`` once unused (the plugin's cache size 0 here). One node and one
driver serve every check; the same tests pass on Ray's own agent (``RTENV_E2E_AGENT=ray``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ray_plugins
from tests.harness.agent_process import REPO
from tests.harness.ray_nodes import Json, drive, poll, ray_nodes

pytestmark = pytest.mark.timeout(300)
RETRIES = 3
DELETED_S = 60.0  # the driver gone, its envs deleted and their URIs with them
ORDER = ray_plugins.ORDER_VAR


def _calls(log: Path) -> list[Json]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Json, Path]]:
    """One node with every test plugin, one driver running every case; what the tasks saw
    and the plugins' log, read once the driver has ended."""
    log = tmp_path_factory.mktemp("plugins") / "calls.jsonl"
    log.write_text("")
    env = {
        "RAY_RUNTIME_ENV_PLUGINS": ray_plugins.plugins_config(),
        # the plugins' module is the repo's (tests.harness): the raylet passes PYTHONPATH on to
        # the agent, which imports plugin classes from it (pytest's own sys.path is not passed)
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        ray_plugins.LOG_VAR: str(log),
        "RUNTIME_ENV_RETRY_TIMES": str(RETRIES),
        "RUNTIME_ENV_RETRY_INTERVAL_MS": "100",
        "RAY_RUNTIME_ENV_RTENVURIS_CACHE_SIZE_GB": "0",
    }
    shared = ["u:shared"]
    cases = [
        {"name": "order", "runtime_env": {"RtenvSecond": {}, "RtenvFirst": {}},
         "spec": {"env": [ORDER]}},
        {"name": "flaky_ok", "runtime_env": {"RtenvFlaky": {"tag": "ok", "fail": RETRIES - 1}},
         "spec": {"env": ["RTENV_FLAKY_ATTEMPTS"]}},
        {"name": "flaky_bad", "runtime_env": {"RtenvFlaky": {"tag": "bad", "fail": RETRIES}}},
        {"name": "hang", "runtime_env": {"RtenvHang": {}, "config": {"setup_timeout_seconds": 1}}},
        {"name": "uris_1", "runtime_env": {"RtenvUris": {"uris": [*shared, "u:one"]}},
         "spec": {"env": ["RTENV_URIS"]}},
        {"name": "uris_2", "runtime_env": {"RtenvUris": {"uris": [*shared, "u:two"]}},
         "spec": {"env": ["RTENV_URIS"]}},
    ]  # fmt: skip
    with ray_nodes(1, env=env) as (node,):
        seen = drive(node, "probe", {"cases": cases, "tasks_only": True})

        def deleted() -> bool | None:
            gone = {c["uri"] for c in _calls(log) if c["hook"] == "delete_uri"}
            return True if {"u:shared", "u:one", "u:two"} <= gone else None

        poll(deleted, DELETED_S, "the plugin URIs deleted once the driver ended")
        yield {name: entry["task"] for name, entry in seen.items()}, log


def test_plugins_modify_the_context_in_priority_order(plugin_run: tuple[Json, Path]) -> None:
    """RtenvFirst (priority 5 from the node's config) runs before RtenvSecond (50), though
    listed after it and named second in the env."""
    seen, _ = plugin_run
    assert seen["order"]["env"][ORDER] == "RtenvFirst,RtenvSecond", seen["order"]


def test_a_failing_plugin_is_retried_until_it_succeeds(plugin_run: tuple[Json, Path]) -> None:
    seen, _ = plugin_run
    assert seen["flaky_ok"]["env"]["RTENV_FLAKY_ATTEMPTS"] == str(RETRIES), seen["flaky_ok"]


def test_a_plugin_failing_every_retry_reports_its_last_error(plugin_run: tuple[Json, Path]) -> None:
    seen, log = plugin_run
    assert seen["flaky_bad"]["error"] == "RuntimeEnvSetupError", seen["flaky_bad"]
    assert f"Fault injection {RETRIES}" in seen["flaky_bad"]["message"]
    tries = [c for c in _calls(log) if c["plugin"] == "RtenvFlaky"]
    assert len(tries) == 2 * RETRIES, tries  # ok: fails RETRIES-1 then succeeds; bad: RETRIES


def test_a_hanging_plugin_ends_at_the_setup_timeout_in_rays_words(
    plugin_run: tuple[Json, Path],
) -> None:
    seen, log = plugin_run
    assert seen["hang"]["error"] == "RuntimeEnvSetupError", seen["hang"]
    assert (
        "Failed to install runtime_env within the timeout of 1 seconds" in seen["hang"]["message"]
    )
    creates = [c for c in _calls(log) if c["plugin"] == "RtenvHang"]
    assert len(creates) == RETRIES, creates


def test_a_shared_plugin_uri_is_created_once_and_deleted_once_unused(
    plugin_run: tuple[Json, Path],
) -> None:
    """Two envs name ``u:shared``: created once while either uses it; every URI deleted through
    ``delete_uri`` once the driver's envs are gone (cache size 0), each exactly once."""
    seen, log = plugin_run
    assert seen["uris_1"]["env"]["RTENV_URIS"] == "u:shared,u:one", seen["uris_1"]
    assert seen["uris_2"]["env"]["RTENV_URIS"] == "u:shared,u:two", seen["uris_2"]
    calls = [c for c in _calls(log) if c["plugin"] == "RtenvUris"]
    created = sorted(c["uri"] for c in calls if c["hook"] == "create")
    deleted = sorted(c["uri"] for c in calls if c["hook"] == "delete_uri")
    assert created == ["u:one", "u:shared", "u:two"], calls
    assert deleted == ["u:one", "u:shared", "u:two"], calls
