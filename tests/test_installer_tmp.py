"""The installer's temp dir is inside its staging folder: pip killed mid-install (a setup
timeout, a crash) used to leave its pip-* folders in the machine's temp dir, for ever; now they
go with the staging folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.core.pip_spec import parse_pip
from agent.install.venvs.build import build_venv


async def test_every_installer_step_gets_a_tmpdir_inside_the_staging_folder(base: Path) -> None:
    record = base / "tmpdirs.txt"
    python = base / "fake-python"  # stands in for both steps: venv, then pip; records TMPDIR
    python.write_text(f'#!/bin/sh\necho "$TMPDIR" >> {record}\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    staging = base / "staging"
    staging.mkdir()
    spec = parse_pip(["anything"])
    assert spec is not None
    await build_venv(
        spec, staging, python=str(python), installer="pip", log_path=base / "install.log",
        label="probe",
    )  # fmt: skip
    seen = record.read_text().splitlines()
    assert seen == [str(staging / "installer-tmp")] * 2, seen
    assert (staging / "installer-tmp").is_dir()
    assert os.environ.get("TMPDIR") != seen[0], "the agent's own temp dir is unchanged"
