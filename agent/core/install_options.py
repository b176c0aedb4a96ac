"""An installer's options checked against its table: whole spellings only, refused ones with
their reason, and each place an option reads packages from checked as every place is
(``agent.core.places``). The tables are the tool's data: ``agent.core.pip_options`` for pip,
``agent.core.uv_spec`` for uv.

Used for an env's install options (``pip_install_options``, ``uv_pip_install_options``) and for
the option lines of its package list (``--extra-index-url URL``, as a requirements file holds
it: ``option_tokens`` splits a line as pip does, with ``shlex``).

Pure but for ``realpath`` and ``isdir`` of the local paths it names.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as _field
from types import MappingProxyType

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo
from agent.core.places import check_place
from agent.core.roots import FileRoots

FIND_LINKS = ("-f", "--find-links")
# pip's and uv's (--pypi-url is pip's old name of --index-url; the last two are uv's)
INDEXES = ("-i", "--index-url", "--pypi-url", "--extra-index-url", "--index", "--default-index")
_NO_SPLITS: Mapping[str, str] = MappingProxyType({})
_NAMED = ("--index", "--default-index")  # uv's: a place may have a name (``name=URL``)
_EDITABLE = ("-e", "--editable")
NOT_PASSED = (
    "options that write outside the env's venv, such as --target, --prefix, --user, --root, "
    "or read files of requirements, such as -r, -c, are refused; so are abbreviations and "
    "short options run together"
)


@dataclass(frozen=True, slots=True)
class OptionTables:
    """A tool's options, as data: those an env may pass (each full spelling, and whether it
    takes a value), those refused with why, those taken as a line of its package list (none:
    such a line is refused, naming the options field) and those dropped (Ray's defaults that
    mean nothing here). How the tool reads its values and lines: ``splits``, the options whose
    value it splits into several places, at that delimiter (" ": any whitespace);
    ``ignored_lines``, lines it reads and ignores (taken, and left out); ``one_option_a_line``,
    a line is one option and its value, up to a ``#`` (uv's), not pip's words of a line."""

    allowed: Mapping[str, bool]
    refused: Mapping[str, str]
    lines: Mapping[str, bool]
    dropped: Collection[str] = ()
    tool: str = "pip"
    splits: Mapping[str, str] = _field(default_factory=dict)
    ignored_lines: Collection[str] = ()
    one_option_a_line: bool = False


def option_tokens(text: str, where: str) -> list[str]:
    """An option line's words, as pip splits a requirements file's options (``shlex``)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise InvalidRuntimeEnv(
            f"{where} {echo(text)} cannot be split into options: {exc}"
        ) from exc


def read_option_line(
    text: str, where: str, roots: FileRoots, options_field: str, tables: OptionTables
) -> tuple[str, ...] | None:
    """An option line of a package list, as the tool reads it in a requirements file: its words
    (pip's: ``shlex``; uv's: one option and its value, up to a ``#``), each checked against
    ``tables.lines``; None for a line the tool reads and ignores."""
    if tables.one_option_a_line:
        text = text.partition("#")[0].strip()  # uv's value ends at a '#': a comment follows
    words = tuple(option_tokens(text, where))
    if words and words[0].partition("=")[0] in tables.ignored_lines:
        return None  # the tool ignores the line, and its value: so does the agent
    not_passed = (
        f"a line may hold the options {tables.tool} reads from a requirements file: "
        f"{', '.join(flag for flag in tables.lines if flag.startswith('--'))}; pass any other "
        f"in {options_field}; abbreviations and short options run together are refused"
    )
    one = _one_option(words[0], tables.lines) if tables.one_option_a_line else None
    if one is not None and len(words) > one:
        raise InvalidRuntimeEnv(
            f"{where} {echo(text)} holds more than one option: {tables.tool} reads one option "
            "a line (the rest of the line is its value); write each on a line of its own"
        )
    check_options(words, roots, where, tables.lines, tables.refused, not_passed, tables.splits)
    return words


def _one_option(word: str, lines: Mapping[str, bool]) -> int | None:
    """How many words one option of a line is: 2 when its value is the next word; None when it
    is not one of ``lines`` (``check_options`` says why)."""
    flag, eq, _ = word.partition("=")
    if flag not in lines:
        return None
    return 2 if lines[flag] and not eq else 1


def check_options(
    options: Sequence[str],
    roots: FileRoots,
    field: str,
    allowed: Mapping[str, bool],
    refused: Mapping[str, str],
    not_passed: str = NOT_PASSED,
    splits: Mapping[str, str] = _NO_SPLITS,
) -> None:
    """Every option must be on the allow-list (``allowed``: each full spelling, and whether it
    takes a value), spelled in full; one of ``refused`` is refused with its reason, any other
    saying ``not_passed``; each place an option names to read packages from (``-f``, ``-i``,
    ``-e`` and their long names) must be allowed: each part of a value the tool splits
    (``splits``: uv's ``--find-links a,b``)."""
    i = 0
    while i < len(options):
        option = options[i]
        flag, eq, attached = option.partition("=")
        takes_value = allowed.get(flag)
        if flag in refused:
            raise InvalidRuntimeEnv(f"{field}: {echo(option)} is refused: {refused[flag]}")
        if takes_value is None or (eq and (not takes_value or not flag.startswith("--"))):
            raise InvalidRuntimeEnv(
                f"{field}: {echo(option)} is not an option an env may pass ({not_passed})"
            )
        value = attached
        if takes_value and not eq:
            if i + 1 >= len(options):
                raise InvalidRuntimeEnv(f"{field}: {echo(option)} needs a value")
            i += 1
            value = options[i]
        delimiter = splits.get(flag)
        parts = [value] if delimiter is None else _parts(value, delimiter)
        for part in parts:
            _check_value(flag, part, f"{field}: {flag}", roots)
        i += 1


def _parts(value: str, delimiter: str) -> list[str]:
    """The places of a value the tool splits (" ": at any whitespace, as uv's ``--index``)."""
    return value.split() if delimiter == " " else value.split(delimiter)


def _check_value(flag: str, value: str, where: str, roots: FileRoots) -> None:
    """The place an option reads packages from, if it names one, checked against the roots."""
    if flag in FIND_LINKS:
        path = check_place(value, where, roots, vcs=False)
        if path is not None and roots and not os.path.isdir(os.path.realpath(path)):
            raise InvalidRuntimeEnv(
                f"{where} {echo(value)} is not a folder: with allow-file-root set, a "
                "local --find-links must be a folder of archives (pip would follow an HTML "
                "page's links wherever they lead)"
            )
    elif flag in INDEXES:
        path = check_place(_unnamed(flag, value), where, roots, vcs=False)
        if path is not None and roots:
            raise PermissionDenied(
                f"{where} {echo(value)} is a local index, refused with allow-file-root "
                "set (its pages may link anywhere); name a folder of archives inside the "
                "allowed roots with --find-links instead"
            )
    elif flag in _EDITABLE and check_place(value, where, roots, vcs=True) and not roots:
        raise PermissionDenied(
            f"{where} {echo(value)}: an editable install of a local path needs the "
            "allow-file-root setting, and the path inside one of its folders"
        )


def _unnamed(flag: str, value: str) -> str:
    """uv's ``--index`` and ``--default-index`` take a name before the URL
    (``pytorch=https://...``): a ``=`` before any ``:``; the URL is the place."""
    name, eq, url = value.partition("=")
    return url if flag in _NAMED and eq and ":" not in name else value


def pick(
    options: Sequence[str], wanted: Collection[str], takes: Mapping[str, bool]
) -> tuple[str, ...]:
    """The options of ``wanted`` among ``options`` (already checked against ``takes``: each
    spelling and whether it takes a value), each with its value, in their order."""
    out: list[str] = []
    i = 0
    while i < len(options):
        flag, eq, _ = options[i].partition("=")
        end = i + (2 if takes.get(flag, False) and not eq else 1)
        if flag in wanted:
            out.extend(options[i:end])
        i = end
    return tuple(out)
