"""The Ray switch's pure parts: the swap with the agent's own python and the root, Ray's socket
paths against AF_UNIX's limit and the warning, the ``.pth`` line, the default root, ``ray-agent
--root``; and the finder the ``.pth`` arms, on a stand-in for Ray's modules. ray_swap.py is copied
into environments where the agent is not (and user_hook.py into the per-user hook folder): they
import the standard library only and parse as Python 3.9. The per-user switch's startup-file
block (added once, removed to the byte), its config and its scope."""

from __future__ import annotations

import ast
import logging
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.launcher import switch, user_switch
from agent.launcher.ray_cli import announcement, start_warning
from agent.ops import ray_swap, user_hook
from agent.ops.ray_agent import agent_root, default_root
from agent.ops.ray_flags import Refused, parse_flags
from agent.ops.ray_swap import (
    AGENT_FLAG,
    Finder,
    longest_socket_path,
    ray_temp_dir,
    socket_path_warning,
    swap_agent_command,
)
from agent.ops.startup import MAX_UNIX_PATH_BYTES
from agent.ops.user_hook import Config, ConfigError, config_text, covers, parse_config

RAY_MAIN = "/venv/lib/python3.11/site-packages/ray/_private/runtime_env/agent/main.py"
FLAGS = [
    "--node-id=62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777",
    "--node-ip-address=127.0.0.1",
    "--runtime-env-agent-port=0",
    "--session-dir=/tmp/r/session_1",
    "--gcs-address=127.0.0.1:33337",
    "--cluster-id-hex=e5e266bae6d3c574950cad939fdb5dac2d17973d87b1580bf10452b7",
    "--runtime-env-dir=/tmp/r/session_1/runtime_resources",
    "--logging-rotate-bytes=536870912",
    "--logging-rotate-backup-count=5",
    "--log-dir=/tmp/r/session_1/logs",
    "--temp-dir=/tmp/r",
]


def _raylet(agent: list[str]) -> list[str]:
    return ["/ray/raylet", "--node_id=1", AGENT_FLAG + subprocess.list2cmdline(agent), "--head"]


def _agent(argv: list[str]) -> list[str]:
    (flag,) = [a for a in argv if a.startswith(AGENT_FLAG)]
    return shlex.split(flag.removeprefix(AGENT_FLAG))


# -- the swap with the agent's python and root -------------------------------------------


def test_the_switchs_swap_runs_the_agents_own_python_with_root_before_rays_flags() -> None:
    argv = _raylet(["/env/bin/python", "-u", RAY_MAIN, *FLAGS])
    swapped = swap_agent_command(argv, "/opt/agent/bin/python", "/data/my root")
    assert _agent(swapped) == [
        "/opt/agent/bin/python", "-u", "-I", "-m", "agent", "ray-agent",
        "--root=/data/my root", *FLAGS,
    ]  # fmt: skip
    assert swap_agent_command(swapped, "/other/python", "/other") == swapped, "idempotent"
    assert _agent(swap_agent_command(argv))[:2] == [sys.executable, "-u"], "default: this python"
    assert "--root=" not in " ".join(_agent(swap_agent_command(argv, "/p"))), "no root: no flag"


def test_the_root_flag_is_parsed_and_rtenv_root_wins_over_it() -> None:
    flags = parse_flags([*FLAGS, "--root=/data/root"])
    assert flags.root == Path("/data/root")
    assert flags.unknown == ()
    runtime = Path("/tmp/r/session_1/runtime_resources")
    assert agent_root(runtime, {}, flags.root) == Path("/data/root")
    assert agent_root(runtime, {"RTENV_ROOT": "/mine"}, flags.root) == Path("/mine")
    assert agent_root(runtime, {}, None) == runtime / "rtenv"
    with pytest.raises(Refused, match="--root: is empty"):
        parse_flags([*FLAGS, "--root="])


def test_the_announcement_names_the_switchs_root_and_the_info_command_by_full_path(
    tmp_path: Path,
) -> None:
    python = tmp_path / "agent venv" / "bin" / "python"
    argv = _raylet(["/env/bin/python", "-u", RAY_MAIN, *FLAGS])
    swapped = swap_agent_command(argv, str(python), "/data/my root")
    said = announcement(swapped, {})
    assert said.startswith("rtenv-agent ray: this node's runtime env agent is runtime-env-agent's")
    assert "its root: '/data/my root' (the Ray switch's, rtenv-agent ray enable); " in said
    no_script = shlex.join([str(python), "-m", "agent", "info", "--root", "/data/my root"])
    assert said.endswith(f"; what it holds: {no_script}"), "no rtenv-agent beside it: -m agent"
    script = python.parent / "rtenv-agent"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    said = ray_swap.announcement(swapped, {"RTENV_ROOT": "/x"}, "rtenv-agent")
    assert said.startswith("rtenv-agent: this node's runtime env agent")
    assert said.endswith(f"its root: '/x' (RTENV_ROOT); what it holds: '{script}' info --root /x")
    session = ray_swap.announcement(_raylet(["/p", "-u", RAY_MAIN, *FLAGS]), {}, "x")
    assert session.endswith(" --root /tmp/r/session_1/runtime_resources/rtenv"), session
    assert Path("/s") / ray_swap.SESSION_ROOT == default_root(Path("/s")), "the agent's own choice"
    odd = ray_swap.announcement(swapped, {"RTENV_ROOT": "/x\ny"}, "x")
    assert "\n" not in odd, "one line"


def test_the_switch_announces_once_per_process_as_its_first_raylet_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_swap, "_announced", [])
    calls: list[list[str]] = []
    announcing = ray_swap.swapping(
        lambda c, kind: calls.append(c), sys.executable, "/r", on_swap=ray_swap._announce_once
    )
    announcing(["/gcs_server"], "gcs_server")
    assert capsys.readouterr().err == "", "not for another process"
    argv = _raylet(["/env/bin/python", "-u", RAY_MAIN, *FLAGS])
    announcing(argv, "raylet")
    announcing(argv, "raylet")  # a second node of the same driver (a Cluster)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("rtenv-agent: this node's runtime env agent is runtime-env-agent's")
    assert "its root: '/r'" in line
    assert len(calls) == 3
    gone = ray_swap.swapping(
        lambda c, kind: None, "/gone/python", "/r", on_swap=ray_swap._announce_once
    )
    monkeypatch.setattr(ray_swap, "_announced", [])
    gone(argv, "raylet")
    assert "rtenv-agent: this node" not in capsys.readouterr().err, "Ray's agent: not said"


def test_a_switch_whose_agent_python_is_gone_starts_rays_own_agent_saying_why(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    calls: list[list[str]] = []
    start = ray_swap.swapping(lambda command, kind: calls.append(command), str(tmp_path / "gone"))
    argv = _raylet(["/env/bin/python", "-u", RAY_MAIN, *FLAGS])
    with caplog.at_level(logging.WARNING, logger="agent.ray"):
        start(argv, "raylet")
    assert calls == [argv]
    assert "the agent's python" in caplog.text
    assert "is gone (run rtenv-agent ray enable again, or disable)" in caplog.text


# -- Ray's socket paths ----------------------------------------------------------------------


def test_rays_temp_dir_is_the_flag_else_ray_tmpdir_else_tmpdir_else_tmp() -> None:
    assert ray_temp_dir("/t", {"RAY_TMPDIR": "/r"}) == "/t"
    assert ray_temp_dir(None, {"RAY_TMPDIR": "/r", "TMPDIR": "/x"}) == "/r/ray"
    assert ray_temp_dir(None, {"TMPDIR": "/x"}) == "/x/ray"
    assert ray_temp_dir(None, {}) == "/tmp/ray"


def test_the_longest_socket_path_is_plasma_stores_in_a_session_named_as_ray_names_it() -> None:
    import datetime

    path = longest_socket_path("/tmp/ray", 4194304)
    date = datetime.datetime(2026, 12, 4, 15, 6, 36, 1).strftime("%Y-%m-%d_%H-%M-%S_%f")
    real = f"/tmp/ray/session_{date}_4194304/sockets/plasma_store"  # as Ray's node.py
    assert len(path) == len(real)
    assert path.startswith("/tmp/ray/session_")
    assert path.endswith("_4194304/sockets/plasma_store")


def test_the_warning_comes_past_107_bytes_naming_the_limit_and_the_fix() -> None:
    assert ray_swap.MAX_UNIX_PATH_BYTES == MAX_UNIX_PATH_BYTES
    base = longest_socket_path("/", 1)
    fits = longest_socket_path("/" + "a" * (106 - len(base)), 1)
    assert len(fits) == 107
    assert socket_path_warning(fits) is None
    over = longest_socket_path("/" + "a" * (107 - len(base)), 1)
    said = socket_path_warning(over)
    assert said is not None
    assert "is 108 bytes, over the 107-byte limit" in said
    for fix in ("RAY_TMPDIR", "--temp-dir", "RTENV_ROOT", "rtenv-agent ray enable --root"):
        assert fix in said, fix
    wide = longest_socket_path("/" + "é" * 30, 1)  # 60 bytes in 30 characters
    assert len(wide) < 107 < len(wide.encode())
    assert socket_path_warning(wide) is not None, "bytes, not characters"


def test_the_launcher_warns_for_ray_starts_temp_dir_or_rays_default() -> None:
    long_dir = "/data/" + "x" * 80
    assert start_warning(["--head", "--temp-dir", long_dir], {}) is not None
    assert start_warning(["--head", f"--temp-dir={long_dir}"], {}) is not None
    assert start_warning(["--head"], {"RAY_TMPDIR": long_dir}) is not None
    assert start_warning(["--head", "--temp-dir", "/tmp/r"], {"RAY_TMPDIR": long_dir}) is None
    assert start_warning(["--head"], {}) is None


# -- the .pth line, the default root, ray_swap.py's imports -----------------------------------


@pytest.mark.parametrize("path", ["/opt/a b/python", '/x/it\'s\n"odd"/é', "/x/\udcff"])
def test_the_pth_line_is_ascii_and_reads_back(path: str) -> None:
    text = switch.pth_line(path, path + "/root")
    assert text.isascii()
    (line,) = [x for x in text.splitlines() if x.startswith("import ")]
    assert line.startswith("import _rtenv_agent_switch; _rtenv_agent_switch.arm(")
    assert switch.read_pth(text) == (path, path + "/root")
    assert switch.read_pth("import os\n") is None
    assert switch.read_pth("# nothing\n") is None


def test_python_is_a_path_as_given_or_a_bare_name_found_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    link = tmp_path / "venv-python"
    link.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert switch.python_path("venv-python") == str(link), "not on PATH: relative to here"
    assert switch.python_path("./venv-python") == str(link), "a link is not resolved"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert switch.python_path("venv-python") == str(link)


def _imports(python: str) -> str | None:
    """``switch.agent_location`` without a process: this agent, for this python only."""
    return "/agent/__init__.py" if python == sys.executable else None


def test_enabled_is_1_when_the_switch_is_on_but_its_nodes_would_not_run_this_agent(
    tmp_path: Path,
) -> None:
    on = switch.Target("/env/bin/python", tmp_path, (3, 11, 7), True, "2.60.0", armed=True)
    assert switch.status(on, _imports)[0] == 1, "off: no .pth"
    on.module.write_text(switch.module_text())
    on.pth.write_text(switch.pth_line(sys.executable, "/data/root"))
    code, lines = switch.status(on, _imports)
    assert code == 0
    assert lines[1:] == [
        f"  agent python: {sys.executable}",
        "  root: /data/root (RTENV_ROOT, where set, wins)",
    ]
    cases = [
        (replace(on, armed=False, stderr="'boom'"), "does not arm it at start (its start said:"),
        (replace(on, ray_version="2.40.0"), "Ray '2.40.0' is not supported by runtime-env-agent"),
    ]
    for target, said in cases:
        code, lines = switch.status(target, _imports)
        assert code == 1, target
        assert said in lines[0], lines
        assert lines[0].startswith("rtenv-agent ray: on for /env/bin/python, but not in effect: ")
        assert lines[-1].startswith("  fix: "), lines
        assert "ray enable --python /env/bin/python --root /data/root (or disable)" in lines[-1]
    on.pth.write_text(switch.pth_line(str(tmp_path / "gone"), "/data/root"))
    code, lines = switch.status(on, _imports)
    assert code == 1, "the agent python is gone: Ray's agent runs"
    assert (
        f"the agent python {tmp_path / 'gone'} is gone: the Ray nodes it starts run Ray's"
        in (lines[0])
    )
    on.pth.write_text(switch.pth_line("/bin/sh", "/data/root"))  # runs, has no agent
    code, lines = switch.status(on, _imports)
    assert code == 1
    assert "cannot import the agent isolated" in lines[0]
    on.pth.write_text(switch.pth_line(sys.executable, "/data/root"))
    on.module.write_text("# an older switch\n")
    code, lines = switch.status(replace(on, has_ray=False, ray_version=""), _imports)
    assert code == 0
    assert "not this agent's version: run enable again" in lines[3]
    assert "ray is not importable" in lines[4]
    on.pth.write_text("import os\n")
    assert switch.status(on, _imports)[0] == 1, "a .pth enable did not write is no switch"


def test_the_default_root_is_per_user_in_the_cache_folder() -> None:
    home = Path("/home/u")
    assert switch.default_root({}, home) == home / ".cache/rtenv-agent/root"
    assert switch.default_root({"XDG_CACHE_HOME": "/c"}, home) == Path("/c/rtenv-agent/root")
    assert switch.default_root({"XDG_CACHE_HOME": "rel"}, home) == home / ".cache/rtenv-agent/root"
    with pytest.raises(switch.SwitchError, match="pass --root"):
        switch.default_root({}, None)


@pytest.mark.parametrize("module", [ray_swap, user_hook])
def test_the_hook_imports_the_standard_library_only_and_parses_as_python_3_9(module: Any) -> None:
    source = Path(module.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative import"
            imported.add((node.module or "").split(".")[0])
    assert imported
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    if module is ray_swap:
        assert switch.module_text().endswith(source), "enable copies it as it is"
    ast.parse(user_hook.SHIM, feature_version=(3, 4))  # the sitecustomize every Python reads


@pytest.mark.parametrize("text", ["", "alias ll='ls -l'", "x=1\n", "x=1\n\n", "# >>> x\n"])
def test_the_startup_block_is_added_once_and_removed_to_the_byte(text: str) -> None:
    lines = user_switch.block(Path("/h/.local/share/rtenv-agent/switch"), "rtenv-agent ray ...")
    added, newline = user_switch.with_block(text, lines)
    assert added.endswith(lines)
    assert newline == (text != "" and not text.endswith("\n"))
    assert user_switch.with_block(added, lines) == (added, False), "once"
    assert user_switch.without_block(added, newline) == text


def test_the_startup_block_puts_the_folder_first_on_pythonpath_once_in_sh() -> None:
    lines = user_switch.block(Path("/h/a b"), "undo")
    twice = f'PYTHONPATH=/x\n{lines}{lines}echo "$PYTHONPATH"\n'
    done = subprocess.run(["sh", "-c", twice], capture_output=True, text=True, timeout=30)
    assert done.stdout == "/h/a b:/x\n"


def test_the_config_reads_back_and_a_broken_one_is_an_error_saying_what() -> None:
    for config in (Config("/a/python", "/r", None), Config("/a/python", "/r", ("/p", "/q"))):
        assert parse_config(config_text(config)) == config
    for text, said in [
        ("python=/a\nroot=/r\n", "not both"),
        ("python=/a\nroot=/r\nscope=all\nproject=/p\n", "not both"),
        ("python=a\nroot=/r\nscope=all\n", "absolute"),
        ("python=/a\nroot=/r\nscope=some\n", "line 3"),
        ("garbage\n", "line 1 is not key=value"),
    ]:
        with pytest.raises(ConfigError, match=said):
            parse_config(text)


def test_a_project_covers_the_environments_inside_it_and_no_sibling() -> None:
    config = Config("/a/python", "/r", ("/w/proj",))
    assert covers(config, "/w/proj/.venv")
    assert covers(config, "/w/proj")
    assert not covers(config, "/w/proj2/.venv"), "a name that starts alike"
    assert covers(config, "/link/.venv", "/w/proj/.venv"), "reached through a link"
    assert covers(Config("/a/python", "/r", None), "/anywhere")
    assert not covers(Config("/agent/bin/python", "/r", None), "/agent"), "the agent's own"


# -- the finder, on a stand-in for Ray's modules ---------------------------------------------


@pytest.fixture
def fake_ray(tmp_path: Path) -> Iterator[Path]:
    """A package ``fakeray`` whose ``services`` and ``node`` look like Ray's where the switch
    touches them; removed from sys.modules and sys.path afterwards."""
    package = tmp_path / "fakeray"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "services.py").write_text(
        "CALLS = []\n"
        "def start_ray_process(command, process_type, *a, **kw):\n"
        "    CALLS.append((process_type, list(command)))\n"
    )
    (package / "node.py").write_text(
        "class Node:\n"
        "    def __init__(self, sockets):\n"
        "        self._sockets_dir = sockets\n"
        "    def _prepare_socket_file(self, socket_path, default_prefix):\n"
        "        return socket_path or self._sockets_dir + '/' + default_prefix\n"
    )
    (package / "other.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == "fakeray"]:
            del sys.modules[name]


def _finder(python: str, root: str) -> Finder:
    return Finder({
        "fakeray.services": lambda m: ray_swap._patch_services(m, python, root),
        "fakeray.node": ray_swap._patch_node,
    })  # fmt: skip


def test_the_finder_patches_rays_modules_as_they_load_and_nothing_else(
    fake_ray: Path, caplog: pytest.LogCaptureFixture
) -> None:
    finder = _finder(sys.executable, "/data/root")
    sys.meta_path.insert(0, finder)
    try:
        assert finder.find_spec("json") is None, "any other module: not its business"
        import fakeray.other  # type: ignore[import-not-found]

        assert fakeray.other.VALUE == 1
        import fakeray.services  # type: ignore[import-not-found]

        argv = _raylet(["/env/bin/python", "-u", RAY_MAIN, *FLAGS])
        fakeray.services.start_ray_process(argv, "raylet")
        fakeray.services.start_ray_process(argv, "gcs_server")
        ray_version = ray_swap.running_ray_version()  # the ray imported here, if any
        swapped = swap_agent_command(argv, sys.executable, "/data/root", ray_version)
        assert [("raylet", swapped), ("gcs_server", argv)] == fakeray.services.CALLS
        assert fakeray.services.__spec__.loader.is_package("fakeray.services") is False
        import fakeray.node  # type: ignore[import-not-found]

        with caplog.at_level(logging.WARNING, logger="agent.ray"):
            short = fakeray.node.Node("/tmp/ray/session_1/sockets")
            assert short._prepare_socket_file(None, "plasma_store").endswith("/plasma_store")
            assert caplog.records == []
            deep = fakeray.node.Node("/data/" + "x" * 100 + "/sockets")
            deep._prepare_socket_file(None, "plasma_store")
        (record,) = caplog.records
        assert "over the 107-byte limit" in record.getMessage()
    finally:
        sys.meta_path.remove(finder)


def test_arm_patches_a_module_loaded_before_it_once_and_never_raises(
    fake_ray: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import fakeray.services

    original = fakeray.services.start_ray_process
    ray_swap._patch_services(fakeray.services, "/p", None)
    ray_swap._patch_services(fakeray.services, "/q", None)  # a second switch: left as it is
    assert fakeray.services.start_ray_process.__wrapped__ is original
    monkeypatch.setattr(sys, "meta_path", None)  # anything arm() touches that breaks
    ray_swap.arm("/p", "/r")
    assert "the Ray switch is not armed" in capsys.readouterr().err


def test_a_patch_that_fails_is_a_warning_and_the_module_still_loads(
    fake_ray: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(module: Any) -> None:
        raise RuntimeError("boom")

    finder = Finder({"fakeray.other": broken})
    sys.meta_path.insert(0, finder)
    try:
        with caplog.at_level(logging.WARNING, logger="agent.ray"):
            import fakeray.other

        assert fakeray.other.VALUE == 1
        assert "could not patch fakeray.other" in caplog.text
    finally:
        sys.meta_path.remove(finder)
