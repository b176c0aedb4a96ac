"""Requirements a Ray env's working dir holds: ``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/<file>``
among the packages of its ``pip`` or ``uv`` field.

Ray's agent sets that variable to the env's unpacked working dir while it builds the env's
venv, and pip (or uv) reads the file there (Ray's docs' example, and its test
``test_working_dir_applies_for_uv_creation``). Here, where the door's dialect reads them
(``Dialect.wd_requirements``: the Ray door's):

- At parse, ``split`` sees such lines: the env then names no venv of its own; it keeps the field
  as given (``WdRequirements``: its identity, beside the working dir's URI).
- Its create, once the working dir is installed, reads the files (``agent.install.venvs.wd_read``'s
  ``read_field``: each under the working dir and nowhere else, a regular file of at most
  ``MAX_FILE_BYTES``; ``-r`` lines in them name files beside them, at most ``MAX_FILES`` in
  all, each read once as Ray's hash reads them) and gives back the field with each ``-r``
  line replaced by the lines of its file, in place. That field is then parsed as any ``pip``
  or ``uv`` field is (``agent.core.pip_spec``, ``uv_spec``): one venv per set of
  requirements, shared by every env whose files say the same.

The variable anywhere but at the start of a ``-r`` line's path is refused at parse, naming the
one form taken; so is a ``-r`` line where the dialect reads no such files (the gRPC door's: it
has no working dir to read from).

Pure: no I/O (the files are read by ``agent.install.venvs.wd_read``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.dialect import Dialect
from agent.core.errors import InvalidRuntimeEnv, echo
from agent.core.kinds import NodeSite
from agent.core.pip_spec import PipSpec, parse_pip
from agent.core.roots import FileRoots
from agent.core.uris import UriKind
from agent.core.uv_spec import UvSpec, parse_uv

VARIABLE = "RAY_RUNTIME_ENV_CREATE_WORKING_DIR"
MAX_FILE_BYTES = 256 * 1024  # a requirements file, read
MAX_FILES = 16  # requirements files read for one env, nested ones included

FILE_LINE = re.compile(r"(?:-r|--requirement)(?:\s*=\s*|\s+|(?=\$))(?P<path>\S.*)")
VARIABLE_RE = re.compile(rf"\$\{{{VARIABLE}\}}|\${VARIABLE}\b")
_FORM = f"'-r ${{{VARIABLE}}}/<file>'"


@dataclass(frozen=True, slots=True)
class WdRequirements:
    """A ``pip`` or ``uv`` field that reads files of the env's working dir."""

    tool: str  # "pip" or "uv": the field
    value: str  # the field as given, as canonical JSON
    kind: UriKind  # the kind of the venv its files make (the dialect's)
    sees: NodeSite | None  # what that venv sees of the node (``PipSpec.sees``)

    def identity(self) -> object:
        return {"from_working_dir": json.loads(self.value)}

    def rest(self) -> object:
        """The field without the lines naming files: checked at parse as the field is."""
        value = json.loads(self.value)
        if isinstance(value, dict):
            return {**value, "packages": _others(value["packages"])}
        return _others(value)


def _others(packages: list[object]) -> list[object]:
    return [p for p in packages if not (isinstance(p, str) and VARIABLE_RE.search(p) is not None)]


def split(
    tool: str, value: object, kind: UriKind, sees: NodeSite | None = None
) -> WdRequirements | None:
    """The field as one that reads files of the working dir, or None if no package line does
    (the field is then parsed as it is). A line using the variable otherwise is refused."""
    packages = value.get("packages") if isinstance(value, dict) else value
    if not isinstance(packages, list):
        return None
    reads = False
    for index, line in enumerate(packages):
        if isinstance(line, str) and VARIABLE_RE.search(line) is not None:
            file_of(line, f"{tool}.packages[{index}]")
            reads = True
    if not reads:
        return None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return WdRequirements(tool, text, kind, sees)


def file_of(line: str, where: str) -> str:
    """The path, under the working dir, that a line using the variable names."""
    match = FILE_LINE.fullmatch(line.strip())
    variable = None if match is None else VARIABLE_RE.match(match["path"])
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


def venv_spec(
    wd: WdRequirements, value: object, file_roots: Sequence[str] | FileRoots
) -> PipSpec | UvSpec | None:
    """The set of the field its files gave (``agent.install.venvs.wd_read.read_field``), as the
    env's ``pip`` or ``uv`` field makes it (seeing what ``wd.sees``); None if its files name no
    requirement."""
    parse = parse_pip if wd.tool == "pip" else parse_uv
    spec = parse(value, file_roots=file_roots)
    if spec is None or wd.sees is None:
        return spec
    return dataclasses.replace(spec, sees=wd.sees)


def wd_requirements_of(
    tool: str,
    value: object,
    obj: Mapping[str, Any],
    dialect: Dialect,
    kind: UriKind,
    sees: NodeSite | None,
    file_roots: Sequence[str] | FileRoots,
) -> WdRequirements | None:
    """The env's ``tool`` field (``value``; the env is ``obj``) when it reads requirements files
    of the working dir, where the dialect reads them (``Dialect.wd_requirements``), its venv
    of ``kind`` seeing ``sees``; the rest of the field checked now."""
    found = split(tool, value, kind, sees)
    if found is None:
        return None
    if not dialect.wd_requirements:
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
    parse = parse_pip if tool == "pip" else parse_uv
    parse(found.rest(), file_roots=file_roots)
    return found
