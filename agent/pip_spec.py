"""The ``pip`` field: a dependency set, normalised and named by its content. Pure.

Ray's two forms are accepted: a list of requirement strings, or
``{"packages": [...], "pip_install_options": [...]}``. Requirement names are normalised as PEP 503
says (lowercase, runs of ``-_.`` become ``-``), whitespace is dropped, and the list is sorted and
de-duplicated; the set, the options, the Python version and the platform are hashed into
``pip://<hash>``, so the same set written in another order or spelling is the same venv.

Options that would make pip write outside the venv (``--target``, ``--prefix``, ``--user``,
``--root``), and editable installs of paths outside the allowed file roots, are refused up front.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import InvalidRuntimeEnv

_NAME = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(.*)$", re.DOTALL)
_FORBIDDEN = ("--target", "-t", "--prefix", "--user", "--root", "--src")
_EDITABLE = ("-e", "--editable")
MAX_REQUIREMENTS = 512
_MAX_ITEM_CHARS = 4096


@dataclass(frozen=True)
class PipSpec:
    packages: tuple[str, ...]  # normalised, sorted, distinct
    options: tuple[str, ...]  # as given: their order can matter to pip
    python: str  # "3.11"
    platform: str  # "linux-x86_64"

    @property
    def digest(self) -> str:
        canonical = json.dumps(
            {"packages": self.packages, "options": self.options, "python": self.python,
             "platform": self.platform},
            sort_keys=True, separators=(",", ":"),
        )  # fmt: skip
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    @property
    def uri(self) -> str:
        return f"pip://{self.digest}"

    def canonical(self) -> dict[str, list[str]]:
        """The env's identity keeps the set and the options (the interpreter is the node's)."""
        return {"packages": list(self.packages), "pip_install_options": list(self.options)}


def normalize_name(name: str) -> str:
    """PEP 503."""
    return re.sub(r"[-_.]+", "-", name).lower()


def normalize_requirement(text: str, field: str) -> str:
    stripped = "".join(text.split())  # "Foo >= 1.0" and "foo>=1.0" are one requirement
    match = _NAME.match(stripped)
    if not stripped or match is None:
        raise InvalidRuntimeEnv(
            f"{field} {text!r} is not a requirement (a name, optionally with extras, a version "
            "specifier or a marker, such as 'requests>=2.31')"
        )
    name, rest = match.groups()
    if rest and rest[0] not in "[<>=!~;@(":
        raise InvalidRuntimeEnv(f"{field} {text!r}: unexpected {rest[0]!r} after the name")
    return normalize_name(name) + rest


def parse_pip(value: object, *, file_roots: Sequence[str] = ()) -> PipSpec | None:
    """The ``pip`` field, validated and normalised; None when it names nothing."""
    if value is None:
        return None
    if isinstance(value, list):
        packages, options = value, []
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"packages", "pip_install_options"})
        if unknown:
            raise InvalidRuntimeEnv(
                f"unknown pip field(s) {unknown}; supported: packages, pip_install_options"
            )
        packages = value.get("packages", [])
        options = value.get("pip_install_options", [])
    else:
        raise InvalidRuntimeEnv("pip must be a list of requirements or an object with packages")
    for field, items in (("pip.packages", packages), ("pip.pip_install_options", options)):
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InvalidRuntimeEnv(f"{field} must be a list of strings")
        if len(items) > MAX_REQUIREMENTS:
            raise InvalidRuntimeEnv(
                f"{field} has {len(items)} items; the limit is {MAX_REQUIREMENTS}"
            )
        for item in items:
            if len(item) > _MAX_ITEM_CHARS or "\x00" in item or "\n" in item:
                raise InvalidRuntimeEnv(f"{field}: {item[:60]!r}... is not a valid item")
    _check_options(options, file_roots)
    normalised = sorted(
        {normalize_requirement(p, f"pip.packages[{i}]") for i, p in enumerate(packages)}
    )
    if not normalised:
        return None
    return PipSpec(
        packages=tuple(normalised),
        options=tuple(options),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        platform=f"{sys.platform}-{platform.machine()}",
    )


def _check_options(options: Sequence[str], file_roots: Sequence[str]) -> None:
    for i, option in enumerate(options):
        flag = option.split("=", 1)[0]
        if flag in _FORBIDDEN or any(option.startswith(f) and len(f) == 2 for f in ("-t",)):
            raise InvalidRuntimeEnv(
                f"pip.pip_install_options: {option!r} would install outside the env's own venv "
                "on a shared node; refused"
            )
        if flag in _EDITABLE:
            target = option.split("=", 1)[1] if "=" in option else (
                options[i + 1] if i + 1 < len(options) else ""
            )  # fmt: skip
            real = os.path.realpath(target)
            roots = [os.path.realpath(r) for r in file_roots]
            if not any(real == r or real.startswith(r + os.sep) for r in roots):
                raise InvalidRuntimeEnv(
                    f"pip.pip_install_options: editable install of {target!r} is outside the "
                    "allowed file roots (allow-file-root); refused"
                )
