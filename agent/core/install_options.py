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

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo
from agent.core.places import check_place
from agent.core.roots import FileRoots

FIND_LINKS = ("-f", "--find-links")
# pip's and uv's (--pypi-url is pip's old name of --index-url; the last two are uv's)
INDEXES = ("-i", "--index-url", "--pypi-url", "--extra-index-url", "--index", "--default-index")
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
    mean nothing here)."""

    allowed: Mapping[str, bool]
    refused: Mapping[str, str]
    lines: Mapping[str, bool]
    dropped: Collection[str] = ()


def option_tokens(text: str, where: str) -> list[str]:
    """An option line's words, as pip splits a requirements file's options (``shlex``)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise InvalidRuntimeEnv(
            f"{where} {echo(text)} cannot be split into options: {exc}"
        ) from exc


def check_options(
    options: Sequence[str],
    roots: FileRoots,
    field: str,
    allowed: Mapping[str, bool],
    refused: Mapping[str, str],
    not_passed: str = NOT_PASSED,
) -> None:
    """Every option must be on the allow-list (``allowed``: each full spelling, and whether it
    takes a value), spelled in full; one of ``refused`` is refused with its reason, any other
    saying ``not_passed``; each place an option names to read packages from (``-f``, ``-i``,
    ``-e`` and their long names) must be allowed."""
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
        _check_value(flag, value, f"{field}: {flag}", roots)
        i += 1


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
        path = check_place(value, where, roots, vcs=False)
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
