"""pip's option table (``agent.core.pip_options``) is the installed pip's own: every option of
``pip install`` (each spelling, and whether it takes a value) and every option pip reads from a
line of a requirements file, read from pip's parser; none is forgotten nor made up."""

from __future__ import annotations

import optparse

from pip._internal.commands import create_command
from pip._internal.req import req_file

from agent.core.pip_options import ALLOWED, PIP_INSTALL, PIP_ONLY, REFUSED, REQUIREMENTS_FILE


def _spellings(options: list[optparse.Option]) -> dict[str, bool]:
    return {s: o.takes_value() for o in options for s in (*o._long_opts, *o._short_opts)}


def test_the_table_is_pip_installs_own_option_table() -> None:
    parser = create_command("install").parser
    groups: list[optparse.OptionParser | optparse.OptionGroup] = [parser, *parser.option_groups]
    assert _spellings([o for g in groups for o in g.option_list]) == PIP_INSTALL


def test_the_requirements_file_lines_are_pips_own_but_those_reading_files_and_editables() -> None:
    pips = _spellings([make() for make in req_file.SUPPORTED_OPTIONS])
    taken_apart = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable"}
    assert pips.keys() - REQUIREMENTS_FILE.keys() == taken_apart
    assert {k: v for k, v in pips.items() if k not in taken_apart} == REQUIREMENTS_FILE


def test_allowed_is_the_table_but_the_refused_and_pip_only_is_within_it() -> None:
    assert ALLOWED.keys() == PIP_INSTALL.keys() - REFUSED.keys()
    assert ALLOWED.keys() >= PIP_ONLY
    assert all(reason for reason in REFUSED.values())
