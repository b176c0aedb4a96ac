"""Package lines that name a file or folder of the node, as Ray's agent passes them to pip (it
writes the list into a requirements file), classified when the set is parsed.

Taken, by ``pip`` and ``uv`` alike, each a ``LocalSource``:

- a wheel or sdist path, ``/abs/x-0.1.0-py3-none-any.whl``, ``/abs/x-0.1.0.tar.gz`` (any of
  pip's archive suffixes), or its ``file:`` URL, optionally with extras (``/abs/x.whl[extra]``);
- a project folder, ``/abs/pkg`` (``[extra]``) or ``file:///abs/pkg``: built from a copy;
- ``name @ file:///abs/...``, PEP 508's direct reference to either, with extras and a marker;
- ``-e /abs/pkg`` (``--editable``, ``-e file:///abs/pkg``): an editable install of a folder,
  which, as the option ``-e`` does, needs allow-file-root set with the folder inside a root.

Every path is checked against the allowed roots by ``places.check_place``, as every local place
pip reads from is. Refused, each saying what works: a relative path (``./pkg``, ``dist/x.whl``,
a bare ``x.whl``), which names nothing where Ray's agent runs pip (an empty folder of its own);
a marker after a path or a bare URL; an option line where the tool takes none (a ``uv`` list:
the options field; ``pip`` takes those pip reads from a requirements file: ``pip_spec``);
an editable VCS checkout (the options field, as ``-e``, ``<url>``).

A source's line is part of its env's identity, normalised (``line``). Its venv's key holds its
bytes instead of its path (``identity``, given the digest read at create by
``agent.install.venvs.local_read``): the same bytes named by two paths are one venv, a wheel rebuilt
at the same path is another. An editable folder's key holds its path and its build files (the
code itself is read live from the folder, as an editable install means).

Pure but for ``realpath`` of the paths it checks (``check_place``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from packaging.utils import canonicalize_name

from agent.core.errors import InvalidRuntimeEnv, PermissionDenied, echo
from agent.core.places import check_place
from agent.core.roots import FileRoots

# pip's archive suffixes: a path ending in one is a file (a wheel or an sdist), else a folder
_ZIPS_AND_GZ = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz")
ARCHIVE_SUFFIXES = (*_ZIPS_AND_GZ, ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma")
BUILD_FILES = ("pyproject.toml", "setup.cfg", "setup.py")  # an editable folder's, in its key
_EDITABLE = re.compile(r"(?:-e|--editable)(?:\s*=\s*|\s+)(?P<target>\S.*)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+")
_EXTRAS = re.compile(r"(?P<path>.+?)\[(?P<extras>[^\[\]]*)\]")
_WAY = "name it by its absolute path on the node, such as '/abs/pkg' or 'file:///abs/pkg'"


class Form(Enum):
    ARCHIVE = "archive"  # a wheel or an sdist: the file's bytes
    FOLDER = "folder"  # a project folder: its files' bytes, built from a copy
    EDITABLE = "editable"  # a folder installed editable: its path and build files' bytes


@dataclass(frozen=True, slots=True)
class LocalSource:
    """One package line naming a file or folder of the node."""

    line: str  # normalised, as the env's identity lists it
    form: Form
    path: str  # absolute, normalised as pip normalises it
    head: str = ""  # a direct reference's "name[extras]"; "" for a bare path
    extras: str = ""  # a bare path's "[a,b]" (sorted, normalised)
    marker: str = ""  # a direct reference's marker

    def identity(self, content: str) -> list[str]:
        """What the venv's key holds of this source, given its bytes' digest ``content``."""
        named = os.path.basename(self.path) if self.form is Form.ARCHIVE else ""
        where = self.path if self.form is Form.EDITABLE else ""
        return [self.form.value, named, where, self.head, self.extras, self.marker, content]

    def argv(self, copy: str) -> list[str]:
        """The installer's arguments for this source, read from ``copy`` (an editable one from
        its own folder)."""
        if self.form is Form.EDITABLE:
            return ["-e", self.path + self.extras]
        if self.head:
            tail = f" ; {self.marker}" if self.marker else ""
            return [f"{self.head} @ {Path(copy).as_uri()}{tail}"]
        return [copy + self.extras]


def form_of(path: str) -> Form:
    return Form.ARCHIVE if path.lower().endswith(ARCHIVE_SUFFIXES) else Form.FOLDER


def is_archive_name(name: str) -> bool:
    """A bare name pip would take as an archive in its working directory (``x-1.0.whl``)."""
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def relative(where: str, text: str) -> InvalidRuntimeEnv:
    return InvalidRuntimeEnv(
        f"{where} {echo(text)} is a relative path, which names nothing where pip runs (Ray's "
        f"agent runs it in an empty folder of its own); {_WAY}"
    )


def direct(
    line: str, head: str, marker: str, url: str, where: str, roots: FileRoots
) -> LocalSource | None:
    """A direct reference ``head @ url ; marker`` (``line``, normalised) as a source, when its
    URL is a ``file:`` one (checked against the roots); None for any other URL."""
    if _scheme(url) != "file":
        return None
    local = check_place(url, where, roots, vcs=False, path=False)
    assert local is not None  # a file: URL is local
    path = os.path.normpath(local)
    return LocalSource(line, form_of(path), path, head=head, marker=marker)


def bare(text: str, where: str, roots: FileRoots) -> LocalSource | str | None:
    """A line that is no PEP 508 requirement, as pip reads it: a path or ``file:`` URL (a
    source), a remote or VCS URL (the line, kept as it is), or None when it is neither."""
    scheme = _scheme(text)
    url = bool(scheme) and ("://" in text or scheme == "file")
    if not url and "/" not in text and not text.startswith((".", "~")):
        return None
    if ";" in text:
        raise InvalidRuntimeEnv(
            f"{where} {echo(text)}: a marker after a path or URL is not taken; write the line as "
            "a direct reference, 'name @ file:///abs/path ; marker'"
        )
    if url and scheme != "file":
        check_place(text, where, roots, vcs=True, path=False)  # remote, or refused
        return text  # as pip takes it; its name is pip's to learn
    path, extras = (text, "") if url else _split_extras(text)
    if not url and not os.path.isabs(path):
        raise relative(where, text)
    local = check_place(path, where, roots, vcs=False)
    assert local is not None  # an absolute path or a file: URL
    local = os.path.normpath(local)
    return LocalSource(local + extras, form_of(local), local, extras=extras)


def editable(text: str, where: str, roots: FileRoots, options_field: str) -> LocalSource | None:
    """An ``-e <folder>`` line as a source; None if the line is no ``-e`` one. Only with the
    allowed roots set (as the option ``-e``), a local folder, never a VCS checkout."""
    match = _EDITABLE.fullmatch(text)
    if match is None:
        return None
    target = match["target"].strip()
    path, extras = _split_extras(target)
    if _scheme(path):
        if _scheme(path) != "file":
            raise InvalidRuntimeEnv(
                f"{where} {echo(text)}: an editable VCS checkout is taken only as an option: "
                f"pass '-e', '<url>' in {options_field}"
            )
    elif not os.path.isabs(path):
        raise relative(where, text)
    local = check_place(path, where, roots, vcs=False)
    assert local is not None
    if not roots:
        raise PermissionDenied(
            f"{where} {echo(text)}: an editable install of a local folder needs the "
            "allow-file-root setting, and the folder inside one of its folders; or drop '-e': "
            "the folder is then built from a copy, its bytes in the venv's key"
        )
    local = os.path.normpath(local)
    return LocalSource(f"-e {local}{extras}", Form.EDITABLE, local, extras=extras)


def _scheme(text: str) -> str:
    """The URL scheme ``text`` starts with, lowercase ("" for none), as pip sees one."""
    head, colon, _ = text.partition(":")
    return head.lower() if colon and _SCHEME.fullmatch(head) else ""


def _split_extras(text: str) -> tuple[str, str]:
    """A path and its extras (``/abs/pkg[b,a]`` -> ``/abs/pkg``, ``[a,b]``), as pip splits
    them; the extras normalised and sorted."""
    match = _EXTRAS.fullmatch(text)
    if match is None:
        return text, ""
    names = sorted({canonicalize_name(e.strip()) for e in match["extras"].split(",") if e.strip()})
    return match["path"], f"[{','.join(names)}]" if names else ""


def option_line(text: str, where: str, options_field: str) -> InvalidRuntimeEnv:
    """A package line that is an option (a requirements file's ``--index-url ...`` line), where
    the tool takes no option line."""
    return InvalidRuntimeEnv(
        f"{where} {echo(text)} is an option line, not a requirement; pass the option in "
        f"{options_field} (a requirements file's lines: list them here, one by one)"
    )


def listed(packages: tuple[str, ...], sources: tuple[LocalSource, ...]) -> list[str]:
    """A set's lines as its env's identity lists them: requirements and sources, sorted."""
    return sorted((*packages, *(source.line for source in sources)))


def source_identity(sources: tuple[LocalSource, ...], contents: tuple[str, ...]) -> list[list[str]]:
    """What a venv's key holds of its sources: each one's ``identity`` with its digest, sorted.
    Their digests must be known: a set naming files is keyed at create, never at parse."""
    if len(contents) != len(sources):
        raise AssertionError("a venv naming local sources is keyed once their bytes are read")
    return sorted(s.identity(c) for s, c in zip(sources, contents, strict=True))
