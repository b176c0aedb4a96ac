"""Command lines that must refuse their arguments: exit 2 with one line on stderr."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from tests.harness.tempdirs import short_tempdir


def assert_refused_in_one_line(command: list[str], args: list[str], prefix: str) -> None:
    """Run ``command ARGS`` (each ``FILE`` in them a path to a regular file): it must exit 2
    with one line, ``PREFIX...``, on stderr, nothing on stdout, and leave the file as it was."""
    base = short_tempdir()
    try:
        (base / "FILE").write_text("not a folder")
        argv = [a.replace("FILE", str(base / "FILE")) for a in args]
        proc = subprocess.run(
            [*command, *argv], capture_output=True, text=True, timeout=60,
            cwd=Path(__file__).resolve().parents[2], check=False,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert re.fullmatch(f"{prefix}.*\n", proc.stderr), proc.stderr
        assert (base / "FILE").read_text() == "not a folder"
    finally:
        shutil.rmtree(base, ignore_errors=True)
