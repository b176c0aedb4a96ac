"""``rtenv-agent serve --help`` from a checkout whose path has hyphens: a default such as the
agent's python (a path in that checkout) is wrapped at spaces only, never split at a hyphen or
inside a long path, so the help says the path as it is."""

from __future__ import annotations

import argparse

from agent.ops import options

LONG = "/tmp/ci-run-Ab3x/a-b-c/runtime-env-agent/.venv/bin/python3-with-a-long-name-too"


def test_help_never_splits_a_default_at_a_hyphen_or_inside_a_long_path() -> None:
    parser = argparse.ArgumentParser(prog="rtenv-agent serve")
    options.add_arguments(parser)
    parser.add_argument("--probe", help=f"the python workers start with (default {LONG})")
    text = parser.format_help()
    assert LONG in " ".join(text.split()), text
    assert "(default INFO; env RTENV_LOG_LEVEL)" in " ".join(text.split())
