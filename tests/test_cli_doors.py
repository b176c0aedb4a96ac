"""Every door of ``rtenv-agent``, as a whole process: a mistake gets one line saying what is wrong
and what to do (exit 2 for a usage error), never a traceback, and a refused start leaves the root
untouched."""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from agent.core.errors import StartupError
from agent.ops.info_address import format_info
from agent.ops.startup import check_root_free, lock_root
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import (
    NO_PROXY,
    STOP_S,
    refused,
    run_cli,
    serving,
    wait_health_serving,
)
from tests.harness.packages import env_json, workdir_zip

ACCEPTED = "use unix:PATH, HOST:PORT or [IPv6]:PORT"


def one_line(err: str) -> str:
    """The whole of stderr, which must be a single line."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("serve --root ROOT --budget 1G", "--budget 1G (did you mean --cache-budget?)"),
        (
            "config --root ROOT --budget=1G --log-levl debug",
            "--budget=1G --log-levl debug (did you mean --cache-budget for --budget, --log-level "
            "for --log-levl?)",
        ),
        ("info --root ROOT --jsn", "--jsn (did you mean --json?)"),
        ("ray enable --pyton ROOT", "--pyton ROOT (did you mean --python?)"),
        ("serve --rot ROOT", "required: --root (did you mean --root for --rot?)"),
        ("info --adress unix:/x", "required (did you mean --address for --adress?)"),
        ("--verson", "required: command (did you mean --version for --verson?)"),
    ],
    ids=["serve", "config-two", "info", "ray-enable", "serve-required", "info-required", "top"],
)
async def test_an_unknown_flag_is_refused_by_its_subcommand_with_the_flag_it_likely_meant(
    base: Path, command: str, said: str
) -> None:
    """As a config file's unknown key gets its "did you mean": one line, exit 2, by the
    subcommand given it (naming its own --help), also where another mistake is told first;
    argparse's top parser refused it with no hint, naming no subcommand."""
    root = base / "root"
    args = command.replace("ROOT", str(root)).split()
    prog = " ".join(["rtenv-agent", *itertools.takewhile(lambda a: a[0] != "-", args)])
    code, out, err = await run_cli(*args)
    assert (code, out) == (2, ""), err
    line = one_line(err)
    assert line.startswith(f"{prog}: "), line
    if "required" not in said:
        assert line.startswith(f"{prog}: unrecognized arguments: "), line
    assert line.endswith(f"{said.replace('ROOT', str(root))} (see {prog} --help)"), line
    assert not root.exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["serve"], "rtenv-agent serve: the following arguments are required: --root (see "
         "rtenv-agent serve --help)"),
        (["serve", "--root", "ROOT", "--bogus"],
         "rtenv-agent serve: unrecognized arguments: --bogus (see rtenv-agent serve --help)"),
        (["serve", "--root", "ROOT", "--cache-budget"],
         "rtenv-agent serve: argument --cache-budget: expected one argument (see rtenv-agent "
         "serve --help)"),
        ([], "rtenv-agent: the following arguments are required: command (see rtenv-agent "
         "--help)"),
    ],
)  # fmt: skip
async def test_a_usage_mistake_is_one_line_not_the_whole_usage(
    base: Path, args: list[str], line: str
) -> None:
    """argparse printed the whole usage (26 lines for serve) above its error; the error alone
    now, with where the usage is, exit 2, and nothing made."""
    root = base / "root"
    code, out, err = await run_cli(*(str(root) if a == "ROOT" else a for a in args))
    assert code == 2, err
    assert out == ""
    assert one_line(err) == line
    assert not root.exists()


async def test_a_mistaken_argument_is_echoed_on_one_line_and_cut(base: Path) -> None:
    """argparse echoes a mistaken argument whole: a newline in it, or a megabyte of it, would
    print as it is. Control characters are escaped and the echo is cut, saying its length."""
    bogus = "--bogus\n" + "x" * 5000
    code, out, err = await run_cli("serve", "--root", str(base / "root"), bogus)
    assert out == ""
    assert code == 2, err
    line = one_line(err)
    assert line.startswith("rtenv-agent serve: unrecognized arguments: --bogus\\nxxx"), line
    assert line.endswith("... (5032 characters) (see rtenv-agent serve --help)"), line
    assert len(line) < 700


# -- info ------------------------------------------------------------------------------------


async def test_info_on_a_listener_that_never_answers_gives_up_after_the_connect_wait(
    base: Path,
) -> None:
    """Within the 2 s connect wait, whatever --timeout allows the answer (60 s here): a socket
    that takes connections (the kernel's backlog) but never speaks gRPC."""
    address = f"unix:{base / 'mute.sock'}"
    with socket.socket(socket.AF_UNIX) as mute:
        mute.bind(str(base / "mute.sock"))
        mute.listen(8)
        started = time.monotonic()
        code, out, err = await run_cli("info", "--address", address, "--timeout", "60")
        elapsed = time.monotonic() - started
    assert code == 1, out
    line = one_line(err)
    assert line.startswith(f"rtenv-agent info: cannot connect to {address} within 2s"), line
    assert "(is the agent running?" in line
    assert elapsed < 30, f"took {elapsed:.1f}s: it waited for the answer's timeout"


@pytest.mark.parametrize("family", ["unix", "tcp"])
async def test_info_where_nothing_listens_says_so_at_once(base: Path, family: str) -> None:
    """A killed agent's leftover socket file (bound, nobody listening), and a TCP port nobody
    listens on: the connect is refused at once, so info says so without the 2 s wait (only
    that path can say "nothing listens there")."""
    with socket.socket(socket.AF_UNIX if family == "unix" else socket.AF_INET) as stale:
        if family == "unix":
            stale.bind(str(base / "stale.sock"))
            address = f"unix:{base / 'stale.sock'}"
        else:
            stale.bind(("127.0.0.1", 0))  # held, never listening: a port nobody serves
            address = f"127.0.0.1:{stale.getsockname()[1]}"
        code, out, err = await run_cli("info", "--address", address, "--timeout", "60")
    assert (code, out) == (1, ""), err
    assert one_line(err) == (
        f"rtenv-agent info: cannot connect to {address}: nothing listens there (is the agent "
        "running? it prints its address when it starts; a killed agent leaves its socket file)"
    )


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("no-such.sock", "the socket file does not exist (is the agent running? it prints its "
         "address when it starts)"),
        ("no-such-folder/agent.sock", "the socket file does not exist (is the agent running? "
         "it prints its address when it starts)"),
        ("a-file", "the file there is not a socket (the agent prints its address when it "
         "starts)"),
        ("a-file/agent.sock", "the socket file does not exist (is the agent running? it prints "
         "its address when it starts)"),
        ("f" * 120 + "/agent.sock", "the socket file does not exist (is the agent running? it "
         "prints its address when it starts)"),
    ],
    ids=["no-file", "no-folder", "not-a-socket", "a-file-as-folder", "no-folder-over-107-bytes"],
)  # fmt: skip
async def test_info_on_a_unix_path_with_no_socket_file_says_so_at_once(
    base: Path, where: str, said: str
) -> None:
    """A missing file is known at once: not after the 2 s connect wait, which could say only
    that it cannot connect."""
    (base / "a-file").write_text("not a socket\n")
    address = f"unix:{base / where}"
    code, out, err = await run_cli("info", "--address", address)
    assert (code, out) == (1, ""), err
    assert one_line(err) == f"rtenv-agent info: cannot connect to {address}: {said}"


async def test_a_socket_name_too_long_to_reach_is_refused_in_words_for_info(base: Path) -> None:
    """A path over 107 bytes is reached through its folder (tests/test_ray_agent_cli.py); one
    whose file name alone is too long for that is one line worded for info, exit 2: not
    serve's "choose a shorter --root", which means nothing to info."""
    name = "n" * 100 + ".sock"
    address = f"unix:{base / name}"
    code, out, err = await run_cli("info", "--address", address)
    assert (code, out) == (2, ""), err
    assert one_line(err) == (
        f"rtenv-agent info: cannot connect to {address}: its path is "
        f"{len(os.fsencode(str(base / name)))} bytes, over the 107 a unix socket's may be "
        "(AF_UNIX), and its file name alone (105 bytes) is too long to reach through its "
        "folder; make a link with a shorter name to the socket and give info that"
    )


async def test_info_root_reads_the_roots_index_and_info_address_asks_one_agent(base: Path) -> None:
    """--root is no longer a socket: it shows the agent as the root's one holder, from state.db;
    the agent's own figures (its budget) come from --address."""
    root = base / "root"
    async with serving(base / "agent.log", "--root", str(root), "--cache-budget", "3M") as agent:
        await wait_health_serving(agent.address)
        code, out, err = await run_cli("info", "--root", str(root))
        assert code == 0, err
        holder = out.splitlines()[1]  # under the header: the only holder
        assert holder.split()[1:3] == [str(agent.proc.pid), "alive"], out
        assert out.splitlines()[-1].startswith("holders: 1 alive, 0 dead; 0 packages"), out
        code, out, err = await run_cli("info", "--address", agent.address)
        assert code == 0, err
        assert "of budget 3.0 MiB" in out, out
        code, out, err = await run_cli("info", "--address", agent.address, "--json")
        assert code == 0, err
        assert '"budget_bytes": "3145728"' in out, "JSON keeps exact bytes"


async def test_info_shows_under_an_env_the_jobs_that_created_it_and_eager_install(
    base: Path,
) -> None:
    root = base / "root"
    async with serving(base / "agent.log", "--root", str(root)) as agent:
        await wait_health_serving(agent.address)
        async with grpc.aio.insecure_channel(agent.address, options=NO_PROXY) as channel:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            for job_id in ("01000000", "02000000"):
                request = agent_pb2.CreateRuntimeEnvRequest(
                    serialized_runtime_env='{"env_vars": {"A": "1"}}', job_id=job_id,
                    config=agent_pb2.RuntimeEnvConfig(eager_install=True),
                )  # fmt: skip
                await stub.CreateRuntimeEnv(request, timeout=30)
        code, out, err = await run_cli("info", "--address", agent.address)
        assert code == 0, err
        [env_line, said] = out.splitlines()[1:3]
        assert env_line.split()[1:3] == ["2", "ready"], out
        assert said == f"{'':<41}jobs: 01000000, 02000000; eager_install", out
        code, out, err = await run_cli("info", "--address", agent.address, "--json")
        assert code == 0, err
        assert '"job_ids": [\n        "01000000",\n        "02000000"\n      ]' in out, out


def test_format_info_quotes_a_job_id_a_terminal_would_act_on() -> None:
    """A job id is the client's text: one with a control character (an escape sequence, a
    newline) is quoted, so it can neither forge lines nor drive the terminal."""
    reply = agent_pb2.GetRuntimeEnvsInfoReply(total_envs=1)
    reply.envs.add(runtime_env_id="a" * 32, references=1, state="ready",
                   job_ids=["ok", "\x1b[2Jx\nforged"])  # fmt: skip
    text = format_info(reply)
    assert "jobs: ok, '\\x1b[2Jx\\nforged'" in text, text
    assert "\x1b" not in text
    assert "eager_install" not in text


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--token-file", "/nonexistent/token"), "cannot read the token file /nonexistent/token"),
        (("--timeout", "soon"), "'soon' is not a duration"),
        (("--address", "tcp://127.0.0.1:1"), "is malformed"),
    ],
    ids=["token-file", "timeout", "address"],
)
async def test_info_usage_mistakes_exit_2_in_one_line(
    base: Path, argv: tuple[str, ...], words: str
) -> None:
    if "--address" not in argv:
        argv = ("--address", f"unix:{base / 'a.sock'}", *argv)
    code, _, err = await run_cli("info", *argv)
    assert code == 2, err
    assert words in err, err
    assert "Traceback" not in err


async def test_version_and_help_show_no_markup() -> None:
    code, out, err = await run_cli("--version")
    assert code == 0, err
    assert re.fullmatch(r"rtenv-agent \d+\.\d+\.\d+\S*\n", out), out
    code, out, err = await run_cli("--help")
    assert code == 0, err
    assert "``" not in out, out
    assert "--version" in out


# -- serve: refused before the root is touched -----------------------------------------------


async def test_port_in_use_is_one_line_and_the_root_is_never_made(base: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        code, err = await refused(base / "refused.log", "--root", str(base / "root"),
                                  "--address", address)  # fmt: skip
    assert code == 2, err
    line = one_line(err)
    assert line.startswith(f"rtenv-agent: cannot listen on {address}: Address already in use")
    assert "another process listens there; choose another port (0 picks a free one)" in line
    assert not (base / "root").exists(), "the root was made (and state.db with it)"


@pytest.mark.parametrize("flag", ["--metrics-address", "--ray-address"])
async def test_a_busy_metrics_or_ray_port_is_one_line_naming_flag_and_address_and_no_root(
    base: Path, flag: str
) -> None:
    """asyncio's bind error showed the address as a tuple (``('127.0.0.1', 18765)``), and the
    metrics port was bound only after recovery had made the root and its state.db."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        code, err = await refused(base / "refused.log", "--root", str(base / "root"),
                                  flag, address)  # fmt: skip
    assert code == 2, err
    assert one_line(err) == (
        f"rtenv-agent: cannot listen on {address} ({flag}): Address already in use; another "
        "process listens there; choose another port (0 picks a free one)"
    )
    assert not (base / "root").exists(), "the root was made (and state.db with it)"


async def test_two_doors_on_one_port_are_refused_before_the_root_is_made(base: Path) -> None:
    """The second door's bind failed only after recovery, the first one bound. Refused before
    any port is tried: whoever holds the port by then does not matter."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"
    code, err = await refused(base / "refused.log", "--root", str(base / "root"),
                              "--address", address, "--metrics-address", address)  # fmt: skip
    assert code == 2, err
    assert one_line(err) == (
        f"rtenv-agent: --metrics-address {address} and --address {address} are one port for "
        "two doors; give each its own port (0 picks a free one)"
    )
    assert not (base / "root").exists()


async def test_state_db_and_no_state_db_together_are_refused_in_one_line(base: Path) -> None:
    """``--state-db true --no-state-db`` was resolved silently, the later flag winning."""
    for command in ("serve", "config"):
        for both in (("--state-db", "true", "--no-state-db"), ("--no-state-db", "--state-db", "1")):
            code, out, err = await run_cli(command, "--root", str(base / "root"), *both)
            assert (code, out) == (2, ""), err
            line = one_line(err)
            assert line.startswith(f"rtenv-agent {command}: argument --"), line
            assert "not allowed with argument --" in line, line
            assert not (base / "root").exists()


async def test_no_state_db_logs_nothing_about_state_db(base: Path) -> None:
    """Its index is in memory: the log said 'state.db migrated to schema version N' three
    times, as if it made a state.db."""
    root = base / "root"
    async with serving(base / "agent.log", "--root", str(root), "--no-state-db") as agent:
        await wait_health_serving(agent.address)
    log = agent.log_text()
    assert "serving on" in log, log
    assert "state.db" not in log, log
    assert not (root / "state.db").exists()


async def test_an_allow_file_root_that_does_not_exist_is_kept_with_one_warning(base: Path) -> None:
    """serve and config each say it in one line, and accept it: once the folder is there (a
    file system mounted later), a package under it is served."""
    later, there = base / "mounted-later", base / "pkgs"
    there.mkdir()
    roots = ("--allow-file-root", str(later), "--allow-file-root", str(there))
    warning = f"allow-file-root {str(later)!r} is not a folder (yet): kept"
    code, out, err = await run_cli("config", "--root", str(base / "root"), *roots)
    assert code == 0, err
    assert one_line(err).startswith(f"rtenv-agent: warning: {warning}"), err
    assert f"{later}:{there}" in out, out
    async with serving(base / "agent.log", "--root", str(base / "root"), *roots) as agent:
        await wait_health_serving(agent.address)
        said = [line for line in agent.log_text().splitlines() if "allow-file-root" in line]
        assert len(said) == 1, said
        assert f"WARNING agent.ops.server: {warning}" in said[0], said
        later.mkdir()
        package = later / "wd.zip"
        package.write_bytes(workdir_zip({"main.py": "print('hi')\n"}))
        async with grpc.aio.insecure_channel(agent.address, options=NO_PROXY) as channel:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            request = agent_pb2.CreateRuntimeEnvRequest(
                serialized_runtime_env=env_json(f"file://{package}")
            )
            reply = await stub.CreateRuntimeEnv(request, timeout=30)
        assert reply.runtime_env_id


async def test_tcp_scheme_is_called_malformed_not_non_loopback(base: Path) -> None:
    code, err = await refused(base / "refused.log", "--root", str(base / "root"),
                              "--address", "tcp://127.0.0.1:5000")  # fmt: skip
    assert code == 2, err
    line = one_line(err)
    assert "address 'tcp://127.0.0.1:5000' is malformed: tcp:// is not a scheme" in line
    assert ACCEPTED in line
    assert not (base / "root").exists()


@pytest.mark.parametrize("kind", ["missing", "not-python"])
async def test_python_that_does_not_exist_or_does_not_run_exits_2(base: Path, kind: str) -> None:
    python = base / "bin" / "python-x"
    if kind == "not-python":
        python.parent.mkdir()
        python.write_text("#!/bin/sh\necho 'not a python' >&2\nexit 3\n")
        python.chmod(0o755)
    root = base / "root"
    code, err = await refused(base / "refused.log", "--root", str(root), "--python", str(python))
    assert code == 2, err
    line = one_line(err)
    assert f"python '{python}' (the --python setting)" in line, line
    if kind == "missing":
        assert "does not exist or is not executable" in line, line
    else:
        assert "does not run as Python 3 (exit 3: 'not a python')" in line, line
    assert not root.exists()


# -- serve: the root's folders ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sub", "make", "reason"),
    [
        ("tmp", "file", "it exists and is not a folder"),
        ("uris", "dangling-symlink", "it is a symlink to {base}/nowhere, which does not exist"),
    ],
)
async def test_root_folder_that_cannot_be_a_folder_exits_2_naming_it(
    base: Path, sub: str, make: str, reason: str
) -> None:
    """Works as any user, root included: no permission bit is involved."""
    root = base / "root"
    root.mkdir()
    if make == "file":
        (root / sub).write_text("")
    else:
        (root / sub).symlink_to(base / "nowhere")
    code, err = await refused(base / "refused.log", "--root", str(root))
    assert code == 2, err
    line = one_line(err)
    expected = reason.format(base=base)
    assert f"{root / sub} is not usable by the agent: {expected}" in line, line
    assert "choose another --root" in line


def _put_at_lock(root: Path, what: str, base: Path) -> Path:
    """Something that is no lock file at ROOT/agent.lock; returns the file a link points to
    (whose content must stay "keep")."""
    target = base / "outside"
    target.write_text("keep")
    lock = root / "agent.lock"
    if what == "fifo":
        os.mkfifo(lock)
    elif what == "link":
        lock.symlink_to(target)
    elif what == "dangling-link":
        lock.symlink_to(base / "nowhere")
    else:
        lock.mkdir()
    return target


_NOT_A_LOCK = "is not a regular file (a link, a FIFO or a folder put there?), so it cannot be"
_NOT_LOCKS = ["fifo", "link", "dangling-link", "folder"]


@pytest.mark.parametrize("what", _NOT_LOCKS)
@pytest.mark.parametrize("flag", [(), ("--no-state-db",)], ids=["shared", "alone"])
async def test_an_agent_lock_that_is_no_regular_file_refuses_the_start_in_one_line(
    base: Path, what: str, flag: tuple[str, ...]
) -> None:
    """A FIFO there would hang the start (an open for reading waits for a writer), a link
    would have the agent truncate the file it points to: exit 2 naming the path; nothing
    followed, nothing made where a dangling link points."""
    root = base / "root"
    root.mkdir()
    target = _put_at_lock(root, what, base)
    code, err = await refused(base / "refused.log", "--root", str(root), *flag)
    assert code == 2, err
    line = one_line(err)
    assert line.startswith(f"rtenv-agent: {str(root / 'agent.lock')!r} {_NOT_A_LOCK}"), line
    assert target.read_text() == "keep"
    assert not (base / "nowhere").exists()


@pytest.mark.parametrize("what", _NOT_LOCKS)
@pytest.mark.parametrize("alone", [False, True])
def test_lock_root_refuses_what_is_no_regular_file_and_truncates_nothing(
    base: Path, what: str, alone: bool
) -> None:
    """Past check_root_free (a file swapped in between): lock_root, which truncates the lock
    file when it takes the root alone, never follows a link out of the root."""
    root = base / "root"
    root.mkdir()
    target = _put_at_lock(root, what, base)
    with pytest.raises(StartupError, match=re.escape(_NOT_A_LOCK)):
        lock_root(root, alone=alone)
    assert target.read_text() == "keep"
    assert not (base / "nowhere").exists()


def _can_mount_in_a_namespace(base: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    (base / "m").mkdir()
    try:
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {base / 'm'}"],
            capture_output=True, timeout=STOP_S, check=False,
        )  # fmt: skip
    finally:
        (base / "m").rmdir()
    return probe.returncode == 0


@pytest.mark.parametrize(
    ("sub", "reason"),
    [
        ("tmp", "cannot make a folder in it: Read-only file system"),
        ("uris", "cannot rename a folder from tmp/ into it: Invalid cross-device link"),
    ],
)
async def test_read_only_root_folder_is_found_at_start_not_at_the_first_create(
    base: Path, sub: str, reason: str
) -> None:
    """A read-only tmpfs over ROOT/SUB, mounted in a private mount namespace of the agent's own
    (so it vanishes with it): unwritable for root too, which chmod would not be."""
    if not _can_mount_in_a_namespace(base):
        pytest.skip("needs unshare -m and mount (root, or user namespaces)")
    root = base / "root"
    (root / sub).mkdir(parents=True)
    script = 'mount -t tmpfs -o ro tmpfs "$0" && exec "$@"'
    under = ("unshare", "-m", "sh", "-c", script, str(root / sub))
    code, text = await refused(base / "agent.log", "--root", str(root), under=under)
    assert code == 2, text
    message = one_line(text)
    assert f"{root / sub} is not usable by the agent: {reason}" in message, message
    assert not [p.name for p in (root / "tmp").iterdir()], "the probe was left behind"


# -- serve: signals and the start-up log -----------------------------------------------------


async def test_sighup_stops_gracefully_as_sigterm_does(base: Path) -> None:
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        await wait_health_serving(agent.address)
        agent.proc.send_signal(signal.SIGHUP)
        code = await asyncio.wait_for(agent.proc.wait(), STOP_S)
        log = agent.log_text()
        assert code == 0, log
        assert "shutting down" in log
        assert re.search(r"INFO agent\.ops\.server: stopped$", log, re.M), log
        assert not (base / "root" / "agent.sock").exists(), "no cleanup"


async def test_start_up_log_says_the_event_loop_and_the_budget_in_binary_units(
    base: Path,
) -> None:
    async with serving(base / "agent.log", "--root", str(base / "root")) as agent:
        await wait_health_serving(agent.address)
        log = agent.log_text()
    loop_line = r"INFO agent\.ops\.entry: event loop: (uvloop \S+|asyncio \(uvloop not in use)"
    assert re.search(loop_line, log), log
    assert "budget 10.0 GiB," in log, log


def test_no_process_is_left_behind() -> None:
    """Every test above stops what it started by its PID (a guard for the suite's hygiene)."""
    mine = os.getpid()
    children = Path(f"/proc/{mine}/task/{mine}/children")
    if children.exists():
        assert children.read_text().split() == [], "a child process outlived its test"


def test_root_checks_create_nothing_and_the_lock_outlasts_another_starters_check(
    base: Path,
) -> None:
    """check_root_free makes no lock file; agents with state.db share the lock, one that needs
    the root alone (--no-state-db) refuses and is refused by them; a starter's brief check,
    shared or exclusive, never makes lock_root refuse."""
    root = base / "root"
    root.mkdir()
    check_root_free(root)
    check_root_free(root, alone=True)
    assert list(root.iterdir()) == [], "the check made a file"
    shared = lock_root(root)
    try:
        check_root_free(root)  # another agent with state.db may share it
        os.close(lock_root(root))
        with pytest.raises(StartupError, match=r"other agents serve root .* needs it alone"):
            check_root_free(root, alone=True)
    finally:
        os.close(shared)
    alone = lock_root(root, alone=True)
    try:
        with pytest.raises(
            StartupError, match=rf"an agent \(pid {os.getpid()}\) holds root .* alone"
        ):
            check_root_free(root)
        with pytest.raises(StartupError, match=r"other agents serve root"):
            check_root_free(root, alone=True)
    finally:
        os.close(alone)
    for held, alone_after in ((fcntl.LOCK_SH, True), (fcntl.LOCK_EX, False)):
        probe = os.open(root / "agent.lock", os.O_RDONLY)
        fcntl.flock(probe, held)  # another starter, in the middle of its check
        timer = threading.Timer(0.03, os.close, (probe,))
        timer.start()
        try:
            os.close(lock_root(root, alone=alone_after))
        finally:
            timer.join(STOP_S)
