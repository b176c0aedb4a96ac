"""Settings: every option is a flag, an ``RTENV_`` variable and a TOML key, in that order of
precedence over the default; ``rtenv-agent config`` shows the effective values and their sources;
bad values exit 2 naming the setting and where it came from; ``serve --help`` and the settings
table of docs/operations.md document every option."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.app.config import Settings
from agent.core.errors import ConfigError
from agent.install.disk.root import DiskFloor
from agent.install.venvs.wheel_cache import find_uv
from agent.ops import option_sources, options
from agent.ops.config_view import effective, effective_json
from agent.ops.options import OPTIONS, Option

REPO = Path(__file__).resolve().parents[1]
BY_NAME = {opt.name: opt for opt in OPTIONS}
CLI_TIMEOUT_S = 30.0

# A valid, non-default value for every option, as text (a new option without one fails below).
SAMPLES = {
    "address": "unix:/tmp/x.sock",
    "allow-remote": "true",
    "token-file": "/etc/rtenv/token",
    "allow-file-root": "/srv/pkgs",
    "cache-budget": "3M",
    "min-free-disk": "7%",
    "max-concurrent-installs": "3",
    "extract-workers": "2",
    "overlap-downloads": "false",
    "default-setup-timeout": "12.5",
    "max-setup-timeout": "900",
    "max-message-bytes": "2M",
    "max-env-json-bytes": "64K",
    "max-uris": "9",
    "max-env-var-bytes": "100KiB",
    "max-download-bytes": "1G",
    "download-attempts": "2",
    "max-archive-entries": "77",
    "max-uncompressed-bytes": "5GiB",
    "max-compression-ratio": "50",
    "request-log-capacity": "123",
    "python": "/usr/bin/python3",
    "pip-installer": "uv",
    "state-db": "false",
    "reset-state": "true",
    "metrics-address": "127.0.0.1:9100",
    "ray-address": "127.0.0.1:0",
    "log-format": "json",
    "log-level": "DEBUG",
}


def namespace(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(["--root", "/r", *argv])


def field_value(settings: Settings, opt: Option) -> Any:
    value: Any = settings
    for part in opt.field.split("."):
        value = getattr(value, part)
    return value


def resolve(
    argv: tuple[str, ...] = (), environ: Mapping[str, str] | None = None, toml: str | None = None
) -> tuple[Settings, dict[str, str]]:
    """``options.resolve`` with a TOML file at /etc/rtenv.toml holding ``toml`` (if given)."""
    files = {Path("/etc/rtenv.toml"): toml} if toml is not None else {}
    args = namespace(*argv, *(["--config", "/etc/rtenv.toml"] if toml is not None else []))

    def read(path: Path) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return files[path]

    return option_sources.resolve(args, environ or {}, read)


def toml_literal(opt: Option, text: str) -> str:
    """A sample as TOML of a type its key takes: a string if it takes one, else bare (true, 3,
    50)."""
    return json.dumps(text) if str in opt.toml else text


def test_every_option_has_a_sample_value() -> None:
    assert set(SAMPLES) == set(BY_NAME), "give each option a sample value in SAMPLES"


@pytest.mark.parametrize("channel", ["flag", "env", "toml"])
@pytest.mark.parametrize("name", list(BY_NAME))
def test_every_option_is_set_by_its_flag_env_var_and_toml_key(name: str, channel: str) -> None:
    opt, text = BY_NAME[name], SAMPLES[name]
    parsed = opt.parse(text)
    expected = (parsed,) if opt.repeat else parsed
    assert field_value(Settings(root=Path("/r")), opt) != expected, "the sample is the default"
    if channel == "flag":
        argv = (f"--{name}",) if opt.flag else (f"--{name}", text)
        settings, sources = resolve(argv)
        source = f"--{name}"
    elif channel == "env":
        settings, sources = resolve(environ={opt.env_var: text})
        source = opt.env_var
    else:
        settings, sources = resolve(toml=f"{opt.toml_key} = {toml_literal(opt, text)}\n")
        source = "/etc/rtenv.toml"
    assert field_value(settings, opt) == expected
    assert sources[name] == source
    assert {n for n, s in sources.items() if s != "default"} == {name}


@pytest.mark.parametrize(
    ("layers", "winner"),
    [
        (("flag", "env", "toml"), "--cache-budget"),
        (("env", "toml"), "RTENV_CACHE_BUDGET"),
        (("flag", "toml"), "--cache-budget"),
        (("toml",), "/etc/rtenv.toml"),
        ((), "default"),
    ],
)
def test_precedence_is_flag_then_env_then_toml_then_default(
    layers: tuple[str, ...], winner: str
) -> None:
    values = {"--cache-budget": 1, "RTENV_CACHE_BUDGET": 2, "/etc/rtenv.toml": 3, "default": 10240}
    settings, sources = resolve(
        ("--cache-budget", "1M") if "flag" in layers else (),
        {"RTENV_CACHE_BUDGET": "2M"} if "env" in layers else {},
        'cache_budget = "3M"\n' if "toml" in layers else None,
    )
    assert sources["cache-budget"] == winner
    assert settings.cache_budget_bytes == values[winner] * 1024**2


def test_toml_takes_native_types_and_lists_and_env_lists_split_on_colons() -> None:
    toml = (
        "max_uris = 9\nallow_remote = true\nmax_compression_ratio = 12.5\n"
        'allow_file_root = ["/a", "/b"]\nmin_free_disk = "10%"\nstate_db = false\n'
    )
    settings, _ = resolve(toml=toml)
    assert (settings.env.max_uris, settings.allow_remote, settings.persist) == (9, True, False)
    assert settings.archive.max_ratio == 12.5
    assert settings.allow_file_roots == ("/a", "/b")
    assert settings.min_free_disk == DiskFloor(bytes_=None, percent=10.0)
    settings, _ = resolve(environ={"RTENV_ALLOW_FILE_ROOT": "/x:/y"})
    assert settings.allow_file_roots == ("/x", "/y")
    settings, _ = resolve(("--allow-file-root", "/p", "--allow-file-root", "/q", "--no-state-db"))
    assert (settings.allow_file_roots, settings.persist) == (("/p", "/q"), False)


def test_rtenv_config_names_the_file_when_config_is_absent_and_config_flag_wins() -> None:
    files = {Path("/env.toml"): "max_uris = 5\n", Path("/flag.toml"): "max_uris = 6\n"}
    environ = {"RTENV_CONFIG": "/env.toml"}
    settings, sources = option_sources.resolve(namespace(), environ, files.__getitem__)
    assert (settings.env.max_uris, sources["max-uris"]) == (5, "/env.toml")
    settings, sources = option_sources.resolve(
        namespace("--config", "/flag.toml"), environ, files.__getitem__
    )
    assert (settings.env.max_uris, sources["max-uris"]) == (6, "/flag.toml")


@pytest.mark.parametrize(
    ("argv", "environ", "toml", "words"),
    [
        (("--cache-budget", "lots"), {}, None, ["cache-budget from --cache-budget", "'lots'"]),
        ((), {"RTENV_MAX_URIS": "0"}, None, ["max-uris from RTENV_MAX_URIS", "above 0"]),
        ((), {}, 'cache_budget = "lots"\n', ["cache-budget from /etc/rtenv.toml"]),
        ((), {}, "cache_budgets = 1\n", ["/etc/rtenv.toml", "unknown setting 'cache_budgets'"]),
        ((), {}, "cache_budget = \n", ["config file /etc/rtenv.toml:"]),
        (("--min-free-disk", "150%"), {}, None, ["min-free-disk from --min-free-disk"]),
        ((), {"RTENV_STATE_DB": "maybe"}, None, ["state-db from RTENV_STATE_DB", "boolean"]),
        (("--extract-workers", "lots"), {}, None, ["extract-workers", "auto, or a count"]),
        (("--extract-workers", "-3"), {}, None, ["extract-workers", "auto, or a count"]),
    ],
    ids=[
        "flag-size",
        "env-zero",
        "toml-size",
        "toml-unknown-key",
        "toml-syntax",
        "floor",
        "bool",
        "workers-word",
        "workers-negative",
    ],
)
def test_bad_value_is_a_config_error_naming_the_setting_and_its_source(
    argv: tuple[str, ...], environ: dict[str, str], toml: str | None, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(argv, environ, toml)
    for word in words:
        assert word in caught.value.message, caught.value.message


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("allow_file_root = 5", "allow_file_root takes a string or an array of strings, not an "
         "integer (5)"),
        ('allow_file_root = ["/a", 5]', "allow_file_root takes a string or an array of strings, "
         "not an array holding an integer (5)"),
        ('allow_remote = "yes"', "allow_remote takes a boolean (true or false), not a string "
         "('yes')"),
        ("allow_remote = 1", "allow_remote takes a boolean (true or false), not an integer (1)"),
        ('state_db = "false"', "state_db takes a boolean (true or false), not a string "
         "('false')"),
        ('max_uris = "9"', "max_uris takes an integer, not a string ('9')"),
        ("max_uris = true", "max_uris takes an integer, not a boolean (true)"),
        ("max_uris = 9.0", "max_uris takes an integer, not a float (9.0)"),
        ("cache_budget = 1.5", "cache_budget takes a string or an integer, not a float (1.5)"),
        ('log_level = ["DEBUG"]', "log_level takes a string, not an array"),
        ("python = { path = '/x' }", "python takes a string, not a table"),
        ("max_setup_timeout = 1979-05-27", "max_setup_timeout takes a string or an integer or "
         "a float, not a date"),
        ("max_compression_ratio = '50'", "max_compression_ratio takes an integer or a float, "
         "not a string ('50')"),
        (f"token_file = {5 * 10**60}", "token_file takes a string, not an integer "
         f"({str(5 * 10**60)[:40]}... (61 characters))"),
    ],
)  # fmt: skip
def test_a_toml_value_of_a_type_its_key_does_not_take_is_refused_naming_both_types(
    toml: str, said: str
) -> None:
    """Each was taken as its text: allow_file_root = 5 a folder '5', allow_remote = "yes" or
    1 true. Refused whichever channel sets the option (the file is wrong as it is)."""
    key = toml.split(" ", 1)[0]
    option = next(o for o in OPTIONS if o.toml_key == key)
    flag = (f"--{option.name}",) if option.flag else (f"--{option.name}", SAMPLES[option.name])
    for argv in ((), flag):
        with pytest.raises(ConfigError) as caught:
            resolve(argv, toml=toml + "\n")
        assert caught.value.message == f"config file /etc/rtenv.toml: {said}"


@pytest.mark.parametrize(
    ("argv", "environ", "toml", "said"),
    [
        (
            ("--default-setup-timeout", "2h"),
            {},
            None,
            "default-setup-timeout 2h (from --default-setup-timeout) is above max-setup-timeout 1h "
            "(the default): a request naming no timeout would get more than any request may ask "
            "for; lower default-setup-timeout or raise max-setup-timeout",
        ),
        (
            (),
            {"RTENV_MAX_SETUP_TIMEOUT": "5m"},
            None,
            "default-setup-timeout 10m (the default) is above max-setup-timeout 5m (from "
            "RTENV_MAX_SETUP_TIMEOUT): a request naming no timeout would get more than any request "
            "may ask for; lower default-setup-timeout or raise max-setup-timeout",
        ),
        (
            ("--max-message-bytes", "2M"),
            {},
            'max_env_json_bytes = "3M"\n',
            "max-env-json-bytes 3.0 MiB (from /etc/rtenv.toml) is above max-message-bytes 2.0 MiB "
            "(from --max-message-bytes): a runtime env that large could never arrive (the request "
            "carrying it is refused first); lower max-env-json-bytes or raise max-message-bytes",
        ),
    ],
    ids=["default-timeout-flag", "max-timeout-env", "env-json-toml"],
)
def test_a_setting_above_the_one_that_bounds_it_is_refused_naming_both_and_their_sources(
    argv: tuple[str, ...], environ: dict[str, str], toml: str | None, said: str
) -> None:
    """A default setup timeout above the maximum was taken silently (and applied uncapped); an
    env JSON limit above the message limit could never be reached. Equal is fine."""
    with pytest.raises(ConfigError) as caught:
        resolve(argv, environ, toml)
    assert caught.value.message == said
    settings, _ = resolve(("--default-setup-timeout", "1h", "--max-env-json-bytes", "4M"))
    assert settings.default_setup_timeout_s == settings.max_setup_timeout_s == 3600.0
    assert settings.env.max_json_bytes == settings.max_message_bytes


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["config", "serve"])
def test_a_default_setup_timeout_above_the_maximum_exits_2_in_one_line(
    tmp_path: Path, command: str
) -> None:
    root = tmp_path / "root"
    result = run_agent(command, "--root", str(root), "--default-setup-timeout", "2h")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(
        "rtenv-agent: default-setup-timeout 2h (from --default-setup-timeout) is above "
        "max-setup-timeout 1h (the default): "
    ), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not root.exists()


def run_agent(
    *argv: str, env: Mapping[str, str] | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """``python -m agent ARGV`` to its end (bounded), with no RTENV_ variable but ``env``'s."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RTENV_")}
    environ.update(env or {})
    return subprocess.run(
        [python, "-m", "agent", *argv],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip


def effective_lines(stdout: str) -> dict[str, tuple[str, str]]:
    """``rtenv-agent config`` output -> {option: (value, source)}."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        match = re.fullmatch(r"(\S+)\s+(.*?)\s+\(([^()]*)\)", line)
        assert match is not None, line
        rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def test_config_command_prints_each_effective_value_with_its_source(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('cache_budget = "3M"\nmax_uris = 7\nlog_format = "json"\n')
    result = run_agent(
        "config", "--root", str(tmp_path / "root"), "--config", str(config),
        "--cache-budget", "1M", env={"RTENV_MAX_URIS": "8", "RTENV_DOWNLOAD_ATTEMPTS": "2"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["root", str(tmp_path / "root")]
    rows = effective_lines(result.stdout)
    assert set(rows) == set(BY_NAME)
    assert rows["cache-budget"] == ("1.0 MiB", "--cache-budget")
    assert rows["max-uris"] == ("8", "RTENV_MAX_URIS")
    assert rows["download-attempts"] == ("2", "RTENV_DOWNLOAD_ATTEMPTS")
    assert rows["log-format"] == ("json", str(config))
    assert rows["max-archive-entries"] == ("100000", "default")
    assert rows["min-free-disk"] == ("auto (min of 1.0 GiB and 5%)", "default")


@pytest.mark.parametrize(
    ("setting", "uv", "said", "resolved"),
    [
        ("auto", "/opt/uv/bin/uv", "auto (uv: /opt/uv/bin/uv)", "uv"),
        ("auto", None, "auto (pip: no uv beside the agent's python nor on PATH)", "pip"),
        ("uv", "/opt/uv/bin/uv", "uv (uv: /opt/uv/bin/uv)", "uv"),
        ("uv", None, "uv (pip: no uv beside the agent's python nor on PATH)", "pip"),
        ("pip", "/opt/uv/bin/uv", "pip", "pip"),
    ],
)
def test_config_says_what_pip_installer_resolved_to_in_text_and_json(
    setting: str, uv: str | None, said: str, resolved: str
) -> None:
    """``pip-installer auto`` said nothing of what builds pip envs: uv (which one) or pip (and
    a ``uv`` setting with no uv found falls back to pip)."""
    settings, sources = resolve(("--pip-installer", setting))
    text = effective(settings, sources, uv=uv)
    assert effective_lines(text)["pip-installer"] == (said, "--pip-installer")
    doc = json.loads(effective_json(settings, sources, uv=uv))
    entry = doc["settings"]["pip-installer"]
    assert entry == {"value": setting, "source": "--pip-installer", "resolved": resolved, "uv": uv}
    assert set(doc["settings"]) == set(BY_NAME)
    assert doc["settings"]["cache-budget"] == {"value": "10.0 GiB", "source": "default"}


def test_config_command_shows_the_uv_the_agent_would_use_in_text_and_json(tmp_path: Path) -> None:
    """This venv has uv beside its python (the dev extras): the agent's pip envs are built by
    that one, and config says so."""
    uv = find_uv()
    assert uv is not None, "no uv here: the test proves nothing"
    result = run_agent("config", "--root", str(tmp_path / "root"))
    assert result.returncode == 0, result.stderr
    assert effective_lines(result.stdout)["pip-installer"] == (f"auto (uv: {uv})", "default")
    result = run_agent("config", "--root", str(tmp_path / "root"), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["root"] == str(tmp_path / "root")
    assert doc["settings"]["pip-installer"] == {
        "value": "auto",
        "source": "default",
        "resolved": "uv",
        "uv": uv,
    }


@pytest.mark.parametrize(
    ("argv", "env", "toml", "words"),
    [
        (("--cache-budget", "lots"), {}, "", ["cache-budget from --cache-budget", "'lots'"]),
        ((), {"RTENV_MAX_URIS": "-1"}, "", ["max-uris from RTENV_MAX_URIS"]),
        ((), {}, "max_urls = 3\n", ["unknown setting 'max_urls'", "agent.toml"]),
        ((), {}, "max_uris = [\n", ["config file", "agent.toml"]),
        ((), {}, 'max_setup_timeout = "soon"\n', ["max-setup-timeout from", "agent.toml"]),
        (
            (),
            {},
            'allow_remote = "yes"\n',
            ["agent.toml: allow_remote takes a boolean (true or false), not a string ('yes')"],
        ),
    ],
    ids=["flag", "env", "toml-unknown-key", "toml-syntax", "toml-value", "toml-type"],
)
def test_config_command_exits_2_on_a_bad_value_naming_setting_and_source_without_traceback(
    tmp_path: Path, argv: tuple[str, ...], env: dict[str, str], toml: str, words: list[str]
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(toml)
    result = run_agent("config", "--root", str(tmp_path), "--config", str(config), *argv, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("rtenv-agent: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_config_command_exits_2_when_the_config_file_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = run_agent("config", "--root", str(tmp_path), env={"RTENV_CONFIG": str(missing)})
    assert result.returncode == 2, result.stdout
    assert f"config file {missing}:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["config", "serve"])
@pytest.mark.parametrize(
    ("flag", "value"), [("--log-level", "LOUD"), ("--log-format", "xml")], ids=["level", "format"]
)
def test_bad_log_level_or_format_exits_2_naming_the_setting_and_its_source(
    tmp_path: Path, command: str, flag: str, value: str
) -> None:
    """``config`` must refuse what ``serve`` refuses, and both say which setting and where from."""
    result = run_agent(command, "--root", str(tmp_path / "root"), flag, value)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{flag[2:]} from {flag}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_serve_help_documents_every_option_with_its_default_and_env_var(base: Path) -> None:
    """Whatever the checkout's path: here the python runs from a path full of hyphens (as in a
    clone under ``two-cmd-x1/p``), whose default --python argparse used to cut at a hyphen."""
    hyphens = base / "two-cmd-x1" / "p"
    hyphens.mkdir(parents=True)
    (hyphens / "a-long-venv-name-with-hyphens").symlink_to(sys.prefix)
    python = (
        hyphens / "a-long-venv-name-with-hyphens" / Path(sys.executable).relative_to(sys.prefix)
    )
    narrow = {"COLUMNS": "60"}
    result = run_agent("serve", "--help", env=narrow, python=str(python))
    assert result.returncode == 0, result.stderr[-2000:]
    assert str(python) in result.stdout, "the python's path was cut where it has a hyphen"
    text = " ".join(result.stdout.split())
    config = run_agent("config", "--root", "ROOT", env=narrow, python=str(python))
    defaults = effective_lines(config.stdout)
    assert defaults["python"][0] == str(python)
    for opt in OPTIONS:
        assert f"--{opt.name}" in text, opt.name
        default = defaults[opt.name][0]
        if opt.name == "pip-installer":  # config adds what auto resolved to on this machine
            default = default.partition(" (")[0]
        assert f"(default {default}; env {opt.env_var})" in text, (opt.name, default)
    assert "--config" in text
    assert "RTENV_CONFIG" in text


def test_the_docs_settings_table_is_the_generated_one() -> None:
    ops = (REPO / "docs" / "operations.md").read_text()
    match = re.search(r"<!-- settings-table[^>]*-->\n(.*?)\n<!-- /settings-table -->", ops, re.S)
    assert match is not None, "docs/operations.md lost its <!-- settings-table --> markers"
    assert match.group(1) == options.markdown_table(), (
        "docs/operations.md's settings table is stale: replace the lines between the "
        "settings-table markers with the output of "
        "`.venv/bin/python -c 'from agent.ops.options import markdown_table; "
        "print(markdown_table())'`"
    )
