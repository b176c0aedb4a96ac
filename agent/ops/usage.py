"""Command lines' usage mistakes as one line: what is wrong and where the usage is, exit 2.

argparse prints its whole usage above the error (26 lines for ``rtenv-agent serve``) and
echoes a mistaken argument whole, newlines and all. ``rtenv-agent`` and ``scripts/bench.py``
parse with ``OneLineParser``: the error alone, the argument it echoes cut to ``ECHO_CHARS``
with control characters escaped; an unknown flag is told by the (sub)command that was given
it, with the flag of that command closest to it (``closest``, which also suggests a config
file's keys). (``raylet-sim`` has its own, as it imports nothing of the agent.)
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

ECHO_CHARS = 600  # of an argparse message (a mistaken argument may be any size; the
# longest list of choices, bench.py --only, is 317 characters)


def one_line(message: str) -> str:
    """``message`` on one line: control characters escaped, cut to ``ECHO_CHARS``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message[:ECHO_CHARS])
    return text if len(message) <= ECHO_CHARS else f"{text}... ({len(message)} characters)"


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word ``word`` was most likely meant as (difflib's ratio, 0.6 at least), or
    None: a mistaken flag's or setting's "did you mean"."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return close[0] if close else None


class WrapAtSpaces(argparse.HelpFormatter):
    """argparse's help wrapped at spaces only: a path or a flag is never cut at its hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(
            " ".join(text.split()), width, break_on_hyphens=False, break_long_words=False
        )


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one line; its subcommands' parsers are of this class too."""

    _given_args: Sequence[str] = ()  # what the last parse of this parser was given

    def error(self, message: str) -> NoReturn:
        """The message, and what each unknown flag given was likely meant as: another mistake
        (``serve --rot X``: --root is missing) is often the unknown flag's."""
        if not message.startswith(_UNRECOGNIZED):
            message += _did_you_mean(self, self._given_args, each=True)
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        self._given_args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        """As argparse, but arguments nobody took are refused by the subcommand given them
        (argparse's top parser refused them, naming no subcommand's help), with the flag of
        that subcommand closest to each unknown flag."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            given = _given(self, parsed)
            hint = _did_you_mean(given, extras, each=False)
            given.error(f"{_UNRECOGNIZED}{' '.join(extras)}{hint}")
        return parsed


_UNRECOGNIZED = "unrecognized arguments: "


def _given(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that ``parsed`` went through (else ``parser``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _given(chosen, parsed)
    return parser


def _did_you_mean(parser: argparse.ArgumentParser, args: Sequence[str], *, each: bool) -> str:
    """For the flags among ``args`` that ``parser`` does not know (nor as an abbreviation) and
    that are close to one it knows: ' (did you mean --cache-budget?)', naming each unknown flag
    when there are several or ``each`` (the message names none): ' (did you mean --root for
    --rot?)'."""
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    pairs = []
    for arg in args:
        flag = arg.partition("=")[0]
        if not flag.startswith("--") or flag == "--" or any(f.startswith(flag) for f in flags):
            continue
        # by name, dashes aside: they would make '--bogus' close to '--rounds'
        if (match := closest(flag[2:], [f[2:] for f in flags])) is not None:
            pairs.append((f"--{match}", flag))
    if not pairs:
        return ""
    if len(pairs) == 1 and not each:
        return f" (did you mean {pairs[0][0]}?)"
    return f" (did you mean {', '.join(f'{m} for {f}' for m, f in pairs)}?)"
