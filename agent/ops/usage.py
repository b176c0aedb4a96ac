"""Command lines' usage mistakes as one line: what is wrong and where the usage is, exit 2.

argparse prints its whole usage above the error (26 lines for ``rtenv-agent serve``) and
echoes a mistaken argument whole, newlines and all. ``rtenv-agent`` and ``scripts/bench.py``
parse with ``OneLineParser``: the error alone, the argument it echoes cut to ``ECHO_CHARS``
with control characters escaped. (``raylet-sim`` has its own, as it imports nothing of the
agent.)
"""

from __future__ import annotations

import argparse
from typing import NoReturn

ECHO_CHARS = 600  # of an argparse message (a mistaken argument may be any size; the
# longest list of choices, bench.py --only, is 317 characters)


def one_line(message: str) -> str:
    """``message`` on one line: control characters escaped, cut to ``ECHO_CHARS``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message[:ECHO_CHARS])
    return text if len(message) <= ECHO_CHARS else f"{text}... ({len(message)} characters)"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one line; its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")
