"""The Ray versions at the command line, as processes: ``rtenv-agent ray-agent`` that cannot
start leaves its reason in the session's ``runtime_env_agent.err`` and ``.log`` (a raylet
fate-shares with its agent, and a usage error was on a stderr no file kept), and
``rtenv-agent ray start`` on a Ray older than the supported range refuses by name before Ray's
CLI runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.agent_process import REPO, START_S

RAY_CLI_S = 60.0  # a python importing ray, then our launcher


def _ray_2_51_flags(base: Path) -> list[str]:
    """Ray 2.51's services.py flags as `ray start` passes them (stdout and stderr to files)."""
    logs = base / "session_1" / "logs"
    return [
        "--node-ip-address=127.0.0.1", "--runtime-env-agent-port=1",
        "--gcs-address=127.0.0.1:1", f"--cluster-id-hex={'e5' * 28}",
        f"--runtime-env-dir={base / 'session_1' / 'runtime_resources'}",
        "--logging-rotate-bytes=536870912", "--logging-rotate-backup-count=5",
        f"--log-dir={logs}", f"--temp-dir={base}",
        f"--stdout-filepath={logs / 'runtime_env_agent.out'}",
        f"--stderr-filepath={logs / 'runtime_env_agent.err'}",
    ]  # fmt: skip


def _agent(argv: list[str], **environ: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTENV_", "RAY_AUTH"))}
    return subprocess.run(
        [sys.executable, "-m", "agent", "ray-agent", *argv], cwd=REPO, env={**env, **environ},
        capture_output=True, text=True, timeout=START_S, check=False,
    )  # fmt: skip


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_usage_error_at_the_agents_start_is_left_in_the_sessions_err_and_log_files(
    base: Path,
) -> None:
    """A flag the agent cannot read (before anything is redirected): the one line is on stderr
    and in ``runtime_env_agent.err`` and ``runtime_env_agent.log`` of Ray's --log-dir."""
    argv = [*_ray_2_51_flags(base), "--logging-rotate-bytes=many"]
    done = _agent(argv)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.count("\n") == 0, line
    assert "--logging-rotate-bytes" in line, line
    assert "'many' is not a whole number" in line, line
    logs = base / "session_1" / "logs"
    assert _text(logs / "runtime_env_agent.err") == f"{line}\n"
    assert _text(logs / "runtime_env_agent.log").endswith(f" ERROR {line}\n")
    assert not (base / "session_1" / "runtime_resources").exists(), "nothing was started"


def test_a_bad_setting_at_the_agents_start_is_left_once_in_the_err_file_and_in_the_log(
    base: Path,
) -> None:
    """A setting refused after Ray's stderr file took the agent's stderr: the line is in that
    file once (not twice) and in the log file."""
    done = _agent(_ray_2_51_flags(base), RTENV_LOG_LEVEL="loud")
    assert done.returncode == 2
    logs = base / "session_1" / "logs"
    err = _text(logs / "runtime_env_agent.err")
    assert err.count("\n") == 1, err
    assert "RTENV_LOG_LEVEL" in err, err
    assert err.startswith("rtenv-agent ray-agent: "), err
    assert _text(logs / "runtime_env_agent.log").endswith(f" ERROR {err}")


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("RAY_RUNTIME_ENV_PLUGINS", '[{"class": "no_such_module.Plugin"}]',
         "RAY_RUNTIME_ENV_PLUGINS: cannot import 'no_such_module.Plugin'"),
        ("RAY_RUNTIME_ENV_BEARER_TOKEN", "s3cr3t\nX-Injected: 1",
         "RAY_RUNTIME_ENV_BEARER_TOKEN (not shown) has a control character"),
        ("RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB", "lots",
         "RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB='lots' is not a size in GiB"),
    ],
)  # fmt: skip
def test_a_ray_variable_the_agent_cannot_honour_stops_its_start_saying_so_in_the_err_file(
    variable: str, value: str, said: str, base: Path
) -> None:
    """A plugin that cannot be loaded, a token no header can carry, a cache size that is no
    size: exit 2, the one line in ``runtime_env_agent.err`` and the log (a token never)."""
    done = _agent(_ray_2_51_flags(base), **{variable: value})
    assert done.returncode == 2, done.stderr
    logs = base / "session_1" / "logs"
    err = _text(logs / "runtime_env_agent.err")
    assert said in err, err
    assert err.count("\n") == 1, err
    assert _text(logs / "runtime_env_agent.log").endswith(f" ERROR {err}")
    assert "s3cr3t" not in err + _text(logs / "runtime_env_agent.log")


# The launcher with the installed Ray made to say another version, and Ray's CLI replaced by a
# stand-in that only says it ran: no node is ever started by this test.
_LAUNCHER = """
import sys
import ray
ray.__version__ = sys.argv[1]
from ray.scripts import scripts
def ran(*a, **kw):
    print("ray's cli ran", kw.get("args"))
    raise SystemExit(0)
scripts.cli.main = ran
from agent.launcher.main import main
sys.exit(main(["ray", *sys.argv[2:]]))
"""


def _launcher(version: str, *argv: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _LAUNCHER, version, *argv], cwd=REPO, capture_output=True,
        text=True, timeout=RAY_CLI_S, check=False, env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("version", "argv", "refused"),
    [("2.50.0", ["start", "--head"], True), ("2.10.0", ["start"], True),
     ("2.50.0", ["status", "--help"], False), ("2.51.1", ["start", "--head"], False)],
)  # fmt: skip
def test_ray_start_on_an_older_ray_refuses_by_name_before_rays_cli_runs(
    version: str, argv: list[str], refused: bool, base: Path
) -> None:
    """One line naming the version and the supported range, exit 2, Ray's CLI never run; Ray's
    other commands, and ray start on a supported Ray, run."""
    done = _launcher(version, *argv, f"--temp-dir={base}", tmp=base)
    if not refused:
        assert "ray's cli ran" in done.stdout, done.stderr
        return
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ray's cli ran" not in done.stdout
    assert done.stderr == (
        f"rtenv-agent ray: Ray '{version}' is not supported by runtime-env-agent: Ray 2.51.1 or "
        "later (nodes started on 2.51.1 to 2.60.0); not starting a node (plain ray start runs "
        "Ray's own agent)\n"
    )
    assert list(base.iterdir()) == []
