"""Unit tests for runtime env parsing: canonical form, env id, URI keys, and every rejection."""

from __future__ import annotations

import json
import random
from string import Template
from typing import Any
from urllib.parse import SplitResult

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.env_fields import NEEDS_ON_NODE
from agent.core.errors import ErrorKind, InvalidRuntimeEnv, UnsupportedOnNode
from agent.core.runtime_env import (
    MAX_ARG_STRLEN,
    EnvLimits,
    check_env_var_size,
    env_var_bytes,
    parse_runtime_env,
)
from agent.core.uris import SCHEMES, Scheme, UriKey, UriKind, parse_uri

LIMITS = EnvLimits()
WD = "file:///pkgs/wd.zip"
M1 = "https://example.com/m1.zip"
M2 = "http://127.0.0.1:8000/m2.zip"
DIGEST = "ab" * 32


def parse(obj: Any, limits: EnvLimits = LIMITS) -> Any:
    return parse_runtime_env(json.dumps(obj), limits)


# -- identity -----------------------------------------------------------------------------------


def test_env_id_and_canonical_do_not_depend_on_key_order_or_whitespace() -> None:
    a_text = '{"working_dir": "$wd", "env_vars": {"B": "2", "A": "1"}, "py_modules": ["$m1"]}'
    b_text = '{ "py_modules" : [ "$m1" ] ,\n "env_vars":{"A":"1","B":"2"},"working_dir":"$wd"}'
    a = parse_runtime_env(Template(a_text).substitute(wd=WD, m1=M1), LIMITS)
    b = parse_runtime_env(Template(b_text).substitute(wd=WD, m1=M1), LIMITS)
    assert a.env_id == b.env_id
    assert a.canonical == b.canonical
    assert a.canonical == json.dumps(
        {"env_vars": {"A": "1", "B": "2"}, "py_modules": [M1], "working_dir": WD},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert len(a.env_id) == 32
    assert int(a.env_id, 16) >= 0


def test_config_is_parsed_but_not_part_of_identity() -> None:
    plain = parse({"working_dir": WD})
    configured = parse(
        {"working_dir": WD, "config": {"setup_timeout_seconds": 30, "eager_install": True}}
    )
    assert configured.env_id == plain.env_id
    assert configured.canonical == plain.canonical
    assert configured.setup_timeout_seconds == 30
    assert configured.eager_install is True
    assert plain.setup_timeout_seconds is None


_FULL: dict[str, Any] = {"working_dir": WD, "py_modules": [M1], "env_vars": {"X": "1"}}


@pytest.mark.parametrize(
    ("name", "empty"),
    [
        ("working_dir", None), ("py_modules", []), ("py_modules", None), ("env_vars", {}),
        ("py_executable", None), ("py_executable", ""), ("java_jars", []), ("java_jars", None),
    ],
)  # fmt: skip
def test_empty_fields_have_the_same_id_as_absent_ones(name: str, empty: object) -> None:
    absent = {k: v for k, v in _FULL.items() if k != name}
    assert parse({**absent, name: empty}).env_id == parse(absent).env_id
    assert parse({**absent, name: empty}).canonical == parse(absent).canonical
    assert parse({name: empty}).env_id == parse({}).env_id
    assert parse({}).canonical == "{}"


def test_py_modules_are_deduplicated_keeping_first_occurrence_order() -> None:
    env = parse({"py_modules": [M2, M1, M2, M1]})
    assert env.py_modules == (M2, M1)
    assert env.env_id == parse({"py_modules": [M2, M1]}).env_id
    assert env.env_id != parse({"py_modules": [M1, M2]}).env_id


def test_py_executable_is_part_of_identity_as_written() -> None:
    """It changes what the worker runs under: another command is another env; kept verbatim
    (Ray hands it to bash), so even its spacing is its own."""
    plain = parse(_FULL)
    wrapped = parse({**_FULL, "py_executable": "python3 -X utf8"})
    assert wrapped.py_executable == "python3 -X utf8"
    assert plain.py_executable is None
    assert wrapped.env_id != plain.env_id
    assert json.loads(wrapped.canonical)["py_executable"] == "python3 -X utf8"
    assert parse({**_FULL, "py_executable": "python3  -X utf8"}).env_id != wrapped.env_id
    assert wrapped.uri_keys == plain.uri_keys, "a command is no package"


def test_a_tab_separates_py_executables_words_as_a_space_does() -> None:
    assert parse({"py_executable": "python3\t-X utf8"}).py_executable == "python3\t-X utf8"


def test_py_executable_at_the_length_limit_parses_and_one_more_is_refused() -> None:
    at_limit = "p" * 4096
    assert parse({"py_executable": at_limit}).py_executable == at_limit
    with pytest.raises(InvalidRuntimeEnv, match="4097 characters long; the limit is 4096"):
        parse({"py_executable": at_limit + "p"})


def test_java_jars_are_packages_deduplicated_in_order_after_pip() -> None:
    jar, zipped = "file:///jars/a.jar", "https://example.com/libs.zip"
    env = parse({"java_jars": [jar, zipped, jar], "py_modules": [M1], "pip": ["requests"]})
    assert env.java_jars == (jar, zipped)
    kinds = [key.kind for key in env.uri_keys]
    assert kinds == [UriKind.PY_MODULES, UriKind.PIP, UriKind.JAVA_JARS, UriKind.JAVA_JARS]
    assert env.uri_keys[2:] == (UriKey(UriKind.JAVA_JARS, jar), UriKey(UriKind.JAVA_JARS, zipped))
    assert json.loads(env.canonical)["java_jars"] == [jar, zipped]
    assert (
        env.env_id
        == parse({"java_jars": [jar, zipped], "py_modules": [M1], "pip": ["requests"]}).env_id
    )
    assert parse({"java_jars": [zipped, jar]}).env_id != parse({"java_jars": [jar, zipped]}).env_id


def test_java_jars_count_against_the_uri_limit() -> None:
    jars = [f"file:///jars/{i}.jar" for i in range(3)]
    with pytest.raises(InvalidRuntimeEnv, match="names 4 distinct URIs; the limit is 3"):
        parse({"java_jars": jars, "py_modules": [M1]}, EnvLimits(max_uris=3))


@pytest.mark.parametrize(
    ("name", "value", "needs"),
    [
        ("conda", {"dependencies": ["numpy"]}, "a conda installation on the node"),
        ("conda", "myenv", "which this agent does not manage"),
        ("image_uri", "docker.io/rayproject/ray:2.60.0", "a container runtime (podman)"),
        ("container", {"image": "x"}, "a container runtime (podman)"),
        ("_nsight", "default", "NVIDIA Nsight Systems"),
        ("_rocprof_sys", {"args": {}}, "ROCm's rocprof-sys"),
    ],
)
def test_fields_needing_what_the_node_lacks_are_refused_by_name_as_a_precondition(
    name: str, value: object, needs: str
) -> None:
    with pytest.raises(UnsupportedOnNode) as caught:
        parse({"env_vars": {"A": "1"}, name: value})
    assert caught.value.kind is ErrorKind.REFUSED
    assert caught.value.message.startswith(
        f"runtime_env field {name!r} cannot be used on this node"
    )
    assert needs in caught.value.message


def test_the_refused_fields_are_ray_2_60s_own() -> None:
    """Each name refused as unsupported on the node is a field Ray 2.60 knows (so a typo is
    still an unknown field)."""
    ray_env = pytest.importorskip("ray.runtime_env")
    assert set(NEEDS_ON_NODE) <= ray_env.RuntimeEnv.known_fields
    assert "nsight" not in ray_env.RuntimeEnv.known_fields
    assert "mpi" not in ray_env.RuntimeEnv.known_fields
    assert {"py_executable", "java_jars", "excludes"} <= ray_env.RuntimeEnv.known_fields


def test_several_refused_fields_are_each_named_with_what_they_need() -> None:
    with pytest.raises(UnsupportedOnNode) as caught:
        parse({"conda": "e", "_nsight": "default"})
    message = caught.value.message
    for needle in ("'conda' cannot be used", "'_nsight' cannot be used", "conda installation"):
        assert needle in message
    assert "Nsight Systems" in message


def test_an_unknown_field_is_invalid_before_a_refused_one() -> None:
    with pytest.raises(InvalidRuntimeEnv, match=r"unknown runtime_env field.*'workdir'"):
        parse({"conda": "e", "workdir": "x"})


def test_uri_keys_are_distinct_with_working_dir_first() -> None:
    env = parse({"py_modules": [M1, M2, M1], "working_dir": WD})
    assert env.uri_keys == (
        UriKey(UriKind.WORKING_DIR, WD),
        UriKey(UriKind.PY_MODULES, M1),
        UriKey(UriKind.PY_MODULES, M2),
    )
    assert str(env.uri_keys[0]) == f"working_dir:{WD}"


def test_a_uri_used_as_working_dir_and_py_module_gives_two_keys() -> None:
    env = parse({"working_dir": M1, "py_modules": [M1]})
    assert env.uri_keys == (UriKey(UriKind.WORKING_DIR, M1), UriKey(UriKind.PY_MODULES, M1))
    assert len(set(env.uri_keys)) == 2


# -- parse_uri ----------------------------------------------------------------------------------


def test_sha256_fragment_is_lowercased_and_dropped_from_the_url() -> None:
    parsed = parse_uri("working_dir", f"https://h.example/p.zip#sha256={DIGEST.upper()}")
    assert parsed.sha256 == DIGEST
    assert parsed.url == "https://h.example/p.zip"
    assert parsed.scheme == "https"
    assert parsed.path == "/p.zip"


@pytest.mark.parametrize(
    ("uri", "scheme", "path"),
    [
        ("file:///abs/p.zip", "file", "/abs/p.zip"),
        ("file://localhost/abs/p.zip", "file", "/abs/p.zip"),
        ("file:///abs/with%20space.zip", "file", "/abs/with space.zip"),
        ("http://127.0.0.1:9/p.zip?v=1", "http", "/p.zip"),
        ("HTTPS://Example.com/p.zip", "https", "/p.zip"),
    ],
)
def test_parse_uri_accepts_supported_forms(uri: str, scheme: str, path: str) -> None:
    parsed = parse_uri("working_dir", uri)
    assert (parsed.scheme, parsed.path, parsed.sha256) == (scheme, path, None)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (5, "must be a URI string"),
        ("", "must not be empty"),
        ("pkgs/wd.zip", "relative and bare paths"),
        ("/abs/wd.zip", "relative and bare paths"),
        ("hdfs://nn/wd.zip", "scheme 'hdfs' is not supported"),
        ("s3://Bucket/wd.zip", "not an S3 bucket name"),
        ("gs://bucket/", "names an object's key"),
        ("file://host/x.zip", "not host 'host'"),
        ("file:///x.zip?q=1", "takes no query"),
        ("file:///", "must be absolute"),
        ("file:///x.zip#md5=abc", "#sha256=<64 hex digits>"),
        ("file:///x.zip#sha256=abc", "#sha256=<64 hex digits>"),
        (f"file:///x.zip#sha256={'g' * 64}", "#sha256=<64 hex digits>"),
        ("https:///p.zip", "needs a host"),
        ("http://h:99999/p.zip", "bad port"),
        ("file:///a b.zip", "whitespace or control"),
        ("https://h/" + "a" * 5000, "the limit is 4096"),
    ],
)
def test_parse_uri_rejects_bad_uris_naming_the_field(value: object, needle: str) -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_uri("py_modules[3]", value)
    assert info.value.message.startswith("py_modules[3]")
    assert needle in info.value.message


def test_the_supported_schemes_named_in_a_refusal_are_the_registry() -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_uri("working_dir", "ftp://h.example/p.zip")
    assert info.value.message.endswith(
        "supported schemes are file, http, https, gcs, s3, gs, azure and abfss"
    )


def test_a_scheme_is_one_registry_entry_and_refusals_then_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hdfs:// registered with its check: accepted, parsed by that check, listed in refusals."""

    def hdfs_path(parts: SplitResult, where: str) -> str:
        if not parts.netloc:
            raise InvalidRuntimeEnv(f"{where}: an hdfs URI names a name node")
        return parts.path

    monkeypatch.setitem(SCHEMES, "hdfs", Scheme(hdfs_path))
    parsed = parse_uri("working_dir", f"HDFS://nn/k.zip#sha256={DIGEST}")
    assert (parsed.scheme, parsed.url, parsed.path, parsed.sha256) == (
        "hdfs", "hdfs://nn/k.zip", "/k.zip", DIGEST,
    )  # fmt: skip
    with pytest.raises(InvalidRuntimeEnv, match="hdfs URI names a name node"):
        parse_uri("working_dir", "hdfs:///k.zip")
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_uri("working_dir", "ftp://h/k.zip")
    assert info.value.message.endswith(
        "supported schemes are file, http, https, gcs, s3, gs, azure, abfss and hdfs"
    )


# -- rejections of a whole env ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('{"nsight": "default"}', ["'nsight'", "Ray spells 'nsight' as '_nsight'", "supported:"]),
        ('{"mpi": {}}', ["unknown runtime_env field(s) 'mpi'", "supported: working_dir"]),
        ('{"py_executable": ["python"]}', ["py_executable must be a string", "a list"]),
        ('{"py_executable": "   "}', ["py_executable holds only whitespace"]),
        ('{"py_executable": "py\\u0000"}', ["py_executable", "control character"]),
        ('{"java_jars": {"a": 1}}', ["java_jars must be a list", "an object"]),
        ('{"java_jars": [3]}', ["java_jars[0] must be a URI string"]),
        ('{"java_jars": ["file:///a.class"]}', ["java_jars[0]", "names a .jar", "or a .zip"]),
        ('{"java_jars": ["gcs://_ray_pkg_a.jar"]}', ["java_jars[0]", "must be a zip"]),
        ('{"workdir": "file:///x.zip"}', ["'workdir'", "supported: working_dir"]),
        ('{"working_dir": 3}', ["working_dir must be a URI string", "got int"]),
        ('{"working_dir": ["file:///x.zip"]}', ["working_dir must be a URI string", "a list"]),
        ('{"working_dir": "rel/dir.zip"}', ["working_dir", "relative and bare paths"]),
        ('{"working_dir": "/abs/dir"}', ["working_dir", "relative and bare paths"]),
        ('{"working_dir": "hdfs://b/k.zip"}', ["working_dir", "'hdfs' is not supported"]),
        ('{"working_dir": "file://host/x.zip"}', ["working_dir", "not host 'host'"]),
        ('{"working_dir": "file:///x.zip#frag"}', ["working_dir", "#sha256="]),
        ('{"py_modules": "file:///x.zip"}', ["py_modules must be a list", "a string"]),
        ('{"py_modules": ["file:///a.zip", 7]}', ["py_modules[1] must be a URI string"]),
        ('{"py_modules": ["file:///a.zip", "hdfs://b/k"]}', ["py_modules[1]", "'hdfs'"]),
        ('{"env_vars": ["A=1"]}', ["env_vars must be an object", "a list"]),
        ('{"env_vars": {"A": 1}}', ["env_vars['A'] must be a string", "got int"]),
        ('{"env_vars": {"A": null}}', ["env_vars['A'] must be a string", "null"]),
        ('{"env_vars": {"A=B": "1"}}', ["env_vars", "not a valid variable name"]),
        ('{"env_vars": {"": "1"}}', ["env_vars", "not a valid variable name"]),
        ('{"env_vars": {"A": "x\\u0000y"}}', ["env_vars['A']", "NUL"]),
        ('{"config": 5}', ["config must be an object"]),
        ('{"config": {"retries": 1}}', ["unknown config field", "'retries'"]),
        ('{"config": {"setup_timeout_seconds": 0}}', ["config.setup_timeout_seconds"]),
        ('{"config": {"setup_timeout_seconds": true}}', ["config.setup_timeout_seconds"]),
        ('{"config": {"setup_timeout_seconds": 1.5}}', ["config.setup_timeout_seconds"]),
        ('{"config": {"eager_install": "yes"}}', ["config.eager_install must be a boolean"]),
        ("[]", ["must be a JSON object", "a list"]),
        ('"text"', ["must be a JSON object", "a string"]),
        ("null", ["must be a JSON object", "null"]),
        ("", ["serialized_runtime_env is empty"]),
        ("   ", ["serialized_runtime_env is empty"]),
        ('{"working_dir": ', ["serialized_runtime_env is not valid JSON"]),
        ("{'a': 1}", ["serialized_runtime_env is not valid JSON"]),
        ("[" * 100_000, ["serialized_runtime_env is not valid JSON"]),
        ('{"env_vars": {}, "env_vars": {}}', ["'env_vars' appears twice"]),
        ('{"env_vars": {"A": "1", "A": "2"}}', ["'A' appears twice"]),
    ],
)
def test_parse_runtime_env_rejects_bad_input_naming_the_field(
    text: str, needles: list[str]
) -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_runtime_env(text, LIMITS)
    for needle in needles:
        assert needle in info.value.message


@pytest.mark.parametrize(
    "text",
    [
        '{"env_vars": {"A": "\\ud800"}}',
        '{"env_vars": {"\\udfff": "1"}}',
        '{"working_dir": "file:///x\\ud800.zip"}',
    ],
)
def test_lone_surrogate_escapes_are_invalid_runtime_env(text: str) -> None:
    """Valid JSON text whose escapes decode to lone surrogates is bad input, not a crash."""
    with pytest.raises(InvalidRuntimeEnv):
        parse_runtime_env(text, LIMITS)


def test_too_many_uris_is_rejected_with_count_and_limit() -> None:
    limits = EnvLimits(max_uris=3)
    ok = parse({"working_dir": WD, "py_modules": [M1, M2, M1]}, limits)
    assert len(ok.uri_keys) == 3
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse({"working_dir": WD, "py_modules": [M1, M2, "file:///m3.zip"]}, limits)
    assert "names 4 distinct URIs; the limit is 3" in info.value.message


def test_json_over_max_json_bytes_is_rejected_with_size_and_limit() -> None:
    text = json.dumps({"env_vars": {"A": "x" * 200}})
    limits = EnvLimits(max_json_bytes=len(text) - 1)
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_runtime_env(text, limits)
    assert info.value.message == (
        f"serialized_runtime_env is {len(text)} bytes; the limit is {len(text) - 1}"
    )
    assert parse_runtime_env(text, EnvLimits(max_json_bytes=len(text))).env_vars["A"] == "x" * 200


# -- env var sizes ------------------------------------------------------------------------------


def test_env_var_value_over_max_arg_strlen_is_rejected_naming_the_variable() -> None:
    # "K=" + value + NUL: exactly MAX_ARG_STRLEN is the largest the kernel accepts.
    fits = {"K": "v" * (MAX_ARG_STRLEN - 3)}
    check_env_var_size(fits, EnvLimits(max_env_var_bytes=10 * MAX_ARG_STRLEN))
    over = {"K": "v" * (MAX_ARG_STRLEN - 2)}
    with pytest.raises(InvalidRuntimeEnv) as info:
        check_env_var_size(over, EnvLimits(max_env_var_bytes=10 * MAX_ARG_STRLEN))
    assert "env_vars['K']" in info.value.message
    assert "MAX_ARG_STRLEN" in info.value.message
    assert str(MAX_ARG_STRLEN) in info.value.message
    with pytest.raises(InvalidRuntimeEnv, match="MAX_ARG_STRLEN"):
        parse({"env_vars": over})


def test_total_env_var_bytes_over_the_limit_names_size_and_limit() -> None:
    env_vars = {f"V{i}": "x" * 100 for i in range(10)}
    total = env_var_bytes(env_vars)
    assert total == 10 * (2 + 100 + 2 + 8)
    check_env_var_size(env_vars, EnvLimits(max_env_var_bytes=total))
    with pytest.raises(InvalidRuntimeEnv) as info:
        check_env_var_size(env_vars, EnvLimits(max_env_var_bytes=total - 1))
    assert f"take {total} bytes" in info.value.message
    assert f"the limit is {total - 1} bytes" in info.value.message
    assert "max_env_var_bytes" in info.value.message
    with pytest.raises(InvalidRuntimeEnv, match="max_env_var_bytes"):
        parse({"env_vars": env_vars}, EnvLimits(max_env_var_bytes=total - 1))


def test_env_var_size_counts_utf8_bytes_not_characters() -> None:
    assert env_var_bytes({"K": "é"}) == 1 + 2 + 2 + 8


# -- properties ---------------------------------------------------------------------------------

_names = st.text(alphabet="ABCDEFGHIJ_", min_size=1, max_size=6)
_values = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_uris = st.sampled_from([WD, M1, M2, "file:///m3.zip", "https://h/m4.zip"])


@st.composite
def _env_and_shuffled_text(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    env: dict[str, Any] = {}
    if draw(st.booleans()):
        env["working_dir"] = draw(_uris)
    if draw(st.booleans()):
        env["py_modules"] = draw(st.lists(_uris, max_size=4))
    if draw(st.booleans()):
        env["env_vars"] = draw(st.dictionaries(_names, _values, max_size=5))
    if draw(st.booleans()):
        env["config"] = {"setup_timeout_seconds": draw(st.integers(1, 100))}
    rng = random.Random(draw(st.integers(0, 2**32)))

    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rng.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        return value

    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :  ")]))
    ascii_only = draw(st.booleans())
    text = json.dumps(shuffled(env), indent=indent, separators=separators, ensure_ascii=ascii_only)
    return env, text


@settings(max_examples=200, deadline=None)
@given(_env_and_shuffled_text())
def test_property_env_id_ignores_key_order_and_whitespace(case: tuple[dict[str, Any], str]) -> None:
    env, text = case
    reference = parse_runtime_env(json.dumps(env, sort_keys=True), LIMITS)
    reordered = parse_runtime_env(text, LIMITS)
    assert reordered.env_id == reference.env_id
    assert reordered.canonical == reference.canonical
    assert reordered.uri_keys == reference.uri_keys


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(_names, _values, max_size=5),
    st.dictionaries(_names, _values, max_size=5),
)
def test_property_distinct_env_vars_give_distinct_env_ids(
    a: dict[str, str], b: dict[str, str]
) -> None:
    id_a = parse({"working_dir": WD, "env_vars": a}).env_id
    id_b = parse({"working_dir": WD, "env_vars": b}).env_id
    assert (id_a == id_b) == (a == b)
