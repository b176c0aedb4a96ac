"""The pure part of Ray's runtime env plugins: ``RAY_RUNTIME_ENV_PLUGINS`` read, priorities
checked against Ray's bounds, the order plugins run in, and plugin fields as part of an env's
identity (``parse_runtime_env(plugin_fields=...)``)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.dialect import GRPC, PluginFields
from agent.core.errors import ConfigError, InvalidRuntimeEnv
from agent.core.plugin_config import (
    MAX_PLUGINS,
    PluginSpec,
    check_priority,
    configured,
    ordered,
    parse_plugins,
)
from agent.core.runtime_env import EnvLimits, parse_runtime_env

FIELDS = frozenset({"MyPlugin"})


def test_plugins_are_read_with_their_priorities() -> None:
    text = '[{"class": "m.A"}, {"class": "m.B", "priority": 0}]'
    assert parse_plugins(text) == (PluginSpec("m.A", None), PluginSpec("m.B", 0))


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"class": "m.A"}',
        '[{"priority": 1}]',
        '[{"class": 3}]',
        '[{"class": "m", "priority": 101}]',
    ],
)
def test_a_bad_plugin_list_is_refused_saying_what_is_wrong(text: str) -> None:
    with pytest.raises(ConfigError, match=r"RAY_RUNTIME_ENV_PLUGINS|priority"):
        parse_plugins(text)


def test_too_many_plugins_are_refused() -> None:
    with pytest.raises(ConfigError, match=f"limit is {MAX_PLUGINS}"):
        parse_plugins(str([{"class": "m.A"}] * (MAX_PLUGINS + 1)).replace("'", '"'))


@pytest.mark.parametrize("bad", [-1, 101, 1.5, True, "3", None])
def test_a_priority_outside_rays_bounds_is_refused_in_rays_words(bad: object) -> None:
    with pytest.raises(ConfigError, match="should be an integer between 0 and 100"):
        check_priority(bad)


def test_the_bounds_themselves_are_priorities() -> None:
    assert (check_priority(0), check_priority(100)) == (0, 100)


def test_plugins_run_by_increasing_priority_ties_in_listing_order() -> None:
    assert ordered([(11, "a"), (10, "b"), (11, "c"), (0, "d")]) == ["d", "b", "a", "c"]


def test_plugins_are_configured_only_by_a_nonblank_variable() -> None:
    assert not configured({})
    assert not configured({"RAY_RUNTIME_ENV_PLUGINS": " "})
    assert configured({"RAY_RUNTIME_ENV_PLUGINS": "[]x"})


# the gRPC door's dialect but for its plugin fields: the columns are independent
_RUNS_PLUGINS = dataclasses.replace(GRPC, plugin_fields=PluginFields.RUN)


def _parse(text: str, fields: frozenset[str] = FIELDS):  # type: ignore[no-untyped-def]
    return parse_runtime_env(text, EnvLimits(), dialect=_RUNS_PLUGINS, plugin_fields=fields)


def test_a_dialect_that_runs_no_plugins_refuses_their_fields_naming_them() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"plugin field\(s\) MyPlugin are run only"):
        parse_runtime_env('{"MyPlugin": {}}', EnvLimits(), plugin_fields=FIELDS)


def test_a_plugin_field_is_refused_when_no_plugin_names_it() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"unknown runtime_env field.*MyPlugin"):
        _parse('{"MyPlugin": {"a": 1}}', frozenset())


def test_a_plugin_field_is_part_of_the_envs_identity() -> None:
    one, two = _parse('{"MyPlugin": {"a": 1}}'), _parse('{"MyPlugin": {"a": 2}}')
    plain = _parse('{"env_vars": {"A": "1"}}')
    assert len({one.env_id, two.env_id, plain.env_id}) == 3
    assert one.plugins == (("MyPlugin", '{"a":1}'),)
    spaced = _parse('{ "MyPlugin" : { "a" : 1 } }')
    assert spaced.env_id == one.env_id  # its canonical JSON, not its spelling


def test_a_null_plugin_field_is_no_plugin() -> None:
    """As Ray's agent skips a plugin whose field is None."""
    env = _parse('{"MyPlugin": null}')
    assert env.plugins == ()
    assert env.env_id == _parse("{}").env_id


def test_other_unknown_fields_are_still_refused_beside_plugin_fields() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"unknown runtime_env field.*Other"):
        _parse('{"MyPlugin": {}, "Other": 1}')
