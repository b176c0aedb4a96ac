"""The uv-full benchmark's oracle (``scripts/benchlib/uv_full_oracle.py``): this agent as issue 39
item 2 means it meets every goal on the small disk; a task that saw ENOSPC on this agent's side
(the planted defect) is an UNEXPECTED miss; before the item, the misses are EXPECTED; stock Ray's
figures are only its baseline, whatever they are; a disk not sized to one env is a broken run."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the benchmark's parts, as tests/harness/uv_wheels.py does
    sys.path.append(str(_SCRIPTS))
from benchlib.figures import WorkloadResult  # noqa: E402
from benchlib.uv_full_oracle import (  # noqa: E402
    PENDING,
    REFUSES,
    End,
    Outcome,
    broken,
    figures,
    misses,
    mode_of,
    names_figures,
    saw_no_space,
)

# main's refusal (agent/state/room.py), as Ray's RuntimeEnvSetupError carries it
REFUSAL = (
    "Failed to set up runtime environment.\nuv:proj: installing needs 209715200 bytes and keeps "
    "60000000 free (the min-free-disk setting), but 120000000 bytes are free on the agent's disk "
    "after evicting 0 unused package(s)"
)
UV_ENOSPC = "error: failed to write to file: No space left on device (os error 28)"
RAN = End(code=0, tasks=13)  # launch.py's 4 tasks and an actor, 8 probes
AFTER = End(code=0, tasks=8)
REFUSED = End(
    code=1, error_class="RuntimeEnvSetupError", first_line="Failed to set up runtime environment.",
    error_text=REFUSAL, tasks=9, failed=9, seconds=31.0, first_error_s=28.0,
)  # fmt: skip
GOOD = Outcome(
    agent="ours", a=(RAN,) * 3, a_after=(AFTER,) * 3, b=REFUSED, b_again=RAN,
    worker_logs_no_space=0, half_built=0, staging_bytes=0, processes_left=0, sized=True,
)  # fmt: skip
# the seed user's symptom: every driver's tasks fail on ENOSPC, venvs left half-built
FILLED = End(
    code=1, error_class="RayTaskError", first_line="task failed", error_text=UV_ENOSPC,
    tasks=9, failed=9, no_space_tasks=9, output_no_space=True, seconds=90.0, first_error_s=80.0,
)  # fmt: skip
STOCK = Outcome(
    agent="ray", a=(FILLED,) * 3, a_after=(End(code=1),) * 3, b=FILLED, b_again=FILLED,
    worker_logs_no_space=12, half_built=4, staging_bytes=0, processes_left=0, sized=True,
)  # fmt: skip


def _judge(ours: Outcome) -> tuple[list[str], list[str]]:
    rows = figures(WorkloadResult("uv-full"), STOCK, ours)
    return broken(STOCK) + broken(ours), misses(rows, ours)


def test_the_agent_as_item_2_means_it_meets_every_goal_and_stock_only_records() -> None:
    assert mode_of(GOOD) == REFUSES
    assert _judge(GOOD) == ([], [])


def test_a_planted_enospc_in_one_task_on_this_agent_is_an_unexpected_miss() -> None:
    hit = dataclasses.replace(RAN, failed=1, no_space_tasks=1, code=1, error_text=UV_ENOSPC)
    planted = dataclasses.replace(GOOD, a_after=(AFTER, hit, AFTER))
    bad, missed = _judge(planted)
    assert bad == []
    assert missed == [
        "UNEXPECTED miss: tasks that saw ENOSPC",
        "UNEXPECTED miss: A's experiments untouched (every task ran, before and after B)",
    ]


def test_a_refusal_that_names_no_figures_or_comes_late_is_a_miss() -> None:
    vague = dataclasses.replace(REFUSED, error_text="Failed to set up runtime environment.")
    assert mode_of(dataclasses.replace(GOOD, b=vague)) == PENDING
    slow = dataclasses.replace(GOOD, b=dataclasses.replace(REFUSED, first_error_s=200.0))
    assert _judge(slow)[1] == ["UNEXPECTED miss: B's first failed task, from its spawn"]


def test_before_item_2_every_miss_is_expected_with_its_reason() -> None:
    # main today: B's build meets the full disk inside uv, its tasks see ENOSPC
    pending = dataclasses.replace(GOOD, b=FILLED, b_again=FILLED, half_built=1)
    assert mode_of(pending) == PENDING
    bad, missed = _judge(pending)
    assert bad == []
    assert len(missed) == 6
    assert all(m.startswith("EXPECTED miss: ") for m in missed)
    assert all("issue 39 item 2" in m for m in missed)


def test_what_is_left_after_the_failure_is_a_miss() -> None:
    left = dataclasses.replace(GOOD, half_built=1, staging_bytes=4096)
    assert _judge(left)[1] == [
        "UNEXPECTED miss: half-built venvs left after B's failure",
        "UNEXPECTED miss: bytes left in the agent's staging after B's failure",
    ]


def test_a_disk_not_sized_to_one_env_or_a_process_left_is_a_broken_run() -> None:
    assert broken(dataclasses.replace(GOOD, sized=False)) == [
        "ours: the small disk's room is not one env but not two"
    ]
    assert broken(dataclasses.replace(STOCK, processes_left=2)) == [
        "ray: 2 process(es) of a cluster outlived its driver"
    ]


def test_a_cluster_that_did_not_start_for_the_load_is_a_broken_run_for_the_disk_not() -> None:
    line = "The current node timed out during startup. This could happen because ..."
    load = End(
        code=1, error_class="Exception", first_line=line, tasks=1, failed=1, free_bytes=2**30
    )
    assert broken(dataclasses.replace(GOOD, b_again=load)) == [
        "ours: 1 local cluster(s) did not start, not for the disk: " + line
    ]
    disk = dataclasses.replace(load, output_no_space=True)  # the seed user's: the disk is why
    assert broken(dataclasses.replace(STOCK, b_again=disk)) == []
    in_logs = dataclasses.replace(load, logs_no_space=True)  # its raylet's log says why
    assert broken(dataclasses.replace(STOCK, b_again=in_logs)) == []
    full = dataclasses.replace(load, free_bytes=4 * 2**20)  # a full disk writes no log
    assert broken(dataclasses.replace(STOCK, b_again=full)) == []


def test_enospc_is_told_from_the_agents_own_refusal() -> None:
    assert saw_no_space(UV_ENOSPC)
    assert saw_no_space("OSError: [Errno 28] No space left on device: '/tmp/ray'")
    assert not saw_no_space(REFUSAL)
    assert not saw_no_space("uv:proj: no space left on the agent's disk during the install")
    assert names_figures(REFUSAL)
    in_mib = (
        "uv:x: building its venv needs about 200.0 MiB; the agent keeps 58.0 MiB free on its "
        "disk (the min-free-disk setting), but 120.0 MiB are free after evicting 0 unused "
        "package(s). Nothing was written."
    )
    assert names_figures(in_mib)
    assert not names_figures(in_mib.replace("min-free-disk", "floor"))
    assert not names_figures("uv:proj: no space left on the agent's disk during the install")


def test_a_run_of_this_agent_alone_is_judged_with_nan_baselines() -> None:
    rows = figures(WorkloadResult("uv-full"), None, GOOD)
    assert len(rows) == 9
    assert all(f.goal_met for f in rows)
    assert all(math.isnan(f.baseline) for f in rows)
