"""``rtenv-agent config``: the effective settings, where each came from, and what a setting
decided on this machine resolved to (``pip-installer auto``: uv, and which one, or pip), as
text or as one JSON object.

Pure: what was found on the machine (the uv the agent would use: ``wheel_cache.find_uv``,
which ``serve`` looks up the same way) is given as a value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.app.config import Settings
from agent.install.venvs.wheel_cache import pip_installer_for
from agent.ops.options import OPTIONS, value_text

NO_UV = "no uv beside the agent's python nor on PATH"


def effective(settings: Settings, sources: Mapping[str, str], *, uv: str | None) -> str:
    """One line per option: its value (and what it resolved to), and its source."""
    lines = [f"{'root':<26} {settings.root}"]
    resolved = _resolved(settings, uv)
    for opt in OPTIONS:
        value = value_text(settings, opt)
        said = resolved.get(opt.name, ("", {}))[0]
        value += f" ({said})" if said else ""
        lines.append(f"{opt.name:<26} {value:<28} ({sources.get(opt.name, 'default')})")
    return "\n".join(lines)


def effective_json(settings: Settings, sources: Mapping[str, str], *, uv: str | None) -> str:
    """The same as one JSON object: ``{"root": ..., "settings": {name: {"value", "source"}}}``,
    a resolved setting's entry with what it resolved to besides."""
    resolved = _resolved(settings, uv)
    doc: dict[str, Any] = {"root": str(settings.root), "settings": {}}
    for opt in OPTIONS:
        entry: dict[str, Any] = {
            "value": value_text(settings, opt),
            "source": sources.get(opt.name, "default"),
        }
        if opt.name in resolved:
            entry.update(resolved[opt.name][1])
        doc["settings"][opt.name] = entry
    return json.dumps(doc, indent=2)


def _resolved(settings: Settings, uv: str | None) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per setting resolved on the machine: the words the text adds ("" for none), and the
    JSON fields. pip-installer: what builds a pip env, uv (``auto`` or ``uv`` with one found:
    the agent's uv, which ``uv`` envs use whatever the setting) or pip (``pip``; or no uv found,
    which a ``uv`` setting falls back from)."""
    setting = settings.pip_installer
    by = pip_installer_for(setting, uv) if uv is not None else "pip"
    said = f"uv: {uv}" if by == "uv" else "" if setting == "pip" else f"pip: {NO_UV}"
    return {"pip-installer": (said, {"resolved": by, "uv": uv})}
