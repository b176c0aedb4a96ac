"""``rtenv-agent ray-agent``: Ray's agent flags in, the agent's settings out; and the process as a
raylet starts it (a fake raylet: a process of ours whose pid is in RAY_RAYLET_PID)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import logging.handlers
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.app.config import Settings
from agent.core.errors import ConfigError
from agent.ops import keeper, logs, loops, ray_agent
from agent.ops.ray_agent import settings_for
from agent.ops.ray_flags import RayFlags, Refused, parse_flags
from agent.ops.ray_token import ray_token, read_token_file
from rtenv.ray.v1 import runtime_env_agent_pb2
from tests.harness.agent_process import REPO, START_S, STOP_S, stop
from tests.harness.polling import wait_until

NODE = "62ced19539cdea1adcecd63ef7e1c7b82d82375a6651551ce7511777"  # a node id as Ray writes it


def ray_flags(
    base: Path, *, port: int = 0, equals: bool = True, more: Mapping[str, str] | None = None
) -> list[str]:
    """The flags Ray 2.60's services.py passes (both spellings), plus ``more``."""
    values = {
        "node-id": NODE,
        "node-ip-address": "127.0.0.1",
        "runtime-env-agent-port": str(port),
        "session-dir": str(base / "s"),
        "gcs-address": "127.0.0.1:1",
        "cluster-id-hex": "e5e266bae6d3c574950cad939fdb5dac2d17973d87b1580bf10452b7",
        "runtime-env-dir": str(base / "s" / "runtime_resources"),
        "logging-rotate-bytes": "536870912",
        "logging-rotate-backup-count": "5",
        "log-dir": str(base / "s" / "logs"),
        "temp-dir": str(base),
        **(more or {}),
    }
    out: list[str] = []
    for name, value in values.items():
        out.extend([f"--{name}={value}"] if equals else [f"--{name}", value])
    return out


def _no_read(path: Path) -> str:
    raise AssertionError(f"no file should be read, but {path} was")


def _settings(flags: RayFlags, environ: Mapping[str, str]) -> Settings:
    return settings_for(
        flags, environ, _no_read, home=lambda: Path("/nonexistent"), getppid=lambda: 4242
    )


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The root logger as it was, and no writer thread left, after a test that configures it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        logs.shutdown()
        root.handlers[:] = handlers
        root.setLevel(level)


# -- flags and settings (pure) ---------------------------------------------------------------


@pytest.mark.parametrize("equals", [True, False])
def test_every_flag_of_rays_agent_parses_in_both_spellings(equals: bool) -> None:
    base = Path("/b")
    flags = parse_flags(
        ray_flags(
            base, port=4567, equals=equals,
            more={"stdout-filepath": "/b/o", "stderr-filepath": "/b/e", "logging-filename": "x.log",
               "logging-format": "%(asctime)s\t%(levelname)s (runtime_env_agent) %(message)s"},
        )
    )  # fmt: skip
    assert flags.node_id == NODE
    assert flags.node_ip_address == "127.0.0.1"
    assert flags.runtime_env_agent_port == 4567
    assert flags.session_dir == Path("/b/s")
    assert flags.gcs_address == "127.0.0.1:1"
    assert flags.cluster_id_hex.startswith("e5e266")
    assert flags.runtime_env_dir == Path("/b/s/runtime_resources")
    assert (flags.logging_rotate_bytes, flags.logging_rotate_backup_count) == (536870912, 5)
    assert flags.log_dir == Path("/b/s/logs")
    assert flags.temp_dir == base
    assert (flags.stdout_filepath, flags.stderr_filepath) == ("/b/o", "/b/e")
    assert flags.logging_filename == "x.log"
    assert flags.logging_format.startswith("%(asctime)s\t")
    assert flags.unknown == ()


def test_unknown_flags_are_kept_aside_not_refused() -> None:
    flags = parse_flags([*ray_flags(Path("/b")), "--a-new-ray-flag=1", "--other", "v"])
    assert flags.unknown == ("--a-new-ray-flag=1", "--other", "v")
    assert flags.logging_filename == "runtime_env_agent.log"  # Ray's default


@pytest.mark.parametrize(
    ("drop", "said"),
    [("session-dir", "--session-dir"), ("node-id", "--node-id"),
     ("logging-rotate-bytes", "--logging-rotate-bytes")],
)  # fmt: skip
def test_a_missing_required_flag_is_refused_by_name(drop: str, said: str) -> None:
    argv = [a for a in ray_flags(Path("/b")) if not a.startswith(f"--{drop}=")]
    with pytest.raises(Refused, match=said):
        parse_flags(argv)


def test_a_bad_port_or_a_node_id_that_is_not_a_file_name_is_refused() -> None:
    with pytest.raises(Refused, match="not a port"):
        parse_flags(ray_flags(Path("/b"), port=70000))
    with pytest.raises(Refused, match="--node-id"):
        parse_flags(ray_flags(Path("/b"), more={"node-id": "../x"}))


def test_settings_take_rays_flags_for_the_ray_door_the_root_and_the_parent() -> None:
    flags = parse_flags(ray_flags(Path("/b"), port=4567))
    s = _settings(flags, {})
    assert s.root == Path("/b/s/runtime_resources/rtenv")
    assert s.address == f"unix:/b/s/runtime_resources/rtenv/agent-{NODE[:16]}.sock"
    assert s.allow_remote is True
    assert s.parent_pid == 4242  # the parent, the raylet
    assert s.ray is not None
    assert (s.ray.host, s.ray.port) == ("127.0.0.1", 4567)
    assert s.ray.port_file == Path(f"/b/s/runtime_env_agent_port_{NODE}")
    assert (s.ray.gcs_address, s.ray.node_id) == ("127.0.0.1:1", NODE)
    assert s.ray.cluster_id_hex == flags.cluster_id_hex
    assert s.ray.token is None


def test_rtenv_root_and_the_options_table_come_from_the_environment() -> None:
    flags = parse_flags(ray_flags(Path("/b")))
    s = _settings(
        flags,
        {"RTENV_ROOT": "/keep/cache", "RTENV_CACHE_BUDGET": "1GiB", "RAY_RAYLET_PID": "777",
         "RTENV_LOG_LEVEL": "debug"},
    )  # fmt: skip
    assert s.root == Path("/keep/cache")
    assert s.address == f"unix:/keep/cache/agent-{NODE[:16]}.sock"
    assert s.cache_budget_bytes == 1024**3
    assert s.parent_pid == 4242  # the real parent, whatever RAY_RAYLET_PID says (Ray's rule)
    assert s.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("more", "environ", "root"),
    [({}, {}, "/b/s/runtime_resources/rtenv"),
     ({"root": "/shared"}, {}, "/shared"),  # the Ray switch's root
     ({}, {"RTENV_ROOT": "/keep/cache"}, "/keep/cache")],
    ids=["session-root", "switch-root", "rtenv-root"],
)  # fmt: skip
def test_rays_folders_are_the_nodes_own_whatever_the_root(
    more: dict[str, str], environ: dict[str, str], root: str
) -> None:
    """Under Ray, the agent fills the node's Ray folders (``runtime_resources``) whether its
    root is the session's or shared by many nodes (issue 40)."""
    s = _settings(parse_flags(ray_flags(Path("/b"), more=more)), environ)
    assert s.root == Path(root)
    assert s.ray_folders == Path("/b/s/runtime_resources")


def test_the_parent_is_the_real_parent_and_a_parent_of_1_means_the_raylet_is_gone() -> None:
    assert ray_agent.parent_pid(lambda: 4242) == 4242
    with pytest.raises(ConfigError, match="already gone"):
        ray_agent.parent_pid(lambda: 1)
    note = ray_agent.raylet_pid_note({"RAY_RAYLET_PID": "777"}, 4242)
    assert note is not None
    assert "777" in note
    assert "4242" in note
    assert ray_agent.raylet_pid_note({"RAY_RAYLET_PID": "4242"}, 4242) is None
    assert ray_agent.raylet_pid_note({}, 4242) is None
    flags = parse_flags(ray_flags(Path("/b")))
    with pytest.raises(ConfigError, match="already gone"):
        settings_for(flags, {}, _no_read, getppid=lambda: 1)


def test_the_keepers_end_is_the_nodes_normal_end_and_a_raylet_gone_first_is_a_warning() -> None:
    """The raylet kills the keeper only as it stops; seen after the keeper's (the agent then has
    another parent) the raylet's end is that same end; a raylet gone first was killed."""
    keeper_pid, raylet = 500, 400
    level, line = keeper.end_line("keeper", keeper_pid, keeper_pid, parent_now=1)
    assert (level, line) == (
        logging.INFO,
        "keeper 500 exited (the raylet ends its agent so when its node stops); shutting down",
    )
    assert keeper.end_line("parent", raylet, keeper_pid, parent_now=1)[0] == logging.INFO, (
        "woke second"
    )
    level, line = keeper.end_line("parent", raylet, keeper_pid, parent_now=keeper_pid)
    assert level == logging.WARNING
    assert line.startswith("parent 400 exited without ending its agent first (killed")
    no_keeper = keeper.end_line("parent", raylet, None, parent_now=raylet)  # serve --parent-pid
    assert no_keeper == (logging.WARNING, "parent 400 exited; shutting down")


def test_the_config_file_is_read_and_rtenv_address_wins_over_the_socket_in_the_root(
    tmp_path: Path,
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('max_uris = 7\naddress = "unix:/elsewhere/a.sock"\n')
    flags = parse_flags([*ray_flags(Path("/b")), f"--config={config}"])
    s = settings_for(flags, {}, lambda p: p.read_text(), home=lambda: tmp_path)
    assert s.env.max_uris == 7
    assert s.address == "unix:/elsewhere/a.sock"
    env = {"RTENV_ADDRESS": "unix:/env/b.sock", "RTENV_ROOT": "/shared"}
    assert _settings(parse_flags(ray_flags(Path("/b"))), env).address == "unix:/env/b.sock"


def test_two_nodes_sharing_a_root_get_a_socket_each_named_by_their_node_id() -> None:
    """Several Ray nodes on one machine may share RTENV_ROOT: one socket per node, not one per
    root (the second agent would take the first's socket)."""
    other_node = "a" * 56
    env = {"RTENV_ROOT": "/shared/root"}
    one = _settings(parse_flags(ray_flags(Path("/b"))), env)
    two = _settings(parse_flags(ray_flags(Path("/c"), more={"node-id": other_node})), env)
    assert one.root == two.root == Path("/shared/root")
    assert one.address == f"unix:/shared/root/agent-{NODE[:16]}.sock"
    assert two.address == "unix:/shared/root/agent-aaaaaaaaaaaaaaaa.sock"
    long_root = "/t/" + "d" * 120
    env = {"RTENV_ROOT": long_root}
    one = _settings(parse_flags(ray_flags(Path("/b"))), env)
    two = _settings(parse_flags(ray_flags(Path("/b"), more={"node-id": other_node})), env)
    assert one.address != two.address  # the short fallback too: a folder and a socket per node
    assert Path(one.address).parent != Path(two.address).parent
    assert one.address.endswith(f"/agent-{NODE[:16]}.sock")
    assert two.address.endswith("/agent-aaaaaaaaaaaaaaaa.sock")


def test_a_root_too_long_for_a_unix_socket_gets_a_short_socket_and_still_starts() -> None:
    long_dir = Path("/t") / ("d" * 120)
    flags = parse_flags(ray_flags(Path("/b"), more={"runtime-env-dir": str(long_dir)}))
    s = _settings(flags, {})
    assert s.root == long_dir / "rtenv"
    path = s.address.removeprefix("unix:")
    assert len(os.fsencode(path)) <= 107
    assert path.endswith(f"/agent-{NODE[:16]}.sock")
    assert _settings(flags, {}).address == s.address  # one root and node, one socket
    other = parse_flags(ray_flags(Path("/b"), more={"runtime-env-dir": str(long_dir) + "x"}))
    assert _settings(other, {}).address != s.address


def test_the_short_socket_is_under_rays_temp_dir() -> None:
    long_dir = Path("/t") / ("d" * 120)
    flags = parse_flags(ray_flags(Path("/rt"), more={"runtime-env-dir": str(long_dir)}))
    assert _settings(flags, {}).address.startswith("unix:/rt/rtenv-")


def test_a_socket_folder_made_by_someone_else_or_open_to_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "rtenv-x"
    assert ray_agent.claim_socket_folder(folder) is True
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert ray_agent.claim_socket_folder(folder) is False  # ours already: used, not made
    os.chmod(folder, 0o755)
    with pytest.raises(ConfigError, match="mode 0700"):
        ray_agent.claim_socket_folder(folder)
    os.chmod(folder, 0o700)
    if os.geteuid() == 0:  # only root can give a folder away
        os.chown(folder, 4321, -1)
        with pytest.raises(ConfigError, match="someone else"):
            ray_agent.claim_socket_folder(folder)
    os.rmdir(folder)
    folder.write_text("")
    with pytest.raises(ConfigError, match="not a folder"):
        ray_agent.claim_socket_folder(folder)


@pytest.mark.parametrize(
    ("more", "said"),
    [
        ({"gcs-address": ""}, "--gcs-address is empty"),
        ({"gcs-address": "gcs-host"}, "must be HOST:PORT"),
        ({"cluster-id-hex": "not hex"}, "must be hex"),
        ({"logging-filename": "../x.log"}, "a file name in --log-dir"),
        ({"logging-filename": "a/x.log"}, "a file name in --log-dir"),
        ({"logging-filename": ".."}, "a file name in --log-dir"),
    ],
)
def test_a_malformed_gcs_address_or_log_file_name_is_refused_by_the_flags(
    more: dict[str, str], said: str
) -> None:
    with pytest.raises(Refused, match=said):
        parse_flags(ray_flags(Path("/b"), more=more))


def test_rays_tls_mode_is_refused_naming_tls() -> None:
    flags = parse_flags(ray_flags(Path("/b")))
    for on in ("1", "true", "TRUE"):
        with pytest.raises(ConfigError, match=r"RAY_USE_TLS .*TLS mode is not supported"):
            _settings(flags, {"RAY_USE_TLS": on})
    assert _settings(flags, {"RAY_USE_TLS": "0"}).ray is not None


def test_a_log_dir_that_is_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("")
    flags = parse_flags(ray_flags(tmp_path, more={"log-dir": str(tmp_path / "logs")}))
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        ray_agent.log_handler(flags)


def test_rays_logging_level_wins_over_the_setting() -> None:
    flags = parse_flags([*ray_flags(Path("/b")), "--logging-level=warning"])
    assert _settings(flags, {"RTENV_LOG_LEVEL": "DEBUG"}).log_level == "WARNING"


# -- the token -------------------------------------------------------------------------------


def test_no_token_when_rays_token_auth_is_off() -> None:
    assert ray_token({"RAY_AUTH_TOKEN": "t"}, _no_home, _no_read) is None


def _no_home() -> Path:
    raise RuntimeError("Could not determine home directory.")


def test_the_home_folder_is_looked_up_only_for_the_default_token_file() -> None:
    flags = parse_flags(ray_flags(Path("/b")))
    on = {"RAY_AUTH_MODE": "token"}
    assert settings_for(flags, {}, _no_read, home=_no_home, getppid=lambda: 9).ray is not None
    s = settings_for(
        flags, {**on, "RAY_AUTH_TOKEN": "t"}, _no_read, home=_no_home, getppid=lambda: 9
    )
    assert s.ray is not None
    assert s.ray.token == "t"
    with pytest.raises(ConfigError, match="no home folder"):
        ray_token(on, _no_home, _no_read)


def test_under_ray_downloads_carry_rays_headers_and_a_bad_one_stops_the_start() -> None:
    flags = parse_flags(ray_flags(Path("/b")))
    s = _settings(flags, {"RAY_RUNTIME_ENV_BEARER_TOKEN": "tk"})
    assert dict(s.http_headers) == {
        "User-Agent": "ray-runtime-env-curl/1.0",
        "Authorization": "Bearer tk",
    }
    with pytest.raises(ConfigError, match="RAY_RUNTIME_ENV_HTTP_USER_AGENT"):
        _settings(flags, {"RAY_RUNTIME_ENV_HTTP_USER_AGENT": "a\nb"})


def test_prepare_with_no_home_folder_starts_when_token_auth_is_off(
    base: Path, monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    """No HOME and no passwd entry: Path.home() raises; only the token's default file needs it."""
    monkeypatch.setattr(Path, "home", _no_home)
    prepared = ray_agent.prepare(ray_flags(base), {})
    prepared.cleanup()
    with pytest.raises(ConfigError, match="no home folder"):
        ray_agent.prepare(ray_flags(base), {"RAY_AUTH_MODE": "token"})


def test_a_token_path_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        read = pool.submit(read_token_file, fifo)
        try:
            with pytest.raises(ConfigError, match="not a regular file"):
                read.result(timeout=5)
        finally:
            if not read.done():  # a reader blocked in open: a writer lets it go
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_the_token_comes_from_the_variable_then_the_named_file_then_the_home_file(
    tmp_path: Path,
) -> None:
    named, home = tmp_path / "named", tmp_path / "home"
    named.write_text("  from-named\n")
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    on = {"RAY_AUTH_MODE": "token"}

    def read(p: Path) -> str:
        return p.read_text()

    both = {**on, "RAY_AUTH_TOKEN": " from-var ", "RAY_AUTH_TOKEN_PATH": str(named)}
    assert ray_token(both, lambda: home, read) == "from-var"
    named_on = {**on, "RAY_AUTH_TOKEN_PATH": str(named)}
    assert ray_token(named_on, lambda: home, read) == "from-named"
    assert ray_token(on, lambda: home, read) == "from-home"
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN_PATH"):
        ray_token({**on, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}, lambda: home, read)
    (home / ".ray" / "auth_token").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        ray_token(on, lambda: home, read)


def test_the_settings_carry_rays_token() -> None:
    flags = parse_flags(ray_flags(Path("/b")))
    s = _settings(flags, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "sekrit"})
    assert s.ray is not None
    assert s.ray.token == "sekrit"


# -- logs ------------------------------------------------------------------------------------


def test_logs_go_to_rays_file_rotated_as_ray_says_or_to_stderr_when_it_names_none() -> None:
    flags = parse_flags(ray_flags(Path("/nonexistent-root-for-test")))
    flags = RayFlags(**{**vars(flags), "logging_filename": ""})
    handler = ray_agent.log_handler(flags)
    assert type(handler) is logging.StreamHandler
    assert handler.stream is sys.stderr


def test_the_log_file_handler_rotates_at_rays_size_and_count(tmp_path: Path) -> None:
    argv = ray_flags(
        tmp_path, more={"logging-rotate-bytes": "1000", "logging-rotate-backup-count": "3"}
    )
    handler = ray_agent.log_handler(parse_flags(argv))
    try:
        assert isinstance(handler, logging.handlers.RotatingFileHandler)
        assert Path(handler.baseFilename) == tmp_path / "s" / "logs" / "runtime_env_agent.log"
        assert (handler.maxBytes, handler.backupCount) == (1000, 3)
    finally:
        handler.close()


def test_the_log_is_written_by_a_thread_through_a_queue_and_flushed_at_shutdown(
    tmp_path: Path, restore_logging: None
) -> None:
    path = tmp_path / "a.log"
    logs.configure("INFO", "text", handler=logging.FileHandler(path), threaded=True)
    (front,) = logging.getLogger().handlers
    assert isinstance(front, logging.handlers.QueueHandler)
    logging.getLogger("t").info("one %s", "line")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("t").exception("failed")
    logs.shutdown()
    text = path.read_text()
    assert "one line" in text
    assert "ValueError: boom" in text  # the traceback crosses the queue


def test_a_bad_logging_format_is_refused_at_configure(restore_logging: None) -> None:
    for bad in ("%(no_such_field)s", "%(message"):
        with pytest.raises(ValueError, match="is not a Python logging format"):
            logs.configure("INFO", "text", text_format=bad)


# -- the process -----------------------------------------------------------------------------


def _environ(**extra: str) -> dict[str, str]:
    """Our environment without settings of ours or Ray's that would change what is tested (the
    session's event loop kept: RTENV_EVENT_LOOP)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTENV_", "RAY_AUTH", "RAY_RAY")) or k == loops.ENV
    }
    return {**env, **extra}


async def _run(args: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "ray-agent", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO, env=dict(env),
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), START_S)
    finally:
        await stop(proc)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_a_missing_flag_is_one_line_and_exit_2(base: Path) -> None:
    argv = [a for a in ray_flags(base) if not a.startswith("--gcs-address")]
    code, err = await _run(argv, _environ())
    assert code == 2
    assert err.strip().count("\n") == 0, err
    assert err.startswith("rtenv-agent ray-agent: "), err
    assert "--gcs-address" in err, err


async def test_token_auth_on_and_no_token_is_one_line_and_exit_2(base: Path) -> None:
    env = _environ(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(base / "no-such-token"))
    code, err = await _run(ray_flags(base), env)
    assert code == 2
    assert err.strip().count("\n") == 0, err
    assert "no-such-token" in err, err
    assert not (base / "s" / "runtime_resources").exists()  # refused before the root is made


async def test_a_busy_agent_port_is_one_line_in_words_and_the_root_is_never_made(
    base: Path,
) -> None:
    """asyncio's bind error showed the address as a tuple (``('127.0.0.1', 18765)``)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = await _run(ray_flags(base, port=port), _environ())
    assert code == 2, err
    assert err == (
        f"rtenv-agent ray-agent: cannot listen on 127.0.0.1:{port} (--runtime-env-agent-port): "
        "Address already in use; another process listens there; choose another port (0 picks "
        "a free one)\n"
    )
    assert not (base / "s" / "runtime_resources").exists()
    assert not (base / "s" / f"runtime_env_agent_port_{NODE}").exists()


async def _fake_raylet() -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec("sleep", "120")


# A raylet as far as fate sharing goes: the agent's real parent, which starts it and waits.
_RAYLET = """
import subprocess, sys
agent = subprocess.Popen(
    [sys.executable, "-u", "-m", "agent", "ray-agent", *sys.argv[1:]],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(agent.pid, flush=True)
agent.wait()
"""


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet (its parent was killed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def test_as_a_raylet_starts_it_it_logs_where_ray_reads_and_dies_with_the_raylet(
    base: Path,
) -> None:
    """The raylet is the agent's real parent; RAY_RAYLET_PID names another live process (as
    Ray's own watcher, the parent is what counts): the parent's death ends the agent."""
    logs = base / "s" / "logs"
    argv = [
        *ray_flags(base),
        f"--stdout-filepath={logs / 'runtime_env_agent.out'}",
        f"--stderr-filepath={logs / 'runtime_env_agent.err'}",
        "--logging-filename=runtime_env_agent.log",
        "--a-flag-from-a-later-ray=1",
    ]
    other = await _fake_raylet()
    raylet = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RAYLET, *argv,
        cwd=REPO, env=_environ(RAY_RAYLET_PID=str(other.pid)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    log_file = logs / "runtime_env_agent.log"
    agent_pid = 0

    def text(path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""

    try:
        assert raylet.stdout is not None
        agent_pid = int(await asyncio.wait_for(raylet.stdout.readline(), START_S))
        out_file = logs / "runtime_env_agent.out"
        await wait_until(  # the log line comes first, the line on stdout once start returns
            lambda: (
                ("serving on" in text(log_file) and "serving on" in text(out_file))
                or _gone(agent_pid)
            ),
            timeout_s=START_S, what="the agent's log file and its stdout to say it serves",
        )  # fmt: skip
        assert not _gone(agent_pid), text(logs / "runtime_env_agent.err")
        assert "rtenv-agent serving on unix:" in text(out_file)
        assert text(log_file).count("--a-flag-from-a-later-ray=1") == 1
        assert f"raylet pid {raylet.pid}" in text(log_file)
        assert f"RAY_RAYLET_PID '{other.pid}' is not this agent's parent" in text(log_file)
        root = base / "s" / "runtime_resources" / "rtenv"
        assert (root / f"agent-{NODE[:16]}.sock").is_socket()
        raylet.kill()
        await raylet.wait()
        await wait_until(
            lambda: _gone(agent_pid), timeout_s=STOP_S, what="the agent to exit with its raylet"
        )
        said = f"WARNING agent.ops.entry: parent {raylet.pid} exited without ending its agent"
        assert said in text(log_file), "a raylet gone before its agent's keeper: not a normal end"
        assert other.returncode is None  # the process RAY_RAYLET_PID named still runs
    finally:
        if agent_pid and not _gone(agent_pid):
            os.kill(agent_pid, signal.SIGKILL)
        await stop(raylet)
        await stop(other)


@asynccontextmanager
async def _long_root_agent(
    base: Path, root_dir: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Path, Path]]:
    """``ray-agent`` with ``--runtime-env-dir root_dir``, serving: the process, the socket it
    listens on and the link in its root (``agent-<node>.sock``) to it."""
    raylet = await _fake_raylet()
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-u", "-m", "agent", "ray-agent",
        *ray_flags(base, more={"runtime-env-dir": str(root_dir)}),
        cwd=REPO, env=_environ(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        line = (await asyncio.wait_for(agent.stdout.readline(), START_S)).decode()
        assert line.startswith("rtenv-agent serving on unix:"), line
        socket_path = Path(line.split("unix:", 1)[1].strip())
        yield agent, socket_path, root_dir / "rtenv" / f"agent-{NODE[:16]}.sock"
    finally:
        await stop(agent)
        await stop(raylet)


async def _info(address: str) -> tuple[int, str, str]:
    info = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "info", "--address", address,
        cwd=REPO, env=_environ(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(info.communicate(), START_S)
    assert info.returncode is not None
    return info.returncode, out.decode(), err.decode()


async def test_an_agent_whose_root_is_too_long_for_a_socket_listens_under_rays_temp_dir(
    base: Path,
) -> None:
    """The root's own socket path is over 107 bytes: the agent listens under Ray's temp dir (a
    link named by the node in the root points there) and answers there; the folder it made and
    the link are gone when it stops."""
    root_dir = base / ("d" * 90)
    async with _long_root_agent(base, root_dir) as (agent, socket_path, link):
        assert socket_path.parent.parent == base  # under Ray's --temp-dir
        assert os.readlink(link) == str(socket_path)
        code, out, err = await _info(f"unix:{socket_path}")
        assert code == 0, err
        assert "ENV ID" in out
        agent.terminate()
        assert await asyncio.wait_for(agent.wait(), STOP_S) == 0
        assert not socket_path.parent.exists()  # the folder it made, removed at its exit
        assert not os.path.lexists(link)


async def test_info_asks_the_agent_through_the_link_in_its_root_over_107_bytes(
    base: Path,
) -> None:
    """The path the docs point to, ``<root>/agent-<node>.sock``, is the agent's link, over the
    107 bytes of a socket's path (108 with a 12-character RAY_TMPDIR): info follows it, through
    its folder, and the agent answers, as on its socket's own path (info refused it, saying
    "choose a shorter --root")."""
    root_dir = base / ("d" * 90)
    async with _long_root_agent(base, root_dir) as (_, socket_path, link):
        assert len(os.fsencode(str(link))) > 107, "short enough to connect: proves nothing"
        assert os.readlink(link) == str(socket_path)
        code, out, err = await _info(f"unix:{link}")
        assert (code, err) == (0, ""), err
        assert out.splitlines()[0].split() == ["ENV", "ID", "REFS", "STATE", "URIS"], out
        code, out, err = await _info(f"unix:{link.parent / 'agent-nobody.sock'}")
        assert (code, out) == (1, ""), err
        assert err == (
            f"rtenv-agent info: cannot connect to unix:{link.parent / 'agent-nobody.sock'}: the "
            "socket file does not exist (is the agent running? it prints its address when it "
            "starts)\n"
        )


@pytest.mark.parametrize(
    ("more", "said"),
    [
        ({"logging-format": "%(no_such_field)s"}, "is not a Python logging format"),
        ({"log-dir": "/" + "d" * 100_000}, "cannot write the log file"),
        ({"logging-filename": "../up.log"}, "a file name in --log-dir"),
    ],
)
async def test_a_bad_logging_flag_is_one_short_line_and_exit_2(
    base: Path, more: dict[str, str], said: str
) -> None:
    code, err = await _run(ray_flags(base, more=more), _environ())
    assert code == 2, err
    assert err.strip().count("\n") == 0, err
    assert said in err, err
    assert len(err) <= 1024, len(err)


async def test_the_port_file_tells_the_raylet_the_port_of_a_serving_ray_door(base: Path) -> None:
    """Ray's persist_port format: <session>/runtime_env_agent_port_<node id>, the port in
    decimal; the raylet reads it, then posts its requests to NODE_IP:PORT."""
    raylet = await _fake_raylet()
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-u", "-m", "agent", "ray-agent", *ray_flags(base),
        cwd=REPO, env=_environ(RAY_RAYLET_PID=str(raylet.pid)),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    port_file = base / "s" / f"runtime_env_agent_port_{NODE}"
    try:
        await wait_until(port_file.exists, timeout_s=START_S, what="the port file")
        port = int(port_file.read_text())  # digits only: int() refuses anything else
        assert port_file.read_text() == str(port)
        body = runtime_env_agent_pb2.GetRuntimeEnvsInfoRequest().SerializeToString()

        def post() -> bytes:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/get_runtime_envs_info", body)
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(req, timeout=10) as reply:
                data: bytes = reply.read()
                return data

        reply = runtime_env_agent_pb2.GetRuntimeEnvsInfoReply.FromString(
            await asyncio.to_thread(post)
        )
        assert reply.total == 0
    finally:
        await stop(agent)
        await stop(raylet)
