"""The chaos run on real Ray (scripts/chaos_ray.py, issue 40), CI's short form: three stock Ray
clusters (two bare ``ray.init()``, one three-node ``Cluster``) on one root through the switch,
killed at every point, with no violation; and the same run with a defect planted in the agents
(``--plant``) fails, naming what broke. The full run (50 kills) is the README's command."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.harness.command_line import assert_refused_in_one_line
from tests.harness.processes import run_in_session
from tests.harness.ray_nodes import HTTP_OK
from tests.harness.uv_projects import UV

REPO = Path(__file__).resolve().parents[1]
CHAOS_RAY = REPO / "scripts" / "chaos_ray.py"

pytestmark = [
    pytest.mark.skipif(not HTTP_OK, reason="Ray before 2.56 takes no http:// URIs"),
    pytest.mark.skipif(not UV.is_file(), reason=f"its uv envs need uv beside this python ({UV})"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the run mounts a tmpfs of its own: needs root"),
]


def _run(args: list[str], timeout_s: float) -> tuple[int, str]:
    return run_in_session([sys.executable, str(CHAOS_RAY), *args], REPO, timeout_s, "chaos_ray")


def _field(out: str, name: str, pattern: str) -> tuple[str, ...]:
    match = re.search(rf"^{name}\s+{pattern}$", out, re.MULTILINE)
    assert match, f"no {name!r} line matching {pattern!r}:\n{out[-4000:]}"
    return match.groups()


@pytest.mark.timeout(900)
def test_a_short_run_kills_clusters_at_every_point_with_no_violation() -> None:
    """Two rounds, eight kills: every failure one the run caused, the root right in each
    round's quiet point and once its clusters stopped."""
    args = ["--seed", "21", "--rounds", "2", "--kills", "8", "--tasks", "10"]
    code, out = _run(args, timeout_s=840)
    (violations,) = _field(out, "violations", r"(\d+)")
    assert (code, int(violations)) == (0, 0), f"the run failed:\n{out[-6000:]}"
    (kills,) = _field(out, "kills", r"(\d+): .*")
    assert int(kills) >= 8
    ok, _failed = map(int, _field(out, "units", r"(\d+) ok, (\d+) failed .*"))
    assert ok > 0
    assert re.search(r"^seed 21: 2 of 2 rounds in ", out, re.MULTILINE), out[-3000:]


@pytest.mark.timeout(900)
def test_a_reference_dropped_early_fails_the_run_naming_the_reference() -> None:
    """The oracle sees: with the agents dropping a reused package's reference at once, the
    quiet look finds a live env's package with no reference in the index."""
    args = ["--seed", "22", "--rounds", "1", "--kills", "0", "--tasks", "16",
            "--plant", "drop_ref_early"]  # fmt: skip
    code, out = _run(args, timeout_s=840)
    assert code == 1, out[-4000:]
    (violations,) = _field(out, "violations", r"(\d+)")
    assert int(violations) > 0
    assert "state.db's references of its holder" in out, out[-4000:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--crash-share", "2"], "--crash-share must be between 0 and 1, got 2.0"),
        (["--round-s", "nan"], "--round-s must be a number of seconds above 0, got nan"),
        (["--plant", "bogus"], "argument --plant: invalid choice: 'bogus'"),
        (["--bogus"], r"unrecognized arguments: --bogus \(see chaos_ray --help\)"),
    ],
)
def test_a_command_line_mistake_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    assert_refused_in_one_line([sys.executable, str(CHAOS_RAY)], args, f"chaos_ray: {message}")
