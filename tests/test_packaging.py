"""Packaging: a wheel built from the checkout's files ships the .proto (client authors need it)
and the license (Apache-2.0, as an SPDX expression, with its text); the .proto in the package
is a link to the .proto; constraints.txt pins what pyproject.toml asks for."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROTO = REPO / "proto" / "rtenv" / "v1" / "agent.proto"
_SKIP = {".git", ".venv", "node_modules", "build", "__pycache__", ".mypy_cache", ".ruff_cache",
         ".pytest_cache", ".hypothesis"}  # fmt: skip


def test_the_packaged_proto_is_a_link_to_the_proto_not_a_copy() -> None:
    packaged = REPO / "rtenv" / "v1" / "agent.proto"
    assert packaged.is_symlink(), "rtenv/v1/agent.proto must link to proto/rtenv/v1/agent.proto"
    assert packaged.resolve() == PROTO.resolve()


def _source_files() -> list[Path]:
    """The checkout's files (tracked, or new and not ignored); without git, the tree less
    caches and environments."""
    if shutil.which("git") is not None and (REPO / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        return [Path(name) for name in listed.decode().split("\0") if name]
    return [
        p.relative_to(REPO)
        for p in REPO.rglob("*")
        if p.is_file() and not _SKIP & set(p.relative_to(REPO).parts)
    ]


def test_the_wheel_ships_the_proto_and_the_license(base: Path) -> None:
    source = base / "src"
    for name in _source_files():
        if (REPO / name).is_file():  # a file deleted but not yet committed is listed too
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(base / "dist"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (base / "dist").glob("runtime_env_agent-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "rtenv/v1/agent.proto" in names, sorted(names)
        assert zf.read("rtenv/v1/agent.proto") == PROTO.read_bytes()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = zf.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: Apache-2.0" in headers
        assert "License-File: LICENSE" in headers
        [license_text] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"Apache License" in zf.read(license_text)
    assert "Apache License" in (REPO / "LICENSE").read_text()


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not a pin"
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def test_constraints_pin_every_direct_requirement_within_its_bounds() -> None:
    """constraints.txt (used by the README's test command, hence CI) pins each dependency, dev
    tool and the extra 'fast' (CI's second pass, on uvloop) to a version pyproject.toml allows:
    raising a bound past a pin fails here."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["dev"], *extras["fast"]]
    for text in wanted:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} vs {text}"
    assert "pip install -q -c constraints.txt -e '.[dev]'" in (REPO / "README.md").read_text()
