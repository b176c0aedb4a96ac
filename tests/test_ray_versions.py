"""The Ray releases this agent serves, pure: each release's flag set (read in its services.py)
parses, a raylet that passes no node id and no session dir (Ray 2.51 to 2.53) gets no port
file and its own socket, Ray's token rules by version, the supported range and what an older Ray
gets (Ray's own agent, one warning), and where a failed start is written."""

from __future__ import annotations

import ast
import logging
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from agent.ops import ray_flags, ray_swap
from agent.ops.ray_agent import settings_for
from agent.ops.ray_flags import Refused, failure_files, has_token_auth, parse_flags
from agent.ops.ray_swap import AGENT_FLAG, SUPPORTED_RAY, ray_version_problem, swap_agent_command

NODE = "62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777"
S = "/tmp/r/session_1"
# services.py's agent flags, release by release (stdout/stderr files as `ray start` adds them)
RAY_2_51 = [
    "--node-ip-address=127.0.0.2", "--runtime-env-agent-port=41349",
    "--gcs-address=127.0.0.2:6379", f"--cluster-id-hex={'e5' * 28}",
    f"--runtime-env-dir={S}/runtime_resources", "--logging-rotate-bytes=536870912",
    "--logging-rotate-backup-count=5", f"--log-dir={S}/logs", "--temp-dir=/tmp/r",
    f"--stdout-filepath={S}/logs/runtime_env_agent.out",
    f"--stderr-filepath={S}/logs/runtime_env_agent.err",
]  # fmt: skip
RAY_2_60 = [f"--node-id={NODE}", f"--session-dir={S}", *RAY_2_51]


def _settings(argv: list[str], **environ: str) -> object:
    return settings_for(
        parse_flags(argv), environ, lambda p: "", home=lambda: Path("/h"), getppid=lambda: 42
    )


def test_ray_2_51_flags_parse_with_no_port_file_and_the_port_as_the_node_key() -> None:
    """Ray 2.51 to 2.53 pass neither --node-id nor --session-dir: the raylet picked the port,
    so no port file is written, and the node's socket is named by that port."""
    flags = parse_flags(RAY_2_51)
    assert (flags.node_id, flags.session_dir, flags.port_file) == ("", None, None)
    assert flags.runtime_env_agent_port == 41349
    assert flags.node_key == "port41349"
    assert flags.unknown == ()
    settings = _settings(RAY_2_51)
    assert settings.ray is not None  # type: ignore[attr-defined]
    assert settings.ray.port_file is None  # type: ignore[attr-defined]
    assert settings.address.endswith("/agent-port41349.sock")  # type: ignore[attr-defined]


def test_ray_2_54_and_later_flags_parse_with_the_port_file_and_the_node_id() -> None:
    argv = [a if "agent-port" not in a else "--runtime-env-agent-port=0" for a in RAY_2_60]
    flags = parse_flags(argv)
    assert flags.port_file == Path(S) / f"runtime_env_agent_port_{NODE}"
    assert flags.node_key == NODE


@pytest.mark.parametrize("drop", ["--node-id=", "--session-dir="])
def test_a_node_id_without_a_session_dir_or_the_reverse_is_refused_naming_both(drop: str) -> None:
    argv = [a for a in RAY_2_60 if not a.startswith(drop)]
    with pytest.raises(Refused, match=r"a raylet passes both .* or neither"):
        parse_flags(argv)


def test_port_0_without_a_session_dir_is_refused_as_the_raylet_could_not_learn_the_port() -> None:
    argv = [a if "agent-port" not in a else "--runtime-env-agent-port=0" for a in RAY_2_51]
    with pytest.raises(Refused, match="is 0 with no --session-dir"):
        parse_flags(argv)


def test_ray_2_51_has_no_token_auth_so_ray_auth_mode_is_ignored_and_later_rays_need_it() -> None:
    """RAY_AUTH_MODE=token under a Ray 2.51 raylet (which sends no token) asks no token; under
    2.52 and later, or a Ray not named, the token is Ray's."""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t0k"}
    old = _settings([*RAY_2_51, "--ray-version=2.51.1"], **auth)
    assert old.ray.token is None  # type: ignore[attr-defined]
    for said in ("--ray-version=2.52.0", "--ray-version=2.60.0", "--ray-version=nightly"):
        assert _settings([*RAY_2_51, said], **auth).ray.token == "t0k"  # type: ignore[attr-defined]
    assert _settings(RAY_2_51, **auth).ray.token == "t0k"  # type: ignore[attr-defined]
    assert not has_token_auth(parse_flags([*RAY_2_51, "--ray-version", "2.51.2"]))


@pytest.mark.parametrize(
    ("text", "numbers"),
    [("2.51.1", (2, 51, 1)), ("2.60.0", (2, 60, 0)), ("2.52.0rc1", (2, 52, 0)),
     ("3.0.0.dev0", (3, 0, 0)), ("2.9", (2, 9)), ("nightly", None), ("", None), ("2", None)],
)  # fmt: skip
def test_a_ray_version_reads_as_its_numbers(text: str, numbers: tuple[int, ...] | None) -> None:
    assert ray_swap.ray_release(text) == numbers


def test_the_ray_version_rule_has_one_home_the_swap_which_ray_agent_uses() -> None:
    """ray_swap.py is copied where the agent is not, so it holds the rule and imports nothing;
    ``ray-agent``'s flags (``ray_flags``) use that very function, and no other module of the
    agent reads a version's numbers with a copy of it."""
    assert vars(ray_flags)["ray_release"] is ray_swap.ray_release
    agent = Path(ray_swap.__file__).resolve().parents[1]
    homes = [
        str(path.relative_to(agent))
        for path in sorted(agent.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and ".split('.')" in (body := ast.unparse(node))
        and ".isdigit()" in body
    ]
    assert homes == ["ops/ray_swap.py"], homes


def test_the_supported_range_starts_at_2_51_1_and_an_older_ray_is_named_with_the_range() -> None:
    assert SUPPORTED_RAY == ((2, 51, 1), (2, 60, 0))
    assert ray_version_problem("2.51.1") is None
    assert ray_version_problem("2.60.0") is None
    assert ray_version_problem("2.61.0") is None, "a later Ray is tried"
    assert ray_version_problem("") is None, "not known: the command's own check decides"
    assert ray_version_problem("2.50.1") == (
        "Ray '2.50.1' is not supported by runtime-env-agent: Ray 2.51.1 or later (nodes started "
        "on 2.51.1 to 2.60.0)"
    )


def _raylet(agent: list[str]) -> list[str]:
    return ["/ray/raylet", AGENT_FLAG + subprocess.list2cmdline(agent), "--head"]


RAY_MAIN = "/v/lib/python3.11/site-packages/ray/_private/runtime_env/agent/main.py"


def test_the_swap_passes_the_raylets_ray_version_to_the_agent() -> None:
    swapped = swap_agent_command(_raylet(["/v/bin/python", "-u", RAY_MAIN, *RAY_2_51]), "/p",
                                 ray_version="2.51.1")  # fmt: skip
    agent = shlex.split(swapped[1].removeprefix(AGENT_FLAG))
    assert agent == ["/p", "-u", "-I", "-m", "agent", "ray-agent", "--ray-version=2.51.1",
                     *RAY_2_51]  # fmt: skip
    assert parse_flags(agent[6:]).ray_version == "2.51.1"


@pytest.mark.parametrize(("version", "swapped"), [("2.50.0", False), ("2.51.1", True)])
def test_a_raylet_of_an_older_ray_runs_rays_own_agent_with_one_warning(
    version: str, swapped: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What install() and the switch (`rtenv-agent ray enable`) both do on a Ray older than the
    supported range: the raylet starts with Ray's own agent, and one warning names the version
    and the range; a supported Ray is swapped, silently."""
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(__version__=version))
    calls: list[list[str]] = []
    start = ray_swap.swapping(lambda command, kind: calls.append(command), sys.executable)
    argv = _raylet([sys.executable, "-u", RAY_MAIN, *RAY_2_51])
    with caplog.at_level(logging.WARNING, logger="agent.ray"):
        start(argv, "raylet")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if swapped:
        assert calls[0] != argv
        assert warnings == []
    else:
        assert calls == [argv]
        assert warnings == [
            f"agent.ray: this raylet runs Ray's own runtime env agent: Ray '{version}' is not "
            "supported by runtime-env-agent: Ray 2.51.1 or later (nodes started on 2.51.1 to "
            "2.60.0)"
        ]


def test_a_failed_start_is_written_to_rays_err_file_and_the_log_in_the_sessions_logs() -> None:
    logs = Path(S) / "logs"
    assert failure_files(RAY_2_51) == [
        logs / "runtime_env_agent.err",
        logs / "runtime_env_agent.log",
    ]
    no_std = [a for a in RAY_2_51 if "filepath" not in a]
    assert failure_files([*no_std, "--logging-filename", "x.log"]) == [
        logs / "runtime_env_agent.err", logs / "x.log"
    ]  # fmt: skip
    # flags too broken to name the log dir: the logs beside the session's runtime_resources
    only = [f"--runtime-env-dir={S}/runtime_resources", "--node-ip-address"]
    assert failure_files(only) == [logs / "runtime_env_agent.err", logs / "runtime_env_agent.log"]
    assert failure_files([f"--session-dir={S}"])[0] == logs / "runtime_env_agent.err"
    assert failure_files(["--what"]) == [], "nothing named: stderr only (the raylet's raylet.err)"


def test_ci_runs_the_ray_tests_on_the_oldest_supported_ray() -> None:
    """.ci/uvloop-pass's second venv pins the Ray this agent claims as its oldest."""
    pin = (Path(__file__).resolve().parents[1] / ".ci" / "ray-oldest.txt").read_text().strip()
    assert pin == "ray[default]==" + ".".join(map(str, SUPPORTED_RAY[0]))  # jobs, ray list
