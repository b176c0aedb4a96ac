"""Offline material for the uv tests: wheels written by hand (a zip with its .dist-info, no
build), one of them large and incompressible, and an environment in which any attempt of an
installer to reach an index fails on loopback.

Nothing here touches a package index: every install names ``--no-index --find-links <dir>``
or a ``file:`` direct reference, and ``no_network`` points every proxy variable at a closed
port of 127.0.0.1, so an installer that tried the network would fail at once, not reach out.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

BIG = "bigdep"  # the large dependency the sets share
MiB = 1024 * 1024
_CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there
_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(_SCRIPTS) not in sys.path:  # the benchmark's parts, as test_chaos reaches the runner's
    sys.path.append(str(_SCRIPTS))
from benchlib.wheels import write_wheel as bench_wheel  # noqa: E402


def write_wheel(
    directory: Path, name: str, *, payload: int = 0, deps: Sequence[str] = (), seed: int = 0
) -> Path:
    """``directory/<name>-1.0-py3-none-any.whl`` (the benchmark's wheel writer): module
    ``name`` (its VALUE ``'<name> 1.0'``), with ``payload`` bytes of random data beside it
    (stored, so the wheel is as large), and ``deps`` as its requirements."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {"payload.bin": _random(payload, seed)} if payload else {}
    return bench_wheel(directory, name, data, deps, value=f"{name} 1.0")


def _random(size: int, seed: int) -> bytes:
    """Incompressible bytes, reproducible from ``seed``."""
    return random.Random(seed).randbytes(size)


def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every proxy variable at a closed loopback port: an installer's request for an index
    fails there (uv and pip honour them), never leaves the machine."""
    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(key, _CLOSED)


def uv_env(packages: Sequence[str], find_links: Path, **extra: Any) -> str:
    """A runtime env JSON whose uv set installs offline from ``find_links``."""
    options = ["--no-index", "--find-links", str(find_links)]
    return json.dumps({"uv": {"packages": list(packages), "uv_pip_install_options": options},
                       **extra})  # fmt: skip


def du_bytes(path: Path) -> int:
    """``du -sb``: apparent bytes under ``path``, each hardlinked inode counted once."""
    done = subprocess.run(
        ["du", "-sb", str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return int(done.stdout.split()[0])


def have_uv() -> bool:
    from agent.install.venvs.wheel_cache import find_uv

    return find_uv() is not None and shutil.which("du") is not None and os.name == "posix"


def module_wheel(folder: Path, module: str, value: str) -> Path:
    """A pure-python wheel of ``module`` (its VALUE ``value``) in ``folder``, built by the
    benchmark's builder: ``<module>-1.0-py3-none-any.whl``."""
    return bench_wheel(folder, module, {}, value=value)


def agents_uv_version() -> str:
    """The version the agent's uv tells (``uv --version``: "uv 0.13.9 (...)")."""
    from agent.install.venvs.wheel_cache import find_uv

    uv = find_uv()
    assert uv is not None
    done = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()[1]
