"""The ``uv`` field, pure: Ray's two forms into one content-addressed ``uv://<hash>``, the keys
that change the venv part of its identity, each bad shape and each refused option named in its
message, the places uv would read from checked as pip's are, and pip with uv refused."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agent.core.errors import AgentError, InvalidRuntimeEnv, PermissionDenied
from agent.core.pip_spec import MAX_REQUIREMENTS, parse_pip
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uris import UriKey, UriKind
from agent.core.uv_spec import UvSpec, parse_uv, uv_version_matches

OFFLINE = ["--no-index", "--find-links", "/srv/wheels"]


def spec(value: object, roots: tuple[str, ...] = ()) -> UvSpec:
    parsed = parse_uv(value, file_roots=roots)
    assert parsed is not None
    return parsed


def refused(value: object, roots: tuple[str, ...] = ()) -> str:
    with pytest.raises(AgentError) as failed:
        parse_uv(value, file_roots=roots)
    return failed.value.message


def test_the_list_form_and_the_object_form_with_defaults_name_one_venv() -> None:
    listed = spec(["Requests>=2.31", "numpy", "numpy"])
    for dicted in (
        {"packages": ["numpy", "requests>=2.31"]},
        {"packages": ["numpy", "requests>=2.31"], "uv_check": False, "uv_version": ""},
        {"packages": ["numpy", "requests>=2.31"], "uv_version": None,
         "uv_pip_install_options": []},
    ):  # fmt: skip
        assert spec(dicted) == listed
    assert listed.packages == ("numpy", "requests>=2.31")
    assert re.fullmatch(r"uv://[0-9a-f]{32}", listed.uri), listed.uri


def test_rays_normalised_object_with_its_no_cache_default_is_the_list_forms_venv() -> None:
    """Ray's driver writes the object form with uv_check false and ["--no-cache"]; the agent
    drops --no-cache (its venvs share its counted cache), so both are one venv."""
    ray = {"packages": ["numpy"], "uv_check": False, "uv_pip_install_options": ["--no-cache"]}
    assert spec(ray) == spec(["numpy"])
    assert spec({"packages": ["numpy"], "uv_pip_install_options": ["-n", *OFFLINE]}).options == (
        tuple(OFFLINE)
    )


def test_uv_check_uv_version_and_options_each_make_another_venv() -> None:
    base = {"packages": ["numpy"]}
    uris = {
        spec(base).uri,
        spec({**base, "uv_check": True}).uri,
        spec({**base, "uv_version": "==0.13.9"}).uri,
        spec({**base, "uv_pip_install_options": OFFLINE}).uri,
    }
    assert len(uris) == 4


def test_uv_and_pip_with_the_same_packages_are_different_venvs() -> None:
    pip = parse_pip(["numpy"])
    assert pip is not None
    assert spec(["numpy"]).digest != pip.digest


def test_an_empty_set_names_nothing_and_adds_no_key() -> None:
    assert parse_uv([]) is None
    assert parse_uv({"packages": []}) is None
    env = parse_runtime_env(json.dumps({"uv": []}), EnvLimits())
    assert env.uri_keys == ()


def test_the_env_names_the_uv_kind_and_its_identity_keeps_the_set() -> None:
    env = parse_runtime_env(json.dumps({"uv": ["numpy"]}), EnvLimits())
    [key] = env.uri_keys
    assert key == UriKey(UriKind.UV, spec(["numpy"]).uri)
    same = parse_runtime_env(json.dumps({"uv": {"packages": ["NumPy"]}}), EnvLimits())
    assert same.env_id == env.env_id


def test_pip_and_uv_in_one_env_are_refused_as_ray_refuses_them() -> None:
    with pytest.raises(InvalidRuntimeEnv) as failed:
        parse_runtime_env(json.dumps({"pip": ["a"], "uv": ["b"]}), EnvLimits())
    assert "the pip and uv fields cannot both be set" in failed.value.message


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("numpy", "uv must be a list of requirements or an object with packages, got a string"),
        (3, "got int"),
        ({"uv_check": True}, "uv must include the field packages"),
        ({"packages": ["a"], "uv_checks": True}, "unknown uv field(s) 'uv_checks'; supported: "
         "packages, uv_version, uv_check, uv_pip_install_options"),
        ({"packages": "numpy"}, "uv.packages must be a list of strings"),
        ({"packages": [1]}, "uv.packages must be a list of strings"),
        ({"packages": ["a"], "uv_pip_install_options": "-q"},
         "uv.uv_pip_install_options must be a list of strings"),
        ({"packages": ["a"], "uv_check": "yes"}, "uv.uv_check must be a boolean, got 'yes'"),
        ({"packages": ["a"], "uv_version": 1}, "uv.uv_version must be a string, got int"),
        ({"packages": ["a"], "uv_version": "latest"},
         "uv.uv_version 'latest' is not a version specifier"),
        ({"packages": ["a"], "uv_version": "=" * 101}, "the limit is 100"),
        (["not a requirement!"], "uv.packages[0] 'not a requirement!' is not a requirement"),
        (["a\nb"], "is not a valid item (at most 4096 characters, no NUL, no newline)"),
        (["x" * 5000], "is not a valid item (at most 4096 characters"),
        (["a"] * (MAX_REQUIREMENTS + 1), f"the limit is {MAX_REQUIREMENTS}"),
    ],
)  # fmt: skip
def test_a_uv_field_of_the_wrong_shape_is_refused_saying_what_and_the_limit(
    value: object, words: str
) -> None:
    assert words in refused(value)


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("-r", "reads a requirements file"), ("--requirements", "reads a requirements file"),
        ("-c", "reads a constraints file"), ("--overrides", "reads an overrides file"),
        ("--cert", "reads a file of the agent's node"),
        ("--config-file", "reads a file of the agent's node"),
        ("--target", "writes outside the env's venv"), ("--prefix", "writes outside"),
        ("--system", "writes outside"), ("--cache-dir", "writes outside"),
        ("--python", "picks another interpreter"), ("-p", "picks another interpreter"),
        ("--link-mode", "the agent links every venv to its shared wheel cache"),
        ("--keyring-provider", "runs a credential helper"),
        ("--config-setting", "passes arguments to a package's build backend"),
    ],
)  # fmt: skip
def test_an_option_that_escapes_the_venv_is_refused_by_name_with_why(option: str, why: str) -> None:
    message = refused({"packages": ["a"], "uv_pip_install_options": [option, "x"]})
    assert f"uv.uv_pip_install_options: '{option}' is refused: {why}" in message


@pytest.mark.parametrize("option", ["--targ", "--no-cach", "-qU", "--frobnicate", "--quiet=1"])
def test_an_option_off_the_allow_list_or_abbreviated_is_refused(option: str) -> None:
    message = refused({"packages": ["a"], "uv_pip_install_options": [option]})
    assert f"'{option}' is not an option an env may pass" in message


@pytest.mark.parametrize(
    "options", [["--color=auto"], ["--color", "never"], ["--no-cache", "--color=auto"]]
)
def test_display_options_ray_users_pass_are_taken(options: list[str]) -> None:
    """Ray's test_package_install_with_multiple_options passes --color=auto."""
    got = spec({"packages": ["a"], "uv_pip_install_options": options})
    assert got.options == tuple(o for o in options if o != "--no-cache")


def test_an_option_that_needs_a_value_and_has_none_is_refused() -> None:
    assert "'--find-links' needs a value" in refused(
        {"packages": ["a"], "uv_pip_install_options": ["--find-links"]}
    )


def test_the_places_uv_reads_from_are_checked_against_the_allowed_roots() -> None:
    roots = ("/srv/allowed",)
    ok = spec({"packages": ["a"], "uv_pip_install_options": OFFLINE})
    assert ok.options == tuple(OFFLINE)
    for option in ("--find-links", "--index", "--default-index", "--index-url"):
        with pytest.raises(PermissionDenied) as failed:
            parse_uv(
                {"packages": ["a"], "uv_pip_install_options": [option, "/etc"]},
                file_roots=roots,
            )
        assert "outside the folders" in failed.value.message, option
    with pytest.raises(PermissionDenied):
        parse_uv(["a @ file:///etc/x.whl"], file_roots=roots)
    remote = spec({"packages": ["a"], "uv_pip_install_options": ["--index", "https://x.test/s"]})
    assert remote.options == ("--index", "https://x.test/s")


def test_an_echoed_option_is_cut_short() -> None:
    message = refused({"packages": ["a"], "uv_pip_install_options": ["--" + "z" * 3000]})
    assert len(message) < 600
    assert "characters)" in message


def test_the_uv_version_is_a_specifier_the_agents_uv_must_satisfy() -> None:
    pinned = spec({"packages": ["a"], "uv_version": "== 0.13.9"})
    assert pinned.uv_version == "==0.13.9"
    assert uv_version_matches(pinned, "0.13.9")
    assert not uv_version_matches(pinned, "0.14.0")
    assert uv_version_matches(spec(["a"]), "0.1.0"), "no uv_version: any uv"
    ranged: Any = spec({"packages": ["a"], "uv_version": ">=0.5,<1"})
    assert uv_version_matches(ranged, "0.13.9")


def test_what_rays_own_validation_makes_of_both_forms_is_one_venv_here() -> None:
    """Ray 2.60's ``parse_and_validate_uv`` (what its driver sends) of the list and of the
    object form parse into the same venv as the list itself."""
    validation = pytest.importorskip("ray._private.runtime_env.validation")
    listed = validation.parse_and_validate_uv(["numpy", "requests"])
    dicted = validation.parse_and_validate_uv({"packages": ["numpy", "requests"]})
    assert dicted["uv_pip_install_options"] == ["--no-cache"], "Ray's default, as read"
    assert spec(listed) == spec(dicted) == spec(["requests", "numpy"])


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("--requirement", "reads a requirements file"), ("--constraint", "reads a constraints"),
        ("--excludes", "reads a file of the agent's node"),
        ("--build-constraints", "reads a file of the agent's node"),
        ("--group", "reads a file of the agent's node (a pyproject.toml"),
        ("--project", "reads a file of the agent's node"),
        ("--directory", "runs uv in a folder of the agent's node"),
        ("--user", "writes outside"), ("--break-system-packages", "writes outside"),
        ("-t", "writes outside"),
        ("--managed-python", "picks another interpreter"),
        ("--python-preference", "picks another interpreter"),
        ("--config-settings-package", "passes arguments to a package's build backend"),
        ("--help", "prints and exits"), ("--show-settings", "prints and exits"),
    ],
)  # fmt: skip
def test_every_refusal_of_the_full_table_names_why(option: str, why: str) -> None:
    message = refused({"packages": ["a"], "uv_pip_install_options": [option, "x"]})
    assert f"uv.uv_pip_install_options: '{option}' is refused: {why}" in message


@pytest.mark.parametrize(
    "options",
    [
        ["--reinstall-package", "a"],
        ["--no-build-isolation-package", "a"], ["-P", "a"], ["--upgrade-package=a"],
        ["--prerelease-package", "a=allow"], ["--exact"], ["--dry-run"], ["--no-editable"],
        ["--torch-backend", "cpu"], ["--no-installer-metadata"], ["--pre"],
        ["--trusted-host", "x.test"], ["--force-reinstall"], ["--no-python-downloads"],
        ["--python-version", "3.11"], ["--no-sources-package", "a"], ["--system-certs"],
    ],
)  # fmt: skip
def test_uv_options_refused_before_are_taken(options: list[str]) -> None:
    """Before: each 'not an option an env may pass'. Every option of uv pip install but the
    refused ones is taken, and is part of the venv's key."""
    got = spec({"packages": ["a"], "uv_pip_install_options": options})
    assert got.options == tuple(options)
    assert got.uri != spec(["a"]).uri


def test_pips_spelling_of_no_cache_is_dropped_as_rays_default_is() -> None:
    """uv takes pip's --no-cache-dir for its --no-cache: dropped likewise (before: refused)."""
    assert spec({"packages": ["a"], "uv_pip_install_options": ["--no-cache-dir"]}) == spec(["a"])


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ("https://x.test/a,/etc", "/etc"), ("https://x.test/a,file:///etc", "file:///etc"),
    ],
)  # fmt: skip
def test_each_place_of_a_find_links_uv_splits_at_commas_is_checked(value: str, bad: str) -> None:
    """Before: the value was checked whole (a remote URL), and uv read '/etc' too."""
    with pytest.raises(PermissionDenied) as failed:
        parse_uv({"packages": ["a"], "uv_pip_install_options": ["--find-links", value]},
                 file_roots=("/srv/allowed",))  # fmt: skip
    assert f"--find-links '{bad}' is outside the folders" in failed.value.message


@pytest.mark.parametrize("option", ["--extra-index-url", "--index"])
def test_each_index_of_a_value_uv_splits_at_whitespace_is_checked(option: str) -> None:
    with pytest.raises(PermissionDenied) as failed:
        parse_uv({"packages": ["a"], "uv_pip_install_options": [option, "https://x.test/s /etc"]},
                 file_roots=("/srv/allowed",))  # fmt: skip
    assert f"{option} '/etc' is outside the folders" in failed.value.message


def test_a_named_index_is_checked_by_its_url() -> None:
    """uv's --index and --default-index take ``name=URL``: before, refused as no URL."""
    named = ["--index", "torch=https://x.test/s", "--default-index", "main=https://y.test/s"]
    assert spec({"packages": ["a"], "uv_pip_install_options": named}).options == tuple(named)
    with pytest.raises(PermissionDenied):
        parse_uv({"packages": ["a"], "uv_pip_install_options": ["--index", "local=/etc"]},
                 file_roots=("/srv/allowed",))  # fmt: skip


def test_option_lines_of_a_uv_list_are_taken_keyed_and_given_after_the_options() -> None:
    """Before: each refused as an option line. Ray writes the list into a requirements file:
    the lines uv reads there are taken, in their order, part of the key and of the identity."""
    index = "--index-url https://x.test/simple"
    lines = [index, "--extra-index-url=https://y.test/s", "-f /srv/w", "--no-binary :all:"]
    got = spec([*lines, "numpy"])
    assert got.packages == ("numpy",)
    assert got.lines == tuple(tuple(line.split()) for line in lines)
    assert got.line_options == tuple(word for line in lines for word in line.split())
    assert got.canonical()["packages"] == [*lines, "numpy"]
    assert got.uri != spec(["numpy"]).uri
    assert got.uri != spec([*reversed(lines), "numpy"]).uri, "their order is uv's order"
    assert spec(["numpy"]) == spec({"packages": ["numpy"], "uv_pip_install_options": []})


def test_a_line_is_read_as_uv_reads_it_one_option_up_to_a_hash() -> None:
    got = spec(["--index-url https://x.test/simple#not-the-url", "--no-index # offline", "a"])
    assert got.lines == (("--index-url", "https://x.test/simple"), ("--no-index",))
    assert "holds more than one option: uv reads one option a line" in refused(
        ["--no-index --find-links /srv/w", "a"]
    )


def test_the_lines_uv_ignores_are_taken_and_left_out_as_uv_leaves_them() -> None:
    ignored = ["--pre", "--trusted-host x.test", "--prefer-binary", "--use-feature fast-deps"]
    assert spec([*ignored, "a"]) == spec(["a"])


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("--upgrade", "a line may hold the options uv reads from a requirements file: "
         "--index-url, --extra-index-url, --no-index, --find-links, --no-binary, --only-binary, "
         "--require-hashes; pass any other in uv.uv_pip_install_options"),
        ("--index https://x.test/s", "pass any other in uv.uv_pip_install_options"),
        ("-r /srv/r.txt", "'-r' is refused: reads a requirements file"),
        ("-c /srv/c.txt", "'-c' is refused: reads a constraints file"),
        ("--index-url", "'--index-url' needs a value"),
    ],
)  # fmt: skip
def test_a_line_uv_does_not_take_is_refused_saying_why(line: str, words: str) -> None:
    assert words in refused([line, "a"])


def test_two_index_url_lines_are_refused_as_uv_refuses_them() -> None:
    message = refused(["-i https://x.test/a", "--index-url=https://x.test/b", "a"])
    assert "uv.packages: 2 --index-url lines" in message
    assert "name the others with --extra-index-url" in message


def test_a_lines_places_are_checked_against_the_allowed_roots() -> None:
    roots = ("/srv/allowed",)
    for line in ("--index-url /etc", "--find-links=/etc", "--extra-index-url file:///etc",
                 "-f https://x.test/w,/etc"):  # fmt: skip
        with pytest.raises(PermissionDenied) as failed:
            parse_uv([line, "a"], file_roots=roots)
        assert "outside the folders" in failed.value.message, line


def test_uv_is_given_the_lines_as_it_makes_of_a_requirements_file() -> None:
    """uv keeps the command line's default index over a file's --index-url, and its command
    line takes --no-index and --require-hashes once: such a line is left out there."""
    got = spec({"packages": ["-i https://x.test/file", "--no-index", "--no-index",
                             "--require-hashes", "--extra-index-url https://x.test/e", "a"],
                "uv_pip_install_options": ["--default-index", "https://x.test/cli",
                                           "--require-hashes"]})  # fmt: skip
    assert got.line_options == ("--no-index", "--extra-index-url", "https://x.test/e")
    alone = spec(["-i https://x.test/file", "a"])
    assert alone.line_options == ("-i", "https://x.test/file")
