"""Build a virtualenv for a pip spec, in a staging folder, with the installer as a subprocess.

``python -m venv --without-pip`` makes the venv (fast: no ensurepip), then the installer puts
the requirements in it: ``pip --python <venv python> install`` (the agent's own pip); or ``uv
venv`` and ``uv pip install`` for a ``uv`` env, and for a ``pip`` env when ``pip-installer`` is
``uv`` and a uv is found (beside the agent's python, else on PATH; a ``uv`` env whose
``uv_version`` that uv does not satisfy, by the uv that does: ``agent.core.uv_tool``). uv installs
from the root's one wheel cache by hardlinks (``--link-mode hardlink --cache-dir
<root>/wheel-cache``: see ``agent.install.venvs.wheel_cache``); pip has no such mode, so a venv
pip builds is a copy of its own. A ``pip_version`` or ``pip_check`` adds pip's steps
(``agent.install.venvs.pip_commands``). The installer's output goes to a log file under the
root; a failure is FAILED_PRECONDITION with the installer's own last error lines (those it
writes at the start of a line; what a package's build printed, which pip indents, can quote any
file the build read, and stays in the log), each cut short. The installer runs in its own
process group, and is killed with its whole group if the install is cancelled (a setup timeout,
the last create gone); it also dies with the agent (PDEATHSIG).

The installer sees only the env's options: no pip configuration file (``PIP_CONFIG_FILE`` is
the null device, which makes pip skip the global, user and site files), no ``PIP_*`` variable
(removed, and ``--isolated``), no ``UV_*`` variable (``UV_NO_CONFIG`` set), and its working
directory is the staging folder, so nothing of the agent's environment, home or working
directory redirects where it reads packages from or writes them to.

A venv that sees the node's packages (``spec.sees``: the Ray door's kinds) is built the same way,
isolated (so uv still links it from the wheel cache, and what it installs is its own), and then gets
``SITE_PTH`` in its site-packages: a ``.pth`` that adds the node python's site folders after the
venv's own (``site.addsitedir``, so their ``.pth`` files are processed too), as the venv Ray's agent
makes (``virtualenv --system-site-packages``, or a clone of a venv node python) sees the node's
packages, Ray among them, after its own.

Scripts that the installer wrote carry the staging path in their shebang; they are rewritten to
the final path before the one rename into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.core.errors import InstallerFailed, echo
from agent.core.pip_spec import PipSpec
from agent.core.uv_spec import UvSpec
from agent.crash import armed, crash_point
from agent.install.disk.staging import through
from agent.install.venvs.disk_guard import DiskGuard, enospc_error, log_says_enospc
from agent.install.venvs.pip_commands import install_options, pip_argv, pip_version_argv
from agent.install.venvs.spawn import run, spawn

log = logging.getLogger(__name__)

# pip and uv run under this umask whatever the agent's: what they make that the agent does not
# harden afterwards (the wheel cache's own files and folders, uv's lock files) is writable by the
# agent's user alone (an agent started under umask 000 would leave them world-writable).
INSTALLER_UMASK = 0o022

_TAIL_LINES = 10  # at most this many of the installer's lines go back to the client
_TAIL_LINE_CHARS = 200  # each cut to this
_TAIL_READ_BYTES = 64 * 1024  # of the log's end, read to find them
_PR_SET_PDEATHSIG = 1
_PGID_BYTES = 20  # of an installer.pgid: a pid's digits
_VERSION_TIMEOUT_S = 30.0  # for the node python's site folders
SITE_PTH = "_rtenv_node_site.pth"  # in a Ray-semantics venv's site-packages
# printed by the node python: its site folders (a venv python's are its venv's), one per line
_NODE_SITES = "import site\nfor d in site.getsitepackages(): print(d)\n"


# The installer's group leader, between the agent and the installer: it sets the installer's
# umask and runs the installer as its child, in its group, and when the agent dies (PDEATHSIG
# sends it SIGTERM) it kills the whole group, installer children included. (Not a preexec_fn:
# Python code between fork and exec in a process serving gRPC crashes now and then; see
# agent.install.venvs.spawn, which starts it, for why not the loop's own subprocess either.)
_GROUP_LEADER = (
    "import ctypes, os, signal, subprocess, sys\n"
    f"os.umask({INSTALLER_UMASK:#o})\n"
    "def die(*_):\n"
    "    os.killpg(0, signal.SIGKILL)\n"
    "signal.signal(signal.SIGTERM, die)\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    die()\n"
    "sys.exit(subprocess.call(sys.argv[2:]))\n"
)
PGID_FILE = "installer.pgid"  # in the staging folder: recovery kills what a crash left running


def installer_environ() -> dict[str, str]:
    """The agent's environment without what would configure pip or uv behind the env's back
    (``_PIP_RUNNING_IN_SUBPROCESS`` too: with it, ``pip --python`` installs into the agent's
    own environment)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIP_", "_PIP_", "UV_"))
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["UV_NO_CONFIG"] = "1"
    return env


async def run_installer(
    args: Sequence[str],
    log_path: Path,
    label: str,
    staging: Path,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
    guard: DiskGuard | None = None,
) -> None:
    """Run one installer command as ``build_venv`` runs its own: its output in ``log_path``,
    in its own process group (killed with it when cancelled), its temp files in ``staging``;
    a failure is ``InstallerFailed`` with its last error lines. ``cwd`` (default ``staging``)
    and ``environ`` (default ``installer_environ()``) for a project's build. ``guard``: the
    disk floor watched while it runs (``DiskGuard``: stopped before the floor, with the
    figures); an installer that ran out of space fails ``DiskExhausted`` either way, never
    with its own ENOSPC words."""
    # The installer's temp files go in its staging folder: an install killed (timeout, crash)
    # leaves its pip-* folders there, removed with the staging, not in the machine's temp dir.
    temp = staging / "installer-tmp"
    in_venv = armed("mid_venv_build") and await asyncio.to_thread((staging / "venv").is_dir)
    opening = asyncio.ensure_future(asyncio.to_thread(_open_log, log_path, temp, args))
    try:
        out = await through(opening)
    except asyncio.CancelledError:  # the log was opened all the same: close it
        if not opening.cancelled() and opening.exception() is None:
            os.close(opening.result())
        raise
    try:
        child = await spawn(
            [sys.executable, "-c", _GROUP_LEADER, str(os.getpid()), *args],
            stdout=out,
            stderr=out,
            start_new_session=True,
            cwd=cwd or staging,
            env={**(installer_environ() if environ is None else environ), "TMPDIR": str(temp)},
        )
    finally:
        os.close(out)  # the child has its own copy
    try:
        await through(asyncio.ensure_future(asyncio.to_thread(_write_pgid, staging, child.pid)))
        if in_venv:  # a test's crash point: the venv made, then its installer started
            crash_point("mid_venv_build")
        code = await (child.wait() if guard is None else guard.watch(child))
    except BaseException:  # cancelled: the whole group goes, now, children included
        child.kill(group=True)
        await asyncio.shield(child.wait())
        raise
    if code != 0:
        if await asyncio.to_thread(log_says_enospc, log_path, _COMMAND):
            raise enospc_error(guard, f"{label}: {os.path.basename(args[0])}", log_path)
        tail = await asyncio.to_thread(_tail, log_path)
        raise InstallerFailed(
            f"{label}: {os.path.basename(args[0])} exited with {code}; its last error lines "
            f"(the whole output is in {log_path} on the agent's node):\n{tail}"
        )


def _write_pgid(staging: Path, pgid: int) -> None:
    """Note the installer's process group in its staging folder (for a crash's recovery)."""
    (staging / PGID_FILE).write_text(str(pgid))


def _open_log(log_path: Path, temp: Path, args: Sequence[str]) -> int:
    """Make the installer's temp folder, open its log for appending and write the command line
    the output follows; return the log's descriptor. Blocking: one thread hop."""
    temp.mkdir(exist_ok=True)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(out, f"{_COMMAND}{' '.join(args)}\n".encode())
    except BaseException:
        os.close(out)
        raise
    return out


_COMMAND = "$ "  # starts the line the log gets before each command's output


_CAUSE = "  cause: "  # uv's own chain of causes under its "error:" line (a build's output
# it indents further)


def _tail(path: Path) -> str:
    """The installer's own last lines from the end of its log: lines that start at the first
    column (pip indents what a build printed, and so does uv, which indents its own causes by
    two: ``_CAUSE``, kept), each quoted by ``echo``: cut to a bounded length,
    with its length, control characters escaped. Only newlines split lines: a build's carriage
    return must not make its output look like the installer's."""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        start = max(0, f.tell() - _TAIL_READ_BYTES)
        f.seek(start)
        lines = f.read().decode(errors="replace").split("\n")
    if start:
        lines = lines[1:]  # begun before what was read
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(_COMMAND):  # this command's output only
            lines = lines[i + 1 :]
            break
    own = [line for line in lines if line and (not line[0].isspace() or line.startswith(_CAUSE))]
    return "\n".join(_cut(line) for line in own[-_TAIL_LINES:])


def _cut(line: str) -> str:
    """One installer line (it may quote a requirement the client wrote), as ``echo`` quotes
    client input: cut, with its length, control characters escaped."""
    return echo(line, _TAIL_LINE_CHARS)


async def build_venv(
    spec: PipSpec | UvSpec,
    staging: Path,
    *,
    python: str,
    installer: str,
    log_path: Path,
    label: str,
    uv: str | None = None,
    cache: Path | None = None,
    sources: Sequence[str] = (),
    guard: DiskGuard | None = None,
    uv_dist: UvSpec | None = None,
    agent_uv: str | None = None,
) -> Path:
    """Make ``staging/venv`` with the spec installed; return it. ``label`` names the package in
    messages, already cut (``UriKey.label``). ``uv``: the uv binary (``find_uv``, or the uv of
    the spec's ``uv_version``: ``agent.core.uv_tool``), used for a ``UvSpec`` always and for a
    ``PipSpec`` when ``installer`` is "uv"; ``cache``: the root's
    wheel cache uv installs from, by hardlinks (``agent.install.venvs.wheel_cache``); ``sources``:
    the installer's arguments for the spec's local sources (their copies: ``local_read``);
    ``guard``: the disk floor watched while each installer runs (``run_installer``);
    ``uv_dist``: the set of ``uv<uv_version>`` (``agent.core.uv_tool.uv_set``), installed into
    the venv before the spec's packages by ``agent_uv`` (the agent's uv) from ``cache``, as Ray
    installs it into its venv."""
    venv = staging / "venv"
    venv_python = str(venv / "bin" / "python")
    if isinstance(spec, UvSpec) and uv is None:
        raise InstallerFailed(
            f"{label}: a uv env needs uv, and the agent finds none beside its python nor on "
            "PATH (install the agent's uv extra, or uv)"
        )
    by_uv = isinstance(spec, UvSpec) or (installer == "uv" and not spec.pip_only)
    options = install_options(spec)  # a uv set's option lines too (``UvSpec.line_options``)
    if uv is not None and by_uv:
        await run_installer(
            [uv, "venv", "--quiet", "--python", python, str(venv)],
            log_path,
            label,
            staging,
            guard=guard,
        )
        install = [uv, "pip", "install", "--python", venv_python]
        if cache is not None:
            install += ["--link-mode", "hardlink", "--cache-dir", str(cache)]
        if isinstance(spec, PipSpec):
            options = spec.uv_options()
        if uv_dist is not None and agent_uv is not None:  # the agent's uv: its cache's layout
            await _install_uv_dist(
                [agent_uv, *install[1:]], uv_dist, log_path, label, staging, guard
            )
    else:
        if isinstance(spec, PipSpec) and installer == "uv" and spec.pip_only:
            pip_only = ", ".join(spec.pip_only)
            log.info(
                "%s: built by pip, not uv: uv does not take %s",
                label,
                pip_only,
                extra={"uri": label, "installer": "pip", "options": pip_only},
            )
        await run_installer(
            [python, "-m", "venv", "--without-pip", str(venv)],
            log_path,
            label,
            staging,
            guard=guard,
        )
        install = pip_argv(python, venv_python, "install", spec)
        options = install_options(spec)
        if isinstance(spec, PipSpec) and spec.pip_version:
            pip = pip_version_argv(python, venv_python, spec)
            await run_installer(pip, log_path, label, staging, guard=guard)
    await run_installer(
        [*install, *options, *spec.packages, *sources], log_path, label, staging, guard=guard
    )
    if isinstance(spec, PipSpec) and spec.pip_check:
        check = pip_argv(python, venv_python, "check", spec)
        await run_installer(check, log_path, label, staging)
    if isinstance(spec, UvSpec) and spec.uv_check and uv is not None:
        await run_installer([uv, "pip", "check", "--python", venv_python], log_path, label, staging)
    if spec.sees is not None:
        sites = await site_folders_of(python, label)
        await asyncio.to_thread(write_site_pth, venv, sites)
    return venv


async def _install_uv_dist(
    install: list[str],
    uv_dist: UvSpec,
    log_path: Path,
    label: str,
    staging: Path,
    guard: DiskGuard | None,
) -> None:
    """Install ``uv_dist`` (``uv<uv_version>``) by ``install`` (the agent's uv pip install);
    its failure says why the venv needs a uv."""
    try:
        await run_installer(
            [*install, *uv_dist.options, *uv_dist.packages], log_path, label, staging, guard=guard
        )
    except InstallerFailed as exc:
        raise InstallerFailed(
            f"{exc.message}\n(uv.uv_version: the venv gets {echo(uv_dist.packages[0])} installed "
            "into it before its packages, as Ray's does, from the places its "
            "uv_pip_install_options name, else the default index)"
        ) from exc


async def site_folders_of(python: str, label: str) -> list[str]:
    """The site folders of the node's python (``site.getsitepackages()``)."""
    try:
        done = await run(
            [python, "-c", _NODE_SITES], env=installer_environ(), timeout_s=_VERSION_TIMEOUT_S
        )
    except TimeoutError:
        raise InstallerFailed(
            f"{label}: the node's python ({echo(python)}) did not tell its site folders within "
            f"{_VERSION_TIMEOUT_S:g}s"
        ) from None
    if done.code != 0:
        raise InstallerFailed(
            f"{label}: the node's python ({echo(python)}) exited with {done.code} when asked "
            "its site folders"
        )
    return [
        line for line in done.output.decode(errors="replace").splitlines() if line.startswith("/")
    ]


def site_line(sites: Sequence[str]) -> str:
    """The ``.pth`` line that adds ``sites`` after the venv's own site-packages. Pure."""
    # one statement per folder: ``site`` runs the line with ``exec`` in a function, where a
    # comprehension would not see the name the import bound
    return "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in sites) + "\n"


def write_site_pth(venv: Path, sites: Sequence[str]) -> None:
    """Write ``SITE_PTH`` in each of the venv's site-packages folders. Blocking."""
    for site_packages in venv.glob("lib/python*/site-packages"):
        (site_packages / SITE_PTH).write_text(site_line(sites))


def relocate(venv: Path, final: Path) -> None:
    """Rewrite the staging path to ``final`` in the venv's scripts (shebangs, activate).
    Blocking: call it in a thread, before the rename."""
    old, new = str(venv).encode(), str(final).encode()
    bin_dir = venv / "bin"
    for path in bin_dir.iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if (data.startswith(b"#!") or path.name.startswith("activate")) and old in data:
            _replace(path, data.replace(old, new))
    cfg = venv / "pyvenv.cfg"
    if cfg.exists():
        cfg.write_bytes(cfg.read_bytes().replace(old, new))


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file in ``path``'s place (its mode kept): never through the old
    inode, which uv may have hardlinked to its cache and to other venvs."""
    fresh = path.with_name(f".{path.name}.relocated")
    fresh.write_bytes(data)
    os.chmod(fresh, stat.S_IMODE(os.lstat(path).st_mode))
    os.replace(fresh, path)


def kill_orphaned_installers(tmp: Path) -> int:
    """Recovery: an agent killed mid-install leaves its installer's children running (only the
    process it started dies with it). Kill each group recorded in a staging folder, if one of
    its processes still names that folder (a pid may have been reused). Return groups killed."""
    killed = 0
    try:
        entries = [e for e in os.scandir(tmp) if e.is_dir(follow_symlinks=False)]
    except OSError:  # no folder (nothing was staged), or not one
        return 0
    for entry in entries:
        pgid_file = Path(entry.path, PGID_FILE)
        pgid = _read_pgid(pgid_file)
        if pgid is None:
            continue
        staging = entry.path.encode()
        if any(staging in _cmdline(pid) for pid in _group_members(pgid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
    return killed


def _read_pgid(path: Path) -> int | None:
    """The group a staging folder recorded, read as hostile input: the installer ran there and
    may have replaced the file (a FIFO would block the reaper, which holds the root's write
    lock; a link to /dev/zero would read for ever). No link followed, no FIFO waited on, a
    regular file only, a few bytes: anything else is no pgid (logged)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("ignoring %s: %s", path, exc.strerror or exc, extra={"path": str(path)})
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("ignoring %s: not a regular file", path, extra={"path": str(path)})
            return None
        data = os.read(fd, _PGID_BYTES + 1)
    except OSError as exc:
        log.warning("ignoring %s: %s", path, exc.strerror or exc, extra={"path": str(path)})
        return None
    finally:
        os.close(fd)
    text = data.decode("ascii", errors="replace").strip()
    if len(data) > _PGID_BYTES or not text.isdigit() or int(text) <= 1:
        log.warning("ignoring %s: it holds no process group id", path, extra={"path": str(path)})
        return None
    return int(text)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:  # field 5: pgrp
                    members.append(int(entry.name))
    return members


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
