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
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from agent.errors import InvalidRuntimeEnv

# pip install options allowed in an env, by their full spelling only (pip would also take any
# unambiguous prefix, such as --targ for --target: an allow-list of whole names refuses those),
# each with whether it takes a value. Short options only alone and with their value apart.
_ALLOWED: dict[str, bool] = {
    "--index-url": True, "-i": True, "--extra-index-url": True, "--no-index": False,
    "--find-links": True, "-f": True, "--trusted-host": True, "--pre": False,
    "--no-deps": False, "--only-binary": True, "--no-binary": True, "--prefer-binary": False,
    "--no-build-isolation": False, "--use-pep517": False, "--no-use-pep517": False,
    "--upgrade": False, "-U": False, "--upgrade-strategy": True, "--force-reinstall": False,
    "--ignore-installed": False, "-I": False, "--require-hashes": False, "--constraint": True,
    "-c": True, "--config-settings": True, "-C": True, "--no-cache-dir": False,
    "--no-compile": False, "--compile": False, "--timeout": True, "--retries": True,
    "--progress-bar": True, "--quiet": False, "-q": False, "--verbose": False, "-v": False,
    "--no-warn-script-location": False, "--editable": True, "-e": True,
}  # fmt: skip
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


def normalize_requirement(text: str, field: str) -> str:
    """One requirement in a canonical spelling (PEP 508 parsed by ``packaging``): the name per
    PEP 503, extras sorted, the specifier set and marker as packaging prints them. Whitespace
    inside a marker's quoted values is meaning, and is kept."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise InvalidRuntimeEnv(
            f"{field} {text!r} is not a requirement (a name, optionally with extras, a version "
            f"specifier or a marker, such as 'requests>=2.31'): {exc}"
        ) from exc
    out: str = canonicalize_name(req.name)
    if req.extras:
        out += "[" + ",".join(sorted(canonicalize_name(e) for e in req.extras)) + "]"
    if req.url:
        out += f" @ {req.url}"
    else:
        out += str(req.specifier)
    if req.marker is not None:
        out += f"; {req.marker}"
    return out


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
    """Every option must be on the allow-list, spelled in full; editable installs only of
    paths inside the allowed file roots."""
    i = 0
    while i < len(options):
        option = options[i]
        flag, eq, attached = option.partition("=")
        takes_value = _ALLOWED.get(flag)
        if takes_value is None or (eq and (not takes_value or not flag.startswith("--"))):
            raise InvalidRuntimeEnv(
                f"pip.pip_install_options: {option!r} is not an option an env may pass (options "
                "that write outside the env's venv, such as --target, --prefix, --user, --root, "
                "are refused; so are abbreviations and short options run together)"
            )
        value = attached
        if takes_value and not eq:
            if i + 1 >= len(options):
                raise InvalidRuntimeEnv(f"pip.pip_install_options: {option!r} needs a value")
            i += 1
            value = options[i]
        if flag in _EDITABLE:
            _check_editable(value, file_roots)
        i += 1


def _check_editable(target: str, file_roots: Sequence[str]) -> None:
    real = os.path.realpath(target.removeprefix("file://"))
    roots = [os.path.realpath(r) for r in file_roots]
    if not any(real == r or real.startswith(r + os.sep) for r in roots):
        raise InvalidRuntimeEnv(
            f"pip.pip_install_options: editable install of {target!r} is outside the allowed "
            "file roots (allow-file-root); refused"
        )
