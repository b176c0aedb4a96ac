"""Requirements a Ray env's working dir holds: ``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/<file>``
among the packages of its ``pip`` or ``uv`` field.

Ray's agent sets that variable to the env's unpacked working dir while it builds the env's
venv, and pip (or uv) reads the file there (Ray's docs' example, and its test
``test_working_dir_applies_for_uv_creation``). Here, at the Ray door only:

- At parse, ``split`` sees such lines: the env then names no venv of its own; it keeps the field
  as given (``WdRequirements``: its identity, beside the working dir's URI).
- Its create, once the working dir is installed, reads the files (``read_field``: each under the
  working dir and nowhere else, a regular file of at most ``MAX_FILE_BYTES``; ``-r`` lines in
  them name files beside them, at most ``MAX_FILES`` in all, each read once as Ray's hash reads
  them) and gives back the field with each ``-r`` line replaced by the lines of its file, in
  place. That field is then parsed as any ``pip`` or ``uv`` field is (``agent.core.pip_spec``,
  ``uv_spec``): one venv per set of requirements, shared by every env whose files say the same.

The variable anywhere but at the start of a ``-r`` line's path is refused at parse, naming the
one form taken; so is a ``-r`` line of the gRPC door, which has no working dir to read from.
Pure but for ``read_field`` (blocking: call it in a thread).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import InvalidRuntimeEnv, echo
from agent.core.pip_spec import PipSpec, parse_pip
from agent.core.roots import FileRoots
from agent.core.uv_spec import UvSpec, parse_uv

VARIABLE = "RAY_RUNTIME_ENV_CREATE_WORKING_DIR"
MAX_FILE_BYTES = 256 * 1024  # a requirements file, read
MAX_FILES = 16  # requirements files read for one env, nested ones included

_FILE_LINE = re.compile(r"(?:-r|--requirement)(?:\s*=\s*|\s+|(?=\$))(?P<path>\S.*)")
_VARIABLE = re.compile(rf"\$\{{{VARIABLE}\}}|\${VARIABLE}\b")
_FORM = f"'-r ${{{VARIABLE}}}/<file>'"


@dataclass(frozen=True, slots=True)
class WdRequirements:
    """A ``pip`` or ``uv`` field that reads files of the env's working dir."""

    tool: str  # "pip" or "uv": the field
    value: str  # the field as given, as canonical JSON
    node_python: str  # the node's python whose site folders the venv sees (``PipSpec``'s)

    def identity(self) -> object:
        return {"from_working_dir": json.loads(self.value)}

    def rest(self) -> object:
        """The field without the lines naming files: checked at parse as the field is."""
        value = json.loads(self.value)
        if isinstance(value, dict):
            return {**value, "packages": _others(value["packages"])}
        return _others(value)


def _others(packages: list[object]) -> list[object]:
    return [p for p in packages if not (isinstance(p, str) and _VARIABLE.search(p) is not None)]


def split(tool: str, value: object, node_python: str = "") -> WdRequirements | None:
    """The field as one that reads files of the working dir, or None if no package line does
    (the field is then parsed as it is). A line using the variable otherwise is refused."""
    packages = value.get("packages") if isinstance(value, dict) else value
    if not isinstance(packages, list):
        return None
    reads = False
    for index, line in enumerate(packages):
        if isinstance(line, str) and _VARIABLE.search(line) is not None:
            _file_of(line, f"{tool}.packages[{index}]")
            reads = True
    if not reads:
        return None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return WdRequirements(tool, text, node_python)


def _file_of(line: str, where: str) -> str:
    """The path, under the working dir, that a line using the variable names."""
    match = _FILE_LINE.fullmatch(line.strip())
    variable = None if match is None else _VARIABLE.match(match["path"])
    if match is None or variable is None:
        raise InvalidRuntimeEnv(
            f"{where} {echo(line)} uses ${{{VARIABLE}}} outside the one form this agent takes, "
            f"{_FORM} (a requirements file of the env's working dir)"
        )
    rest = match["path"][variable.end() :].strip()
    if not rest.startswith("/") or not rest.strip("/"):
        raise InvalidRuntimeEnv(
            f"{where} {echo(line)} names no file under the working dir: {_FORM}"
        )
    return rest.strip("/")


def read_field(wd: WdRequirements, folder: Path, label: str) -> object:
    """The field with each ``-r`` line of the working dir replaced by its file's lines (nested
    ones too), read from ``folder``, the installed working dir. Blocking."""
    value = json.loads(wd.value)
    packages = value.get("packages") if isinstance(value, dict) else value
    assert isinstance(packages, list)
    root = Path(os.path.realpath(folder))
    seen: set[Path] = set()
    out: list[str] = []
    for index, line in enumerate(packages):
        if isinstance(line, str) and _VARIABLE.search(line) is not None:
            name = _file_of(line, f"{wd.tool}.packages[{index}]")
            _read_into(out, root, root / name, seen, label)
        else:
            out.append(line)
    if isinstance(value, dict):
        return {**value, "packages": out}
    return out


def venv_spec(
    wd: WdRequirements, value: object, file_roots: Sequence[str] | FileRoots
) -> PipSpec | UvSpec | None:
    """The set of the field ``read_field`` gave, as the Ray door's ``pip`` or ``uv`` field
    makes it (Ray's semantics: ``node_site``); None if its files name no requirement."""
    parse = parse_pip if wd.tool == "pip" else parse_uv
    spec = parse(value, file_roots=file_roots)
    if spec is None:
        return None
    return dataclasses.replace(spec, node_site=True, node_python=wd.node_python)


def of_fields(
    obj: Mapping[str, Any],
    *,
    node_site: bool,
    node_python: str,
    file_roots: Sequence[str] | FileRoots,
) -> WdRequirements | None:
    """The env's ``pip`` or ``uv`` field when it reads requirements files of the working dir
    (``agent.core.wd_requirements``): the Ray door's only; the rest of the field checked now."""
    for tool, parse in (("pip", parse_pip), ("uv", parse_uv)):
        found = split(tool, obj.get(tool), node_python)
        if found is None:
            continue
        if not node_site:
            raise InvalidRuntimeEnv(
                f"{tool}.packages names a requirements file by ${{{VARIABLE}}}, which only "
                "Ray's agent sets (this agent reads such files at its Ray door); list the "
                f"requirements in {tool}.packages instead"
            )
        if obj.get("working_dir") is None:
            raise InvalidRuntimeEnv(
                f"{tool}.packages reads a requirements file of the working dir "
                f"(${{{VARIABLE}}}), but the env names no working_dir"
            )
        parse(found.rest(), file_roots=file_roots)
        return found
    return None


def _read_into(out: list[str], root: Path, path: Path, seen: set[Path], label: str) -> None:
    """Append the requirement lines of ``path`` (under ``root``), its own ``-r`` files read in
    place; a file read before is skipped (Ray's hash skips a circular reference)."""
    real = Path(os.path.realpath(path))
    shown = echo(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
    if not real.is_relative_to(root):
        raise InvalidRuntimeEnv(f"{label}: requirements file {shown} is outside the working dir")
    if real in seen:
        return
    if len(seen) >= MAX_FILES:
        raise InvalidRuntimeEnv(
            f"{label}: requirements file {shown} would be the {MAX_FILES + 1}th read for one env; "
            f"the limit is {MAX_FILES}"
        )
    seen.add(real)
    for line in _lines(real, shown, label):
        match = _FILE_LINE.fullmatch(line)
        if match is None:
            out.append(line)
        elif _VARIABLE.match(match["path"]) is not None:
            _read_into(out, root, root / _file_of(line, f"{label}: {shown}"), seen, label)
        else:
            _read_into(out, root, real.parent / match["path"].strip(), seen, label)


def _lines(path: Path, shown: str, label: str) -> list[str]:
    """A requirements file's lines as Ray reads them: an inline comment (after " #") and blank
    or comment lines dropped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidRuntimeEnv(
            f"{label}: the working dir has no requirements file {shown}"
        ) from None
    except OSError as exc:
        raise InvalidRuntimeEnv(
            f"{label}: cannot open requirements file {shown}: {exc.strerror}"
        ) from exc
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise InvalidRuntimeEnv(f"{label}: requirements file {shown} is not a regular file")
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InvalidRuntimeEnv(
            f"{label}: requirements file {shown} is over {MAX_FILE_BYTES} bytes (the limit)"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRuntimeEnv(f"{label}: requirements file {shown} is not UTF-8") from exc
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
