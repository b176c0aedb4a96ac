"""Where each setting's value comes from, and the values checked together: a flag, then
``RTENV_<NAME>``, then the TOML file given by ``--config`` (or ``RTENV_CONFIG``), then the default
(the settings themselves are ``options.OPTIONS``). A file's unknown key, a key holding a TOML type
its setting does not take, a value that does not parse, and a pair of limits out of order
(``PAIRS``) are each one ``ConfigError`` naming the setting and where its value came from.

Pure: resolving takes its inputs (argv namespace, environ, a reader of the TOML file) as values.
"""

from __future__ import annotations

import argparse
import datetime
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.app.config import Settings
from agent.core.errors import ConfigError, echo
from agent.core.units import quoted
from agent.ops.options import OPTIONS, Option, field_value, value_text
from agent.ops.usage import closest

_TOML_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (list, "an array"),
    (dict, "a table"),
    (datetime.datetime, "a date-time"),
    (datetime.date, "a date"),
    (datetime.time, "a time"),
)


def resolve(
    args: argparse.Namespace, environ: Mapping[str, str], read: Callable[[Path], str]
) -> tuple[Settings, dict[str, str]]:
    """The effective settings and, per option, where its value came from."""
    config_path = args.config or (
        Path(environ["RTENV_CONFIG"]) if "RTENV_CONFIG" in environ else None
    )
    table: dict[str, Any] = {}
    if config_path is not None:
        named_by = "--config" if args.config else "RTENV_CONFIG"
        try:
            table = tomllib.loads(read(config_path))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(f"config file {config_path}: {reason} (named by {named_by})") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {config_path}: not TOML: {exc}") from exc
        unknown = sorted(set(table) - {o.toml_key for o in OPTIONS})
        if unknown:
            raise ConfigError(f"config file {config_path}: {_unknown_keys(unknown)}")
        _check_types(table, config_path)
    settings = Settings(root=args.root, parent_pid=args.parent_pid)
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        raw, source = _raw(opt, args, environ, table, config_path)
        if raw is None:
            sources[opt.name] = "default"
            continue
        try:
            values = [opt.parse(str(v)) for v in raw] if opt.repeat else opt.parse(str(raw))
        except ValueError as exc:
            raise ConfigError(f"{opt.name} from {source}: {exc}") from exc
        settings = _set(settings, opt.field, tuple(values) if opt.repeat else values)
        sources[opt.name] = source
    _check_pairs(settings, sources)
    return settings, sources


# Settings one of which may not be above the other (lower, upper, why): taken as they were, the
# agent would settle the contradiction silently (a default above the cap, applied uncapped; a
# limit no request can reach, the other refusing it first).
PAIRS: tuple[tuple[str, str, str], ...] = (
    (
        "default-setup-timeout",
        "max-setup-timeout",
        "a request naming no timeout would get more than any request may ask for",
    ),
    (
        "max-env-json-bytes",
        "max-message-bytes",
        "a runtime env that large could never arrive (the request carrying it is refused first)",
    ),
)


def _check_pairs(settings: Settings, sources: Mapping[str, str]) -> None:
    """A ConfigError naming both values of a pair out of order and where each came from."""
    by_name = {o.name: o for o in OPTIONS}
    for lower, upper, why in PAIRS:
        low, high = by_name[lower], by_name[upper]
        if field_value(settings, low.field) > field_value(settings, high.field):
            said = [
                f"{o.name} {value_text(settings, o)} (from {sources[o.name]})"
                if sources[o.name] != "default"
                else f"{o.name} {value_text(settings, o)} (the default)"
                for o in (low, high)
            ]
            raise ConfigError(
                f"{said[0]} is above {said[1]}: {why}; lower {lower} or raise {upper}"
            )


def _check_types(table: Mapping[str, Any], config_path: Path) -> None:
    """Each key holds a TOML type its option takes (``Option.toml``), else a ConfigError naming
    the key, the types it takes and the one it holds, its value echoed cut."""
    for opt in OPTIONS:
        if opt.toml_key not in table:
            continue
        value = table[opt.toml_key]
        items = value if opt.repeat and type(value) is list else [value]
        for item in items:
            if type(item) in opt.toml:
                continue
            given = _toml_name(type(item))
            if item is not value:
                given = f"an array holding {given}"
            if isinstance(item, bool):
                given = f"{given} ({str(item).lower()})"
            elif isinstance(item, str | int | float):
                given = f"{given} ({echo(item, 40)})"
            raise ConfigError(
                f"config file {config_path}: {opt.toml_key} takes {_toml_takes(opt)}, not {given}"
            )


def _toml_name(kind: type) -> str:
    return next((name for base, name in _TOML_NAMES if issubclass(kind, base)), kind.__name__)


def _toml_takes(opt: Option) -> str:
    """'a boolean (true or false)', 'a string or an integer', 'a string or an array of strings'."""
    names = [_toml_name(kind) for kind in opt.toml]
    said = " or ".join(names) + (" (true or false)" if opt.toml == (bool,) else "")
    if opt.repeat:
        said += " or an array of " + " or ".join(f"{n.split(' ', 1)[1]}s" for n in names)
    return said


def _unknown_keys(keys: Sequence[str]) -> str:
    """'unknown setting 'max_urls' (did you mean 'max_uris'?)', for each key."""
    known = [o.toml_key for o in OPTIONS]
    parts = []
    for key in keys:
        close = closest(key, known)
        hint = f" (did you mean {close!r}?)" if close else ""
        parts.append(f"unknown setting {quoted(key)}{hint}")
    return "; ".join(parts) + "; `rtenv-agent config --help` lists every setting"


def _raw(
    opt: Option,
    args: argparse.Namespace,
    environ: Mapping[str, str],
    table: Mapping[str, Any],
    config_path: Path | None,
) -> tuple[Any, str]:
    flag_value = getattr(args, opt.name.replace("-", "_"), None)
    if flag_value is not None:
        return flag_value, f"--{opt.name}"
    if opt.env_var in environ:
        value = environ[opt.env_var]
        return (value.split(":") if opt.repeat else value), opt.env_var
    if opt.toml_key in table:
        item: Any = table[opt.toml_key]
        if opt.repeat and not isinstance(item, list):
            item = [item]
        return item, f"{config_path}"
    return None, "default"


def _set(settings: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if not rest:
        return replace(settings, **{head: value})
    return replace(settings, **{head: _set(getattr(settings, head), rest, value)})
