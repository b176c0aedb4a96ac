"""Build a virtualenv for a pip spec, in a staging folder, with the installer as a subprocess.

``python -m venv --without-pip`` makes the venv (fast: no ensurepip), then the installer puts
the requirements in it: ``pip --python <venv python> install`` (the agent's own pip), or ``uv pip
install`` when ``pip-installer`` is ``uv`` and uv is on PATH. The installer's output goes to a
log file under the root; a failure is FAILED_PRECONDITION with the log's last lines. The
installer runs in its own process group, and is killed with its whole group if the install is
cancelled (a setup timeout, the last create gone); it also dies with the agent (PDEATHSIG).

Scripts that the installer wrote carry the staging path in their shebang; they are rewritten to
the final path before the one rename into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

from agent.errors import FailedPrecondition
from agent.pip_spec import PipSpec

log = logging.getLogger(__name__)

_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1


class InstallerFailed(FailedPrecondition):
    pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def _run(args: Sequence[str], log_path: Path, label: str) -> None:
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(out, f"$ {' '.join(args)}\n".encode())
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
    finally:
        os.close(out)
    try:
        code = await proc.wait()
    except BaseException:  # cancelled: the whole group goes, now
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        raise
    if code != 0:
        tail = await asyncio.to_thread(_tail, log_path)
        raise InstallerFailed(
            f"{label}: {os.path.basename(args[0])} exited with {code}; the end of its log "
            f"({log_path}):\n{tail}"
        )


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-_TAIL_LINES:])


async def build_venv(
    spec: PipSpec,
    staging: Path,
    *,
    python: str,
    installer: str,
    log_path: Path,
    label: str,
) -> Path:
    """Make ``staging/venv`` with the spec installed; return it."""
    venv = staging / "venv"
    uv = shutil.which("uv") if installer == "uv" else None
    if uv is not None:
        await _run([uv, "venv", "--quiet", "--python", python, str(venv)], log_path, label)
        install = [uv, "pip", "install", "--python", str(venv / "bin" / "python")]
    else:
        await _run([python, "-m", "venv", "--without-pip", str(venv)], log_path, label)
        install = [
            python, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
            "--disable-pip-version-check", "--no-input",
        ]  # fmt: skip
    await _run([*install, *spec.options, *spec.packages], log_path, label)
    return venv


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
            path.write_bytes(data.replace(old, new))
    cfg = venv / "pyvenv.cfg"
    if cfg.exists():
        cfg.write_bytes(cfg.read_bytes().replace(old, new))
