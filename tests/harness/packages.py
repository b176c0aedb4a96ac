"""The packages tests install: zips built in memory (working dirs, py_modules, odd entries)
and the serialized runtime env that names them."""

from __future__ import annotations

import io
import json
import stat
import zipfile
from collections.abc import Mapping
from typing import Any


def make_zip(
    files: Mapping[str, bytes | str],
    *,
    symlinks: Mapping[str, str] | None = None,
    compression: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A zip in memory: ``files`` maps entry names to contents, ``symlinks`` names to targets."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def zip_with_infos(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A zip of (name, unix mode incl. file type, data) entries."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, mode, data in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return buf.getvalue()


def module_zip(module: str, value: str, *, top: str | None = None) -> bytes:
    """A py_modules-style zip holding ``<module>/__init__.py`` that defines VALUE."""
    prefix = f"{top}/" if top else ""
    return make_zip({f"{prefix}{module}/__init__.py": f"VALUE = {value!r}\n"})


def workdir_zip(files: Mapping[str, str], *, top: str | None = "proj") -> bytes:
    prefix = f"{top}/" if top else ""
    return make_zip({f"{prefix}{name}": data for name, data in files.items()})


def env_json(
    working_dir: str | None = None,
    py_modules: list[str] | None = None,
    env_vars: dict[str, str] | None = None,
    **extra: Any,
) -> str:
    env: dict[str, Any] = dict(extra)
    if working_dir is not None:
        env["working_dir"] = working_dir
    if py_modules is not None:
        env["py_modules"] = py_modules
    if env_vars is not None:
        env["env_vars"] = env_vars
    return json.dumps(env)
