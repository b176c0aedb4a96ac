"""Offline pip material for the pip tests: a wheelhouse built with ``pip wheel`` from tiny local
projects, a source distribution whose build backend never finishes, and process probes.

Nothing here touches a package index: wheels are built with ``--no-index --no-build-isolation``
and every install in the tests passes ``--no-index --find-links <dir>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

# module -> (its VALUE, its dependencies)
PROJECTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alpha_pkg": ("alpha 1.0", ()),
    "beta_pkg": ("beta 1.0", ()),
    "gamma_pkg": ("gamma 1.0", ("alpha-pkg",)),  # resolved from the wheelhouse too
}
SLOW = "slowpkg"  # the sdist whose build never ends
WHEEL_BUILD_S = 180.0


def hermetic_pip_environ() -> dict[str, str]:
    """This process's environment without the machine's pip configuration (config files,
    find-links): an install sees only what its own options name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def isolate_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give this process (and the agents and installers it starts) ``hermetic_pip_environ``."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in hermetic_pip_environ().items():
        if key.startswith("PIP_"):
            monkeypatch.setenv(key, value)


SCRIPT = "alpha-hello"  # alpha's console script: pip writes it with a shebang into the venv


def _write_project(folder: Path, module: str, value: str, deps: Sequence[str]) -> None:
    folder.mkdir(parents=True)
    (folder / module).mkdir()
    (folder / module / "__init__.py").write_text(
        f"VALUE = {value!r}\n\n\ndef hello() -> None:\n    print(VALUE)\n"
    )
    scripts = f'[project.scripts]\n"{SCRIPT}" = "{module}:hello"\n' if module == "alpha_pkg" else ""
    (folder / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n'
        "[project]\n"
        f'name = "{module}"\n'
        'version = "1.0"\n'
        f"dependencies = {json.dumps(list(deps))}\n"
        f"{scripts}"
        "[tool.setuptools]\n"
        f'packages = ["{module}"]\n'
    )


def build_wheelhouse(dest: Path) -> Path:
    """Build one wheel per project of PROJECTS into ``dest/wheels`` with one ``pip wheel``."""
    sources = dest / "src"
    for module, (value, deps) in PROJECTS.items():
        _write_project(sources / module, module, value, deps)
    wheels = dest / "wheels"
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--no-index", "--quiet", "-w", str(wheels),
            *(f"./{module}" for module in PROJECTS),
        ],
        cwd=sources, env=hermetic_pip_environ(), capture_output=True, text=True,
        timeout=WHEEL_BUILD_S, check=False,
    )  # fmt: skip
    built = sorted(p.name for p in wheels.glob("*.whl")) if wheels.exists() else []
    report = f"pip wheel exited with {done.returncode}, built {built}:\n{done.stdout}{done.stderr}"
    assert done.returncode == 0, report
    assert len(built) == len(PROJECTS), report
    return wheels


def offline(find_links: Path | str) -> list[str]:
    return ["--no-index", "--find-links", str(find_links)]


def pip_env(packages: Sequence[str], find_links: Path | str, **extra: Any) -> str:
    """A runtime env JSON whose pip set installs offline from ``find_links``."""
    env: dict[str, Any] = {
        "pip": {"packages": list(packages), "pip_install_options": offline(find_links)},
        **extra,
    }
    return json.dumps(env)


# -- local projects, built by a backend of their own -----------------------------------------

_LOCAL_BACKEND = """\
import base64, hashlib, os, zipfile
NAME, VALUE, FAIL_WITH = {name!r}, {value!r}, {fail_with!r}


def _wheel(directory, files):
    if FAIL_WITH:  # a build that fails, quoting a file it read
        print("the backend read:", open(FAIL_WITH).read())
        raise RuntimeError(open(FAIL_WITH).read())
    dist = NAME + "-1.0"
    meta = f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: 1.0\\n"
    files[dist + ".dist-info/METADATA"] = meta
    files[dist + ".dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    )
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{{path}},sha256={{b64}},{{len(text.encode())}}")
    files[dist + ".dist-info/RECORD"] = "\\n".join([*record, dist + ".dist-info/RECORD,,"]) + "\\n"
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {{NAME + "/__init__.py": f"VALUE = {{VALUE!r}}\\n"}})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    return _wheel(wheel_directory, {{NAME + ".pth": here + "\\n"}})
"""


def local_project(folder: Path, module: str, value: str, *, fail_with: Path | None = None) -> Path:
    """A project in ``folder`` that installs ``module`` (whose VALUE is ``value``), built by an
    in-tree backend that needs nothing (no setuptools, no index): pip builds it offline, as a
    wheel or editable. With ``fail_with``, its build prints that file and fails quoting it."""
    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(f"VALUE = {value!r}\n")
    (folder / "pyproject.toml").write_text(
        "[build-system]\nrequires = []\n"
        'build-backend = "local_backend"\nbackend-path = ["."]\n'
        f'[project]\nname = "{module}"\nversion = "1.0"\n'
    )
    backend = _LOCAL_BACKEND.format(
        name=module, value=value, fail_with=str(fail_with) if fail_with else ""
    )
    (folder / "local_backend.py").write_text(backend)
    return folder


def git_repo(folder: Path) -> Path:
    """Commit everything in ``folder`` into a new git repository there (git's own config and
    the user's ignored)."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
    for args in (["init", "-q"], ["add", "-A"], [*ident, "commit", "-q", "-m", "project"]):
        subprocess.run(["git", *args], cwd=folder, env=env, check=True, timeout=30)
    return folder


# -- a build that never ends -----------------------------------------------------------------

_BACKEND = """\
import os, subprocess, sys, time
# Imported by pip's build-hook process: start a child of our own (the installer's group gets
# deeper), say who we are, then never finish.
_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open({pidfile!r} + ".tmp", "w") as f:
    f.write(f"{{os.getpid()}} {{_child.pid}}")
os.rename({pidfile!r} + ".tmp", {pidfile!r})
time.sleep(600)
"""


def slow_sdist(folder: Path) -> Path:
    """Write ``folder/slowpkg-1.0.tar.gz``, an sdist whose in-tree build backend, once pip runs
    it, writes '<its pid> <its child's pid>' to the returned pid file and sleeps. Installing
    ``slowpkg`` with ``--find-links folder --no-build-isolation`` is an installer that hangs
    two processes below pip, deterministically and offline."""
    folder.mkdir(parents=True, exist_ok=True)
    pidfile = folder / "backend.pids"
    top = f"{SLOW}-1.0"
    files = {
        f"{top}/pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "slow_backend"\nbackend-path = ["."]\n'
        ),
        f"{top}/slow_backend.py": _BACKEND.format(pidfile=str(pidfile)),
        f"{top}/PKG-INFO": f"Metadata-Version: 2.1\nName: {SLOW}\nVersion: 1.0\n",
    }
    with tarfile.open(folder / f"{top}.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return pidfile


def slow_env(folder: Path, **extra: Any) -> str:
    """An env whose install hangs in the build backend of the sdist ``slow_sdist`` wrote."""
    options = [*offline(folder), "--no-build-isolation"]
    return json.dumps({"pip": {"packages": [SLOW], "pip_install_options": options}, **extra})


def read_pids(pidfile: Path) -> list[int]:
    return [int(word) for word in pidfile.read_text().split()]


# -- processes -------------------------------------------------------------------------------


async def run(
    *args: str, env: dict[str, str] | None = None, cwd: str | None = None, timeout_s: float = 30
) -> tuple[int, str, str]:
    """Run a process to its end, within a deadline (killed by its PID if it overstays);
    return its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed orphan may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def survivors(pids: Iterable[int]) -> dict[int, str]:
    """The live ones among ``pids``, each with its command line (for a failure's message)."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            if alive(pid):
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a staging path, say)."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def reaped(pids: set[int]) -> Iterator[set[int]]:
    """Yield ``pids`` for the test to fill with the processes it caused; whatever the test ends
    with, SIGKILL those still alive (a failed test must leave no ten-minute sleeper behind)."""
    try:
        yield pids
    finally:
        kill_all(pids)


def kill_all(pids: Iterable[int]) -> None:
    """Clean-up of processes a test caused and found by PID: SIGKILL each still alive."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
