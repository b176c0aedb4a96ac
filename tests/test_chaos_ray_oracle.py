"""The oracle of the chaos run on real Ray (scripts/chaosray/oracle.py): it tells the failures a
fault the run injected can have caused from every other failure, exactly, and never excuses a
unit of work that saw other files than its env's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.append(str(SCRIPTS))

from chaosray.oracle import JOIN_S, SETTLE_S, AttemptEnd, Fault, Outcome, judge  # noqa: E402


def _failed(cluster: int = 0, attempt: int = 1, t0: float = 100.0, t1: float = 110.0,
            paths: tuple[str, ...] = ("/pkg/a.zip",)) -> Outcome:  # fmt: skip
    return Outcome(cluster, attempt, "wd-1", paths, t0, t1, False, "WorkerCrashedError", "died")


def test_a_unit_that_saw_other_files_is_a_violation_whatever_faults_there_were() -> None:
    """Rule 1: a mismatch is never expected, not even beside a fault that ended its cluster."""
    seen = Outcome(0, 1, "wd-1", (), 100, 110, False, mismatch=("missing a.txt at end",))
    faults = [Fault("raylet", 105, 105, cluster=0, attempt=1)]
    verdict = judge([seen], faults, [])
    assert verdict.violations == ["cluster 0 attempt 1: task of wd-1 saw other files: "
                                  "missing a.txt at end"]  # fmt: skip


def test_a_failure_with_no_fault_is_a_violation_naming_its_error() -> None:
    verdict = judge([_failed()], [], [])
    assert len(verdict.violations) == 1
    assert "failed with no fault to cause it: WorkerCrashedError: died" in verdict.violations[0]
    assert verdict.failed == 1


@pytest.mark.parametrize(
    ("fault", "explained"),
    [
        # a fault that ends the cluster: that attempt's failures from the fault on
        (Fault("raylet", 105, 105, cluster=0, attempt=1), True),
        (Fault("raylet", 105, 105, cluster=0, attempt=2), False),  # another attempt
        (Fault("raylet", 105, 105, cluster=1, attempt=1), False),  # another cluster
        (Fault("agent", 111, 111, cluster=0, attempt=1), False),  # after the failure
        (Fault("crash:after_download", 50, 50, cluster=0, attempt=1), False),  # never fired
        # a worker killed while the unit was in flight, on its cluster
        (Fault("worker", 105, 105, cluster=0, attempt=1), True),
        (Fault("worker", 99, 99, cluster=0, attempt=1), False),  # before it was submitted
        (Fault("worker", 105, 105, cluster=2, attempt=1), False),
        # windows: an agent stopped, the disk full (every cluster)
        (Fault("sigstop", 90, 101, cluster=0), True),
        (Fault("sigstop", 90, 99, cluster=0), False),
        (Fault("disk-full", 109, 112), True),
        (Fault("disk-full", 111, 112), False),
        # the package server: only on a path the unit's env downloads
        (Fault("server:500", 105, 105, path="/pkg/a.zip"), True),
        (Fault("server:500", 105, 105, path="/pkg/b.zip"), False),
        (Fault("server:reset", 100 - JOIN_S + 1, 0, path="/pkg/a.zip"), True),  # joined build
        (Fault("server:reset", 100 - JOIN_S - 1, 0, path="/pkg/a.zip"), False),
    ],
)
def test_a_failure_is_explained_only_by_a_fault_that_can_have_caused_it(
    fault: Fault, explained: bool
) -> None:
    verdict = judge([_failed()], [fault], [])
    assert (verdict.violations == []) is explained, verdict.violations
    assert verdict.explained == ({fault.kind: 1} if explained else {})


def test_an_attempt_that_did_not_finish_needs_a_fault_that_ended_its_cluster() -> None:
    """Rule 3: a driver that died or hung is a violation unless a fault ended its cluster."""
    ends = [AttemptEnd(0, 1, False, "exit -9"), AttemptEnd(1, 1, False, "exit 1"),
            AttemptEnd(2, 1, True)]  # fmt: skip
    faults = [Fault("driver", 5, 5, cluster=0, attempt=1), Fault("worker", 5, 5, cluster=1,
                                                                 attempt=1)]  # fmt: skip
    verdict = judge([], faults, ends)
    assert verdict.violations == ["cluster 1 attempt 1 ended with no fault to end it: exit 1"]


def test_an_env_case_that_never_ran_ok_is_a_violation_even_if_each_failure_is_explained() -> None:
    """Rule 4: a broken case hidden behind faults is still found."""
    fault = Fault("raylet", 105, 105, cluster=0, attempt=1, fatal=True)
    ok = Outcome(0, 1, "wd-2", (), 1, 2, True)
    verdict = judge([_failed(), ok], [fault], [], cases=["wd-1", "wd-2"])
    assert verdict.violations == ["env cases that never ran ok: wd-1"]


def test_an_attempt_that_died_while_the_disk_was_full_is_explained_by_it() -> None:
    """Ray's own session files are on the run's disk: a node starting while it is full fails."""
    full = [Fault("disk-full", 50, 53)]
    during = AttemptEnd(0, 9, False, "node timed out during startup", 40, 80)
    after = AttemptEnd(0, 10, False, "node timed out during startup", 60, 90)
    assert judge([], full, [during]).violations == []
    assert len(judge([], full, [after]).violations) == 1


def test_successes_and_explained_failures_are_counted() -> None:
    ok = Outcome(0, 1, "wd-1", (), 1, 2, True)
    verdict = judge([ok, ok, _failed()], [Fault("gcs", 101, 101, cluster=0, attempt=1)], [])
    assert (verdict.ok, verdict.failed, dict(verdict.explained)) == (2, 1, {"gcs": 1})
    assert verdict.violations == []


def test_a_node_fault_explains_later_units_only_while_ray_settles_or_if_it_was_fatal() -> None:
    """A worker node killed in a Cluster that lives on: a unit submitted long after it must not
    fail; one submitted while Ray has not yet seen the node dead may; after a fatal kill (the
    cluster's only node, its head), every later failure of the attempt is the kill's."""
    node = Fault("raylet", 10, 10, cluster=0, attempt=1)
    fatal = Fault("raylet", 10, 10, cluster=0, attempt=1, fatal=True)
    soon = _failed(t0=10 + SETTLE_S - 1, t1=10 + SETTLE_S + 5)
    late = _failed(t0=10 + SETTLE_S + 1, t1=10 + SETTLE_S + 5)
    assert judge([soon], [node], []).violations == []
    assert len(judge([late], [node], []).violations) == 1
    assert judge([late], [fatal], []).violations == []


def test_a_failure_is_counted_for_its_likeliest_cause() -> None:
    """An agent stopped for a while and then its raylet killed: the kill took the unit."""
    faults = [Fault("sigstop", 101, 103, cluster=0), Fault("raylet", 105, 105, cluster=0,
                                                           attempt=1)]  # fmt: skip
    assert dict(judge([_failed()], faults, []).explained) == {"raylet": 1}


def test_an_armed_crash_point_explains_its_attempts_failures_once_it_fired() -> None:
    """It fired: the attempt died undone."""
    armed = Fault("crash:mid_extract", 50, 50, cluster=0, attempt=1)
    assert judge([_failed()], [armed], [AttemptEnd(0, 1, False, "exit 1")]).violations == []
    assert len(judge([_failed()], [armed], [AttemptEnd(0, 1, True)]).violations) == 1
