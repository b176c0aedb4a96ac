"""``rtenv-agent ray <args>``: Ray's own CLI (``ray start``, ``ray stop``, ...), run in this
process with ``agent.ray.install()`` done, so that the raylet ``ray start`` starts runs this agent.
Ray's exit code is passed through; a mistake of ours (Ray not installed) is one line, exit 2."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agent.ray import install

PROG = "rtenv-agent ray"


def main(argv: Sequence[str]) -> int:
    try:
        from ray.scripts import scripts
    except ImportError as exc:
        print(
            f"{PROG}: Ray is not installed here ({exc}); install it (pip install 'ray[default]') "
            "in the python that runs rtenv-agent",
            file=sys.stderr,
        )
        return 2
    install()
    try:
        scripts.cli.main(args=list(argv), prog_name=PROG, standalone_mode=True)
    except SystemExit as exc:
        return _exit_code(exc.code)
    return 0


def _exit_code(code: object) -> int:
    """SystemExit's code as a process's: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
