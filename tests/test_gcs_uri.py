"""gcs:// URIs (pure): Ray's upload names are accepted as they are; anything but a package name is
refused with a message naming the field and what a gcs URI is; a wheel in py_modules is refused
with the reason, whatever its scheme."""

from __future__ import annotations

import json

import pytest

from agent.core.errors import ConfigError, InvalidRuntimeEnv
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uris import UriKey, UriKind, parse_uri
from agent.install.fetch.gcs_source import GcsConfig

RAY_NAME = "gcs://_ray_pkg_0ff939fec1755cf2.zip"


def test_a_ray_upload_uri_is_accepted_and_its_name_is_the_path() -> None:
    parsed = parse_uri("working_dir", RAY_NAME)
    assert (parsed.scheme, parsed.url, parsed.path, parsed.sha256) == (
        "gcs", RAY_NAME, "_ray_pkg_0ff939fec1755cf2.zip", None,
    )  # fmt: skip


def test_the_scheme_is_taken_in_any_case_and_the_name_is_kept_as_written() -> None:
    """The name is the key the driver stored the package under: its case is kept."""
    assert parse_uri("working_dir", "GCS://_ray_pkg_0ff939fec1755cf2.zip").url == RAY_NAME
    assert parse_uri("working_dir", "gcs://_Ray_Pkg_AB.zip").url == "gcs://_Ray_Pkg_AB.zip"


def test_an_env_with_gcs_packages_names_them_as_keys() -> None:
    text = json.dumps({"working_dir": RAY_NAME, "py_modules": ["gcs://_ray_pkg_1.zip"]})
    env = parse_runtime_env(text, EnvLimits())
    assert env.uri_keys == (
        UriKey(UriKind.WORKING_DIR, RAY_NAME),
        UriKey(UriKind.PY_MODULES, "gcs://_ray_pkg_1.zip"),
    )


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("gcs://", "needs a package name"),
        ("gcs:///_ray_pkg_1.zip", "needs a package name"),
        ("gcs:_ray_pkg_1.zip", "needs a package name"),
        ("gcs://_ray_pkg_1.zip/inner.zip", "no path after the name"),
        ("gcs://_ray_pkg_1.zip/", "no path after the name"),
        ("gcs://_ray_pkg_1.zip:6379", "takes no port"),
        ("gcs://_ray_pkg_1.zip?ns=x", "takes no query"),
        ("gcs://user@_ray_pkg_1.zip", "takes no user info"),
        ("gcs://user:pw@_ray_pkg_1.zip", "takes no user info"),
        ("gcs://_ray_pkg_%41.zip", "letters, digits, '.', '_' and '-'"),
        ("gcs://_ray_pkg_1+x.zip", "letters, digits, '.', '_' and '-'"),
        ("gcs://_ray_pkg_\u00e9.zip", "letters, digits, '.', '_' and '-'"),
        ("gcs://[::1].zip", "letters, digits"),
        ("gcs://_ray_pkg_1.tar.gz", "tarball is not supported yet"),
        ("gcs://_ray_pkg_1.TGZ", "tarball is not supported yet"),
        ("gcs://_ray_pkg_1.zip#", "takes no fragment"),  # empty: urlsplit drops it
        ("gcs://_ray_pkg_1.zip?", "takes no query"),
        ("gcs://_ray_pkg_1.zip?#", "takes no fragment"),
        ("gcs://_ray_pkg_1", "must be a zip"),
        (f"gcs://_ray_pkg_1.zip#sha256={'0' * 64}", "takes no fragment"),
        ("gcs://_ray_pkg_1.zip#x", "takes no fragment"),
    ],
)
def test_a_gcs_uri_that_is_not_a_package_name_is_refused_saying_why(
    value: str, needle: str
) -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_uri("py_modules[1]", value)
    assert info.value.message.startswith("py_modules[1] ")
    assert needle in info.value.message, info.value.message


@pytest.mark.parametrize(
    "value",
    [
        "gcs://mymod-0.1-py3-none-any.whl",  # as a Ray driver uploads a local wheel
        "gcs://mymod-0.1+local-py3-none-any.whl",  # '+' is no gcs name character, yet a wheel
        "https://h.example/wheels/mymod-0.1-py3-none-any.whl",
        "http://127.0.0.1:9/mymod-0.1-1-py3-none-any.whl",  # with a build tag
        "file:///wheels/mymod-0.1-py3-none-any.whl",
    ],
)
def test_a_wheel_in_py_modules_is_a_wheel_package_pip_installs(value: str) -> None:
    """Ray pip-installs a .whl named in py_modules: a package of its own kind, on the path."""
    env = parse_runtime_env(json.dumps({"py_modules": [value]}), EnvLimits())
    (package,) = env.packages
    assert package.key == UriKey(UriKind.PY_MODULES_WHEEL, value)
    assert env.py_modules == (value,)


@pytest.mark.parametrize(
    "value",
    [
        "gcs://mymod.whl",  # no version nor tags
        "https://h.example/mymod-0.1-py3-none-any.WHL",  # pip takes .whl only
        "file:///wheels/my mod-0.1-py3-none-any.whl",
    ],
)
def test_a_py_modules_wheel_whose_name_pip_would_refuse_is_refused_naming_the_form(
    value: str,
) -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_runtime_env(json.dumps({"py_modules": [value]}), EnvLimits())
    assert info.value.message.startswith("py_modules[0] ")


def test_a_gcs_zip_is_taken_in_any_case_as_a_wheel_is_refused_in_any_case() -> None:
    assert parse_uri("working_dir", "gcs://_ray_pkg_1.ZIP").path == "_ray_pkg_1.ZIP"


def test_a_wheel_as_a_working_dir_is_refused_naming_py_modules() -> None:
    with pytest.raises(InvalidRuntimeEnv, match="only py_modules installs"):
        parse_uri("working_dir", "https://h.example/m-1-py3-none-any.whl")


def test_a_uri_that_is_not_a_wheel_but_names_one_in_its_query_is_a_zip() -> None:
    assert parse_uri("py_modules[0]", "https://h.example/m.zip?from=m.whl").path == "/m.zip"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"address": "gcs-host"}, "must be HOST:PORT"),
        ({"address": ""}, "must be HOST:PORT"),
        ({"address": "h:1", "cluster_id_hex": "not hex"}, "must be hex"),
        ({"address": "h:1", "token": "two words"}, "printable ASCII"),
        ({"address": "h:1", "token": "line\nbreak"}, "printable ASCII"),
    ],
)
def test_a_gcs_config_that_cannot_be_sent_is_refused_at_start(
    kwargs: dict[str, str], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        GcsConfig(**kwargs)


def test_the_gcs_metadata_is_ray_s_cluster_id_and_the_bearer_token() -> None:
    assert GcsConfig("127.0.0.1:1", "ab12").metadata() == (("ray_cluster_id", "ab12"),)
    assert GcsConfig("127.0.0.1:1", "ab12", "tok").metadata() == (
        ("ray_cluster_id", "ab12"), ("authorization", "Bearer tok"),
    )  # fmt: skip
    assert GcsConfig("[::1]:1").metadata() == ()


def test_the_cluster_id_is_sent_in_lowercase_as_the_gcs_compares_it() -> None:
    """A Ray GCS compares the id with its ClusterID::Hex(), lowercase: an uppercase spelling of
    the right id is refused as another cluster's (seen on Ray 2.60)."""
    assert GcsConfig("h:1", "AB12cd").metadata() == (("ray_cluster_id", "ab12cd"),)
