"""A pytest plugin: the test tiers. Every test is in exactly one, by its file (``FILES`` below):

- ``unit``: pure, in this process: no socket, no child process;
- ``sockets``: in-process integration over real sockets (an agent on a unix socket, a package
  server or a store on 127.0.0.1); the processes the in-process agent starts itself (its unpack
  workers, its installers) and a small tool run on the side (mount, openssl) are part of it;
- ``process``: starts whole processes: the agent (``python -m agent``), raylet-sim's workers,
  node or demo, chaos, a benchmark, a pytest or a build of its own;
- ``ray``: needs Ray (stock Ray nodes, or Ray's own modules).

A file is in the tier of the heaviest thing any of its tests does, so ``pytest -m unit`` starts
nothing. A test with no tier, or with two (its file in ``FILES`` and a tier mark of its own),
fails the run at collection. At the end one line sums each tier: its tests and the seconds they
took (setup, call and teardown), just above pytest's summary line.

The tier also groups the tests for pytest-xdist (``-n 2 --dist loadgroup``, the README's test
command): the ``ray`` tier is one group, run by one worker one test at a time, as Ray's nodes
always were (two of them at once on 2 cores starve each other's startup timeouts), while the
other worker takes the other files; every other file is a group of its own (its tests share
their module's fixtures and run in its order)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

TIERS = ("unit", "sockets", "process", "ray")

# Each test file's tier; a new test file gets a line here (the run says which are missing).
FILES: dict[str, str] = {
    "test_access.py": "process",
    "test_agent_leftovers.py": "process",
    "test_archive.py": "unit",
    "test_bad_input.py": "sockets",
    "test_bench_smoke.py": "process",
    "test_bench_uv_full.py": "unit",
    "test_bench_uv_run.py": "unit",
    "test_build_progress.py": "unit",
    "test_bench_uv_scale.py": "unit",
    "test_chaos.py": "process",
    "test_chaos_ray.py": "ray",
    "test_chaos_ray_driver.py": "ray",
    "test_chaos_ray_oracle.py": "unit",
    "test_chaos_ray_server.py": "sockets",
    "test_chaos_ray_workload.py": "unit",
    "test_ci_run.py": "process",
    "test_cli_doors.py": "process",
    "test_client_retry.py": "sockets",
    "test_config.py": "process",
    "test_context.py": "unit",
    "test_core_pure.py": "unit",
    "test_parse_cache.py": "unit",
    "test_dialect.py": "unit",
    "test_crash_recovery.py": "process",
    "test_create_siblings.py": "sockets",
    "test_demo.py": "process",
    "test_disk_full_venv.py": "process",
    "test_disk_pressure.py": "sockets",
    "test_doc_citations.py": "unit",
    "test_doc_links.py": "unit",
    "test_echo_everywhere.py": "sockets",
    "test_errors.py": "unit",
    "test_fate.py": "process",
    "test_fetch.py": "sockets",
    "test_fetch_headers.py": "sockets",
    "test_gc_pause.py": "process",
    "test_child_spawn.py": "process",
    "test_gcs_fetch.py": "sockets",
    "test_gcs_uri.py": "unit",
    "test_harness_imports.py": "unit",
    "test_help_wrap.py": "unit",
    "test_holders.py": "unit",
    "test_hostile_fetch.py": "sockets",
    "test_hostile_memory.py": "process",
    "test_hostile_modes.py": "process",
    "test_hostile_pip.py": "sockets",
    "test_hot_path.py": "sockets",
    "test_idempotency.py": "unit",
    "test_installer_tmp.py": "unit",
    "test_interrupt.py": "process",
    "test_java_jars.py": "process",
    "test_py_wheel.py": "process",
    "test_kinds.py": "sockets",
    "test_layers.py": "process",
    "test_lifecycle.py": "sockets",
    "test_limits.py": "process",
    "test_load.py": "sockets",
    "test_local_sources.py": "unit",
    "test_log_fields.py": "unit",
    "test_logs.py": "process",
    "test_loop_stalls.py": "process",
    "test_loops.py": "process",
    "test_memory_budget.py": "unit",
    "test_metrics.py": "sockets",
    "test_module_shape.py": "unit",
    "test_no_internal.py": "process",
    "test_node_client.py": "process",
    "test_node_e2e.py": "process",
    "test_object_fetch.py": "process",
    "test_object_uris.py": "unit",
    "test_orphaned_installers.py": "process",
    "test_overlap.py": "sockets",
    "test_overlap_unit.py": "unit",
    "test_packaging.py": "process",
    "test_parent_watch.py": "process",
    "test_pip_crash.py": "process",
    "test_pip_env.py": "sockets",
    "test_pip_options.py": "unit",
    "test_pip_ray_options.py": "sockets",
    "test_pip_local.py": "sockets",
    "test_pip_spec.py": "unit",
    "test_plugin_config.py": "unit",
    "test_pip_worker.py": "process",
    "test_pool_jobs.py": "process",
    "test_pool_regressions.py": "process",
    "test_pool_unit.py": "process",
    "test_process.py": "process",
    "test_proto_drift.py": "process",
    "test_py_executable.py": "process",
    "test_queue_and_shutdown.py": "process",
    "test_race.py": "sockets",
    "test_ray_agent_cli.py": "process",
    "test_ray_cluster.py": "ray",
    "test_ray_context.py": "ray",
    "test_ray_cycles.py": "ray",
    "test_ray_door.py": "process",
    "test_ray_door_lifecycle.py": "process",
    "test_ray_fate.py": "ray",
    "test_ray_folders.py": "ray",
    "test_ray_folders_root.py": "process",
    "test_ray_folders_unit.py": "unit",
    "test_ray_front.py": "sockets",
    "test_ray_launcher.py": "ray",
    "test_ray_node.py": "ray",
    "test_ray_object_store.py": "ray",
    "test_ray_parse.py": "unit",
    "test_ray_slow_build.py": "ray",
    "test_slow_build.py": "sockets",
    "test_wd_requirements.py": "unit",
    "test_wd_requirements_door.py": "sockets",
    "test_ray_unknown_fields.py": "sockets",
    "test_ray_knobs.py": "sockets",
    "test_ray_plugins.py": "ray",
    "test_ray_py_modules.py": "ray",
    "test_ray_proto.py": "ray",
    "test_ray_shared_root.py": "ray",
    "test_ray_stop_cli.py": "process",
    "test_ray_stop_node.py": "ray",
    "test_ray_stop_unit.py": "unit",
    "test_ray_switch.py": "unit",
    "test_ray_switch_cli.py": "process",
    "test_ray_switch_node.py": "ray",
    "test_ray_switch_user.py": "process",
    "test_ray_uv_run.py": "ray",
    "test_ray_uv_run_agent.py": "ray",
    "test_ray_versions.py": "unit",
    "test_ray_versions_cli.py": "process",
    "test_ray_versions_node.py": "ray",
    "test_ray_venvs.py": "ray",
    "test_remeasure.py": "sockets",
    "test_readme_client.py": "process",
    "test_refs.py": "unit",
    "test_room.py": "unit",
    "test_venv_disk.py": "unit",
    "test_root_info.py": "process",
    "test_runtime_env.py": "unit",
    "test_sdnotify.py": "process",
    "test_service_state_machine.py": "sockets",
    "test_service_unit.py": "unit",
    "test_shared_index.py": "sockets",
    "test_shared_root.py": "process",
    "test_shared_state_machine.py": "sockets",
    "test_slots_unit.py": "unit",
    "test_smoke_integration.py": "sockets",
    "test_snapshot.py": "sockets",
    "test_spawn.py": "process",
    "test_sql_home.py": "unit",
    "test_stampede.py": "sockets",
    "test_state_db.py": "process",
    "test_state_db_corrupt.py": "process",
    "test_store_unit.py": "unit",
    "test_tiers.py": "process",
    "test_tmpguard.py": "process",
    "test_transport.py": "sockets",
    "test_units.py": "unit",
    "test_unpack_pool.py": "process",
    "test_unpack_pool_streaming.py": "process",
    "test_unsupported_fields.py": "sockets",
    "test_uv_version.py": "sockets",
    "test_uv_tool.py": "unit",
    "test_uv_env.py": "sockets",
    "test_uv_options.py": "sockets",
    "test_uv_project_settings.py": "unit",
    "test_uv_ray_options.py": "sockets",
    "test_uv_run_env.py": "sockets",
    "test_uv_run_line.py": "unit",
    "test_uv_spec.py": "unit",
    "test_watch.py": "process",
}


def tiers_of(item: pytest.Item) -> list[str]:
    """The tier marks ``item`` carries, each as often as it is given."""
    return [mark.name for mark in item.iter_markers() if mark.name in TIERS]


def tiers_line(totals: dict[str, tuple[int, float]]) -> str:
    """``tiers: unit 1,234 tests 12.3 s; sockets ...``, each tier in ``TIERS`` order."""
    parts = []
    for tier in TIERS:
        tests, seconds = totals.get(tier, (0, 0.0))
        parts.append(f"{tier} {tests:,} tests {seconds:.1f} s")
    return "tiers: " + "; ".join(parts)


class _Tiers:
    """The marks set and checked at collection, and the time of each tier's tests summed."""

    def __init__(self) -> None:
        self._tier_of: dict[str, str] = {}  # node id -> tier, for every test collected
        # tier -> (tests that ran, their seconds): each test counted at its setup report
        self._totals: dict[str, tuple[int, float]] = {}

    @pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the marks
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        wrong: dict[str, str] = {}  # a file (or a test of a listed file) -> what is wrong
        for item in items:
            name = Path(str(item.path)).name
            tier = FILES.get(name)
            if tier is not None:
                item.add_marker(tier)
            have = tiers_of(item)
            if len(have) == 1:
                self._tier_of[item.nodeid] = have[0]
                item.add_marker(pytest.mark.xdist_group(group_of(have[0], name)))
            elif not have:
                wrong.setdefault(name, "no tier (give the file a line in FILES)")
            else:
                wrong[item.nodeid] = " and ".join(have)
        if wrong:
            raise pytest.UsageError(
                f"every test needs exactly one tier mark ({', '.join(TIERS)}; "
                f"tests/harness/tiers.py gives each file its tier); {len(wrong)} have not: "
                + "; ".join(f"{where}: {what}" for where, what in list(wrong.items())[:10])
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Under pytest-xdist the controller collects nothing: a worker's report carries the
        # test's marks among its keywords.
        tier = self._tier_of.get(report.nodeid) or _tier_in(report.keywords)
        if tier is not None:
            tests, seconds = self._totals.get(tier, (0, 0.0))
            self._totals[tier] = (tests + (report.when == "setup"), seconds + report.duration)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The tiers line; pytest writes its own summary line after this hook."""
        if self._totals:
            terminalreporter.write_line(tiers_line(self._totals))


def group_of(tier: str, file: str) -> str:
    """The pytest-xdist group of a test of ``tier`` in ``file`` (see the module docstring)."""
    return "ray" if tier == "ray" else file


def _tier_in(keywords: Mapping[str, object]) -> str | None:
    """The one tier among a report's keywords, if there is one."""
    found = [tier for tier in TIERS if tier in keywords]
    return found[0] if len(found) == 1 else None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Tiers(), "rtenv-tiers")
