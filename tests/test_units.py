"""Numbers for humans, pure: sizes and durations as people write them go in; sizes in binary
units, times in s/m/h, counts with their plural come out; a bad number is named as what was
expected, never with Python's wording."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.core.errors import ConfigError, StartupError
from agent.core.units import (
    exact_bytes,
    human_bytes,
    human_duration,
    parse_bytes,
    parse_duration,
    plural,
)
from agent.install.disk.root import DiskFloor
from agent.ops import option_sources, options
from agent.ops.config_view import effective
from agent.ops.options import OPTIONS
from agent.ops.startup import check_address

GiB = 1024**3
BY_NAME = {opt.name: opt for opt in OPTIONS}


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("4096B", 4096),
        ("500M", 500 * 1024**2),
        ("10GiB", 10 * GiB),
        ("10g", 10 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        ("1.5 G", 3 * GiB // 2),
        ("10GB", 10 * 10**9),
        ("1kB", 1000),
        ("2TB", 2 * 10**12),
        (".5KiB", 512),
    ],
)
def test_sizes_take_decimals_binary_units_and_decimal_gb(text: str, size: int) -> None:
    """K/M/G/T alone or with iB are powers of 1024; kB/MB/GB/TB powers of 1000, as disks count."""
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("12.5", 12.5), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0),
     ("500ms", 0.5), (" 2 M ", 120.0)],
)  # fmt: skip
def test_durations_take_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("name", "text", "expected", "python_wording"),
    [
        ("max-uris", "abc", "'abc' is not a whole number", "invalid literal"),
        ("default-setup-timeout", "10x", "'10x' is not a duration such as", "convert string"),
        ("max-compression-ratio", "lots", "'lots' is not a number", "convert string"),
        ("cache-budget", "10 potatoes", "is not a size such as 4096, 500M", "invalid literal"),
        ("min-free-disk", "x%", "'x' is not a number", "convert string"),
    ],
)
def test_bad_numbers_say_what_was_expected_in_the_agents_words(
    name: str, text: str, expected: str, python_wording: str
) -> None:
    with pytest.raises(ValueError, match=r"^'") as caught:
        BY_NAME[name].parse(text)
    assert expected in str(caught.value)
    assert python_wording not in str(caught.value)


def test_durations_and_decimal_sizes_are_accepted_where_a_time_or_size_is_asked() -> None:
    args = _namespace(
        "--default-setup-timeout", "90s", "--max-setup-timeout", "10m",
        "--cache-budget", "1.5GiB", "--max-download-bytes", "10GB",
    )  # fmt: skip
    settings, _ = option_sources.resolve(args, {}, Path.read_text)
    assert (settings.default_setup_timeout_s, settings.max_setup_timeout_s) == (90.0, 600.0)
    assert settings.cache_budget_bytes == 3 * GiB // 2
    assert settings.fetch.max_download_bytes == 10**10


def test_a_long_bad_value_is_echoed_only_cut_short() -> None:
    with pytest.raises(ValueError, match="is not a size") as caught:
        parse_bytes("9" * 10_000 + "X")
    assert len(str(caught.value)) < 120


@pytest.mark.parametrize(
    ("size", "human", "exact"),
    [
        (0, "0 B", "0 B"),
        (512, "512 B", "512 B"),
        (1024, "1.0 KiB", "1.0 KiB"),
        (10 * GiB, "10.0 GiB", "10.0 GiB"),
        (3 * GiB // 2, "1.5 GiB", "1.5 GiB"),
        (10**9, "953.7 MiB", "953.7 MiB (1000000000 B)"),
        (12345, "12.1 KiB", "12.1 KiB (12345 B)"),
    ],
)
def test_sizes_come_out_in_binary_units_and_exact_when_rounding_would_lie(
    size: int, human: str, exact: str
) -> None:
    assert human_bytes(size) == human
    assert exact_bytes(size) == exact


def test_durations_come_out_in_the_largest_whole_unit_and_parse_back() -> None:
    for seconds, text in ((600.0, "10m"), (3600.0, "1h"), (12.5, "12.5s"), (90.0, "90s")):
        assert human_duration(seconds) == text
        assert parse_duration(text) == seconds


def test_counts_of_one_are_singular() -> None:
    assert [plural(n, "package") for n in (0, 1, 2)] == ["0 packages", "1 package", "2 packages"]
    assert plural(1, "entry", "entries") == "1 entry"


def test_disk_floor_shows_its_size_in_binary_units() -> None:
    assert str(DiskFloor()) == "auto (min of 1.0 GiB and 5%)"
    assert str(DiskFloor(bytes_=500 * 1024**2, percent=None)) == "500.0 MiB"


def test_log_level_is_taken_in_any_case() -> None:
    settings, _ = option_sources.resolve(
        _namespace("--log-level", "debug"), {"RTENV_LOG_FORMAT": "JSON"}, Path.read_text
    )
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")


def test_unknown_toml_key_is_named_with_the_closest_known_key() -> None:
    with pytest.raises(ConfigError) as caught:
        option_sources.resolve(
            _namespace("--config", "/c.toml"), {}, lambda _: "max_urls = 3\ncache_budgt = 1\n"
        )
    message = caught.value.message
    assert "unknown setting 'cache_budgt' (did you mean 'cache_budget'?)" in message
    assert "unknown setting 'max_urls' (did you mean 'max_uris'?)" in message
    assert "[" not in message, "a Python list was printed"


def test_missing_config_file_is_named_without_an_errno() -> None:
    def read(path: Path) -> str:
        raise FileNotFoundError(2, "No such file or directory", str(path))

    with pytest.raises(ConfigError) as caught:
        option_sources.resolve(_namespace(), {"RTENV_CONFIG": "/nope.toml"}, read)
    assert caught.value.message == (
        "config file /nope.toml: No such file or directory (named by RTENV_CONFIG)"
    )


def test_effective_settings_show_the_address_listened_on_and_sizes_for_humans() -> None:
    settings, sources = option_sources.resolve(_namespace(), {}, Path.read_text)
    rows = {line.split()[0]: line for line in effective(settings, sources, uv=None).splitlines()}
    assert rows["address"].split()[1] == "unix:/r/agent.sock"
    assert "10.0 GiB" in rows["cache-budget"]
    assert "10m" in rows["default-setup-timeout"]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("tcp://127.0.0.1:5000", "tcp:// is not a scheme the agent takes"),
        ("127.0.0.1:", "the port '' is not a number"),
        ("127.0.0.1:99999", "the port '99999' is not a number from 0 to 65535"),
        ("::1:50051", "an IPv6 address must be written in brackets"),
        ("[::1:50051", "'[::1' is not an IPv6 address in brackets"),
        ("my host:50051", "'my host' is not a host name or IP address"),
        ("50051", "it is neither unix:PATH nor HOST:PORT"),
    ],
)
def test_malformed_address_is_called_malformed_and_shown_the_accepted_forms(
    address: str, why: str
) -> None:
    with pytest.raises(StartupError) as caught:
        check_address(address, allow_remote=False)
    message = caught.value.message
    assert f"address {address!r} is malformed: {why}" in message, message
    assert "use unix:PATH, HOST:PORT or [IPv6]:PORT, such as" in message
    assert "loopback" not in message


@pytest.mark.parametrize("address", ["127.0.0.1:0", "localhost:50051", "[::1]:0", "unix:/a b"])
def test_well_formed_loopback_addresses_pass(address: str) -> None:
    check_address(address, allow_remote=False)


def _namespace(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(["--root", "/r", *argv])


def test_the_recovery_log_line_counts_in_words_and_sizes_for_humans() -> None:
    """'1 package kept', '1 orphan directory', '1.5 KiB freed': not '1 packages', raw bytes."""
    from agent.state.recovery import RecoverySummary

    one = RecoverySummary(rows_kept=1, rows_dropped=1, orphans_deleted=1, bytes_freed=1536,
                          envs_forgotten=1, seconds=0.25).line()  # fmt: skip
    assert one == (
        "recovery: 1 package kept, 1 row dropped, 1 orphan directory deleted, 1.5 KiB freed, "
        "1 env forgotten, in 0.250s"
    )
    many = RecoverySummary(rows_kept=2, orphans_deleted=3).line()
    assert "2 packages kept" in many
    assert "0 rows dropped" in many
    assert "3 orphan directories deleted" in many
