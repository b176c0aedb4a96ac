"""Requirements files of an env's installed working dir, read (``agent.core.wd_requirements``
says which lines name them and what is taken).

Blocking: call ``read_field`` in a thread. Each file is opened once, under the working dir and
nowhere else (its real path checked), a regular file (``O_NOFOLLOW``, non-blocking open: a FIFO
never waits) of at most ``MAX_FILE_BYTES``; ``-r`` lines in them name files beside them, at
most ``MAX_FILES`` in all, each read once as Ray's hash reads them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from agent.core.errors import InvalidRuntimeEnv, echo
from agent.core.wd_requirements import (
    FILE_LINE,
    MAX_FILE_BYTES,
    MAX_FILES,
    VARIABLE_RE,
    WdRequirements,
    file_of,
)


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
        if isinstance(line, str) and VARIABLE_RE.search(line) is not None:
            name = file_of(line, f"{wd.tool}.packages[{index}]")
            _read_into(out, root, root / name, seen, label)
        else:
            out.append(line)
    if isinstance(value, dict):
        return {**value, "packages": out}
    return out


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
        match = FILE_LINE.fullmatch(line)
        if match is None:
            out.append(line)
        elif VARIABLE_RE.match(match["path"]) is not None:
            _read_into(out, root, root / file_of(line, f"{label}: {shown}"), seen, label)
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
