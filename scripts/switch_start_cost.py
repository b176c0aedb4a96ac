"""What the Ray switch costs at each Python start: ``python -c pass``, many runs, each case
interleaved with the others (round robin: a load on the machine moves them all), its median and
its ratio to the same venv without any switch.

Cases, in venvs made as the switch tests make them (``tests/harness/ray_switch.py``: Ray on the
path through a ``.pth`` line), with a home of this run's own:

- ``bare``: a venv with Ray, no switch, no PYTHONPATH (the baseline);
- ``per-venv``: the same with ``rtenv-agent ray enable --python`` (its ``.pth``);
- ``per-user, armed``: ``enable --user`` and PYTHONPATH as its block sets it: the hook chains,
  reads its config, finds Ray and arms;
- ``per-user, no ray``: the same hook in a venv without Ray (it stops at the path check);
- ``per-user, other project``: ``--project`` naming another folder (it stops at the scope).

Run: ``.venv/bin/python scripts/switch_start_cost.py [--runs N]`` (default 200 per case).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.ray_switch import agent_venv, ray_venv, switch


def _time(python: Path, env: dict[str, str]) -> tuple[float, float]:
    """Its wall time and its CPU time (user and system: what a loaded machine moves least)."""
    started = time.perf_counter()
    child = subprocess.Popen([str(python), "-c", "pass"], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, child.returncode
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="switch-cost-") as temp:
        tmp = Path(temp)
        home = tmp / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "XDG_"))}
        env.update(HOME=str(home))
        agent = agent_venv(tmp / "agent")
        bare, per_venv = ray_venv(tmp / "bare"), ray_venv(tmp / "per-venv")
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(tmp / "no-ray")], check=True
        )
        no_ray = tmp / "no-ray" / "bin" / "python"
        other = ray_venv(tmp / "other" / ".venv")
        done = switch(agent, "enable", "--python", str(per_venv), env=env)
        assert done.returncode == 0, done.stderr
        done = switch(agent, "enable", "--user", env=env)
        assert done.returncode == 0, done.stderr
        hooked = {**env, "PYTHONPATH": str(home / ".local/share/rtenv-agent/switch")}
        home2 = tmp / "home2"  # a second user's: --project naming the bare venv's folder
        home2.mkdir()
        done = switch(
            agent, "enable", "--project", str(tmp / "bare"), env={**env, "HOME": str(home2)}
        )
        assert done.returncode == 0, done.stderr
        elsewhere = {**env, "HOME": str(home2)}
        elsewhere["PYTHONPATH"] = str(home2 / ".local/share/rtenv-agent/switch")
        cases: dict[str, tuple[Path, dict[str, str]]] = {
            "bare": (bare, env),
            "per-venv": (per_venv, env),
            "per-user, armed": (bare, hooked),
            "per-user, no ray": (no_ray, hooked),
            "per-user, other project": (other, elsewhere),
        }
        for python, environ in cases.values():  # each writes its bytecode once, untimed
            _time(python, environ)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, (python, environ) in cases.items():
                times[name].append(_time(python, environ))
    wall0 = statistics.median(w for w, _ in times["bare"])
    cpu0 = statistics.median(c for _, c in times["bare"])
    print(f"python -c pass, {runs} runs per case, interleaved; medians (ratio to bare):")
    for name, values in times.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(
            f"  {name:24} wall {wall * 1000:7.2f} ms (x{wall / wall0:.3f})"
            f"   cpu {cpu * 1000:6.2f} ms (x{cpu / cpu0:.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
