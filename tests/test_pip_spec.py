"""The ``pip`` field, pure: Ray's two forms, PEP 503 normalisation into one content-addressed
``pip://<hash>``, install options kept in order as part of the identity, dangerous options and bad
shapes refused by name, every place pip would read from checked against the allowed roots."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from agent.core.errors import AgentError, InvalidRuntimeEnv, PermissionDenied
from agent.core.pip_options import ALLOWED, PIP_INSTALL, PIP_ONLY, REFUSED, REQUIREMENTS_FILE
from agent.core.pip_spec import PipSpec, normalize_requirement, parse_pip
from agent.core.roots import FileRoots
from agent.core.runtime_env import EnvLimits, parse_runtime_env
from agent.core.uris import UriKey, UriKind

ROOTS = ("/srv/allowed",)
OFFLINE = ["--no-index", "--find-links", "/srv/wheels"]


def spec(value: object, roots: tuple[str, ...] = ()) -> PipSpec:
    parsed = parse_pip(value, file_roots=roots)
    assert parsed is not None
    return parsed


def with_options(*options: str, packages: tuple[str, ...] = ("demo",)) -> dict[str, Any]:
    return {"packages": list(packages), "pip_install_options": list(options)}


def env_of(**fields: Any) -> str:
    return json.dumps(fields)


# -- forms and identity ----------------------------------------------------------------------


def test_the_list_form_and_the_object_form_name_the_same_venv() -> None:
    listed = spec(["requests>=2.31", "numpy"])
    dicted = spec({"packages": ["numpy", "requests>=2.31"]})
    assert listed == dicted
    assert listed.packages == ("numpy", "requests>=2.31")
    assert listed.options == ()
    assert re.fullmatch(r"pip://[0-9a-f]{32}", listed.uri), listed.uri
    assert listed.uri == f"pip://{listed.digest}"


@pytest.mark.parametrize("spelling", ["Foo_Bar", "foo-bar", "FOO.bar", "foo__bar", "Foo-_.Bar"])
def test_pep503_spellings_of_a_name_are_one_requirement(spelling: str) -> None:
    assert spec([spelling]).packages == ("foo-bar",)
    assert spec([spelling]).uri == spec(["foo-bar"]).uri


def test_whitespace_around_a_requirement_and_its_parts_is_dropped() -> None:
    assert spec([" Foo_Bar [extra] >= 1.0 , < 2 "]).packages == ("foo-bar[extra]<2,>=1.0",)
    assert spec(["\tfoo >= 1.0\t"]).uri == spec(["foo>=1.0"]).uri


def test_duplicates_collapse_and_order_does_not_matter() -> None:
    variants = [["a", "b", "c"], ["c", "B", "a", "b"], ["A", "b", "c", "a", " c "]]
    specs = [spec({"packages": v, "pip_install_options": OFFLINE}) for v in variants]
    assert {s.packages for s in specs} == {("a", "b", "c")}
    assert len({s.uri for s in specs}) == 1


def test_the_same_set_in_another_order_and_spelling_is_the_same_env() -> None:
    first = env_of(pip={"packages": ["Foo_Bar", "baz>=1"], "pip_install_options": OFFLINE})
    second = env_of(pip={"pip_install_options": OFFLINE, "packages": ["baz >= 1", "FOO.bar"]})
    a, b = (parse_runtime_env(e, EnvLimits()) for e in (first, second))
    assert a.env_id == b.env_id
    assert a.canonical == b.canonical
    assert a.pip is not None
    assert a.uri_keys == b.uri_keys == (UriKey(UriKind.PIP, a.pip.uri),)


def test_the_list_form_without_options_equals_the_object_form_without_options() -> None:
    a = parse_runtime_env(env_of(pip=["x", "y"]), EnvLimits())
    b = parse_runtime_env(env_of(pip={"packages": ["y", "x"]}), EnvLimits())
    assert a.env_id == b.env_id


def test_install_options_keep_their_order_and_are_part_of_the_identity() -> None:
    given = spec(with_options("--no-index", "--find-links", "/w"))
    assert given.options == ("--no-index", "--find-links", "/w")
    reordered = spec(with_options("--find-links", "/w", "--no-index"))
    bare = spec(["demo"])
    assert len({given.uri, reordered.uri, bare.uri}) == 3
    ids = {
        parse_runtime_env(env_of(pip=p), EnvLimits()).env_id
        for p in (with_options("--no-index", "--find-links", "/w"), ["demo"])
    }
    assert len(ids) == 2


def test_different_sets_name_different_venvs() -> None:
    sets = [["a"], ["a", "b"], ["a==1"], ["b"], ["a[x]"], ["a>=1"]]
    assert len({spec(s).uri for s in sets}) == len(sets)


def test_the_uri_also_hashes_the_interpreter_and_the_platform() -> None:
    here = spec(["a"])
    assert here.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert here.platform.startswith(sys.platform)
    assert replace(here, python="3.99").uri != here.uri
    assert replace(here, platform="plan9-mips").uri != here.uri


def test_an_empty_set_adds_no_pip_key_and_no_uri() -> None:
    empties: list[object] = [[], {"packages": []}, {}, {"pip_install_options": OFFLINE}, None]
    for empty in empties:
        assert parse_pip(empty) is None, empty
    bare = parse_runtime_env("{}", EnvLimits())
    for text in (env_of(pip=[]), env_of(pip={"packages": []}), env_of(pip=None)):
        env = parse_runtime_env(text, EnvLimits())
        assert env.pip is None
        assert env.uri_keys == ()
        assert env.env_id == bare.env_id, text


# -- dangerous options -----------------------------------------------------------------------

DANGEROUS = [
    (["--target", "/x"], "--target"),
    (["--target=/x"], "--target=/x"),
    (["-t", "/x"], "-t"),
    (["-t/x"], "-t/x"),
    (["--prefix", "/x"], "--prefix"),
    (["--prefix=/x"], "--prefix=/x"),
    (["--user"], "--user"),
    (["--root", "/x"], "--root"),
    (["--root=/x"], "--root=/x"),
    (["--no-index", "--user"], "--user"),
    (["-e", "/elsewhere/proj"], "/elsewhere/proj"),
    (["--editable", "/elsewhere/proj"], "/elsewhere/proj"),
    (["--editable=/elsewhere/proj"], "/elsewhere/proj"),
    (["-e", "/srv/allowed/../elsewhere"], "/srv/allowed/../elsewhere"),
    (["-e", "/srv/allowed-not/proj"], "/srv/allowed-not/proj"),
]


@pytest.mark.parametrize(("options", "named"), DANGEROUS)
def test_a_dangerous_option_is_refused_by_name(options: list[str], named: str) -> None:
    """INVALID_ARGUMENT for an option refused, PERMISSION_DENIED for a path outside the roots."""
    with pytest.raises((InvalidRuntimeEnv, PermissionDenied)) as refused:
        parse_pip(with_options(*options), file_roots=ROOTS)
    assert repr(named) in refused.value.message, refused.value.message
    assert "pip_install_options" in refused.value.message


def test_a_dangerous_option_refuses_the_whole_runtime_env() -> None:
    text = env_of(env_vars={"A": "1"}, pip=with_options("--no-index", "--target", "/x"))
    with pytest.raises(InvalidRuntimeEnv, match="'--target'"):
        parse_runtime_env(text, EnvLimits(), file_roots=ROOTS)


def test_an_editable_install_inside_an_allowed_root_is_accepted() -> None:
    for options in (["-e", "/srv/allowed/proj"], ["--editable=/srv/allowed/proj/sub"]):
        assert spec(with_options(*options), ROOTS).options == tuple(options)


def test_an_editable_install_is_refused_when_no_root_is_allowed() -> None:
    with pytest.raises(PermissionDenied, match="allow-file-root"):
        parse_pip(with_options("-e", "/srv/allowed/proj"), file_roots=())


def test_an_editable_symlink_leading_out_of_an_allowed_root_is_refused(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "proj").mkdir()
    (allowed / "link").symlink_to(outside)
    roots = (str(allowed),)
    assert spec(with_options("-e", str(allowed / "proj")), roots).options
    with pytest.raises(PermissionDenied, match="outside the folders pip may read from"):
        parse_pip(with_options("-e", str(allowed / "link")), file_roots=roots)


# pip parses its options with optparse: a long option may be shortened to any unambiguous prefix,
# short options cluster, and a short option's value may be attached. pip 23.2 installs to /x with
# each of these (checked against pip's own parser), so each must be refused like its full form.
SPELLED_OTHERWISE = [
    ["--targ=/x"],
    ["--prefi=/x"],
    ["-Ut", "/x"],
    ["-e/elsewhere/proj"],
    ["--edit=/elsewhere/proj"],
]


@pytest.mark.parametrize("options", SPELLED_OTHERWISE, ids=lambda o: " ".join(o))
def test_a_dangerous_option_spelled_as_pip_also_accepts_it_is_refused(options: list[str]) -> None:
    with pytest.raises((InvalidRuntimeEnv, PermissionDenied)):
        parse_pip(with_options(*options), file_roots=ROOTS)


# -- places pip reads from -------------------------------------------------------------------

WHEEL = "/srv/allowed/w/a-1.0-py3-none-any.whl"
INSIDE = [
    with_options("--find-links", "https://host/links"),
    with_options("-i", "https://host/simple", "--extra-index-url", "http://127.0.0.1/s"),
    with_options("-e", "git+https://host/repo#egg=demo"),
    with_options("-e", "file:///srv/allowed/proj"),
    with_options("-e", "git+file:///srv/allowed/repo@v1#egg=demo"),
    {"packages": [f"a @ file://{WHEEL}", f"b @ file://localhost{WHEEL}"]},
    {"packages": ["a @ git+file:///srv/allowed/repo@main", "b @ git+ssh://git@host/r.git"]},
    {"packages": ["a @ https://host/a.whl", "b @ hg+https://host/b", "c @ svn+svn://host/c"]},
    {"packages": [WHEEL, f"file://{WHEEL}", "/srv/allowed/proj", "-e /srv/allowed/proj"]},
    {"packages": ["git+file:///srv/allowed/repo", "git+https://host/r.git@v1"]},
]


@pytest.mark.parametrize("value", INSIDE, ids=lambda v: repr(v)[:60])
def test_remote_places_and_local_ones_inside_the_roots_are_accepted(value: object) -> None:
    assert spec(value, ROOTS).canonical()["packages"]


OUTSIDE_ROOTS = [
    {"packages": ["a @ file:///srv/elsewhere/a.whl"]},
    {"packages": ["a @ file:///srv/allowed/%2E%2E/elsewhere/a.whl"]},
    {"packages": ["a @ file:///srv/allowed/../elsewhere/a.whl ; os_name == 'posix'"]},
    {"packages": ["a @ git+file:///srv/elsewhere/repo"]},
    {"packages": ["a @ git+file:///srv/elsewhere/repo@/srv/allowed"]},
    # pip cuts the revision at the last literal @ and then decodes: it clones /srv here
    {"packages": ["a @ git+file:///srv/allowed/..@x%40y"]},
    with_options("--find-links", "/srv/elsewhere"),
    with_options("--find-links=file:///srv/elsewhere"),
    with_options("-f", "/srv/allowed-not"),
    with_options("-i", "file:///srv/elsewhere/simple"),
    with_options("--extra-index-url", "/srv/allowed/simple"),  # a local index: its pages
    with_options("-e", "file:///srv/allowed/%2E%2E/elsewhere"),
    with_options("-e", "git+file:///srv/elsewhere/repo#egg=demo"),
    {"packages": ["/srv/elsewhere/a-1.0-py3-none-any.whl"]},
    {"packages": ["file:///srv/allowed/../elsewhere/proj"]},
    {"packages": ["-e /srv/elsewhere/proj"]},
    {"packages": ["git+file:///srv/elsewhere/repo"]},
]


@pytest.mark.parametrize("value", OUTSIDE_ROOTS, ids=lambda v: repr(v)[:60])
def test_a_local_place_outside_the_roots_is_permission_denied(value: object) -> None:
    with pytest.raises(PermissionDenied, match="allow-file-root"):
        parse_pip(value, file_roots=ROOTS)


def test_a_local_find_links_page_is_refused_with_roots_set_as_its_links_lead_anywhere(
    tmp_path: Path,
) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "links.html").write_text("<a href='file:///elsewhere/a.whl'>a</a>")
    roots = (str(tmp_path),)
    assert spec(with_options("-f", str(tmp_path / "wheels")), roots).options
    with pytest.raises(InvalidRuntimeEnv, match="not a folder"):
        parse_pip(with_options("-f", str(tmp_path / "links.html")), file_roots=roots)
    assert spec(with_options("-f", str(tmp_path / "links.html"))).options, "no roots: as before"


def test_each_place_of_a_value_uv_would_split_is_checked_as_a_pip_set_may_be_built_by_uv() -> None:
    """Before: '--find-links https://x,/etc' was checked whole (a remote URL), and a pip set
    built by uv (pip-installer uv) read '/etc' too: uv splits it at the comma."""
    roots = ("/srv/allowed",)
    for option, value in (("--find-links", "https://x.test/a,/etc"),
                          ("--extra-index-url", "https://x.test/s /etc")):  # fmt: skip
        with pytest.raises(PermissionDenied) as failed:
            parse_pip(with_options(option, value), file_roots=roots)
        assert f"{option} '/etc' is outside the folders" in failed.value.message
        with pytest.raises(PermissionDenied):
            parse_pip([f"{option} {value!r}", "a"], file_roots=roots)


NEVER = [
    with_options("--find-links", "wheels"),
    with_options("--find-links", "~/wheels"),
    with_options("--find-links", "ftp://host/w"),
    with_options("--find-links", "file://host/w"),
    with_options("--find-links", "file:w"),
    with_options("--index-url", "git+https://host/r"),
    with_options("-e", "."),
    with_options("-e", "git+ext::sh -c id"),
    with_options("-e", "svn+lp:proj"),
    {"packages": ["a @ ./p"]},
    {"packages": ["a @ /abs/p.whl"]},
    {"packages": ["a @ file:p.whl"]},
    {"packages": ["a @ ftp://host/a.whl"]},
    {"packages": ["a @ git+ext::sh"]},
    {"packages": ["./pkg"]},
    {"packages": ["pkg-1.0-py3-none-any.whl"]},
    {"packages": ["file:pkg.whl"]},
    {"packages": ["ftp://host/pkg.whl"]},
    {"packages": ["a @ file:///srv/allowed/a%00.whl"]},
    {"packages": ["a @ http://[::1/a.whl"]},
    with_options("-f", "http://[::1"),
]


@pytest.mark.parametrize("roots", [(), ROOTS], ids=["no roots", "roots"])
@pytest.mark.parametrize("value", NEVER, ids=lambda v: repr(v)[:60])
def test_relative_paths_and_unknown_schemes_are_refused_whatever_the_roots(
    value: object, roots: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidRuntimeEnv):
        parse_pip(value, file_roots=roots)


@pytest.mark.parametrize(
    "option",
    ["-r", "--requirement", "-c", "--constraint", "-C", "--config-settings", "--src",
     "--cache-dir", "--log", "--report", "--build"],
)  # fmt: skip
def test_options_that_read_files_or_reach_builds_are_refused_by_name(option: str) -> None:
    for spelled in (with_options(option, "/srv/allowed/x"), with_options(f"{option}=/x")):
        with pytest.raises(InvalidRuntimeEnv, match=r"refused|not an option") as refused:
            parse_pip(spelled, file_roots=ROOTS)
        assert option in refused.value.message


def test_without_roots_local_places_are_accepted_as_before() -> None:
    value = {
        "packages": ["a @ file:///anywhere/a.whl", "b @ git+file:///anywhere/repo"],
        "pip_install_options": ["-f", "/anywhere", "-i", "file:///anywhere/simple"],
    }
    assert spec(value).options == ("-f", "/anywhere", "-i", "file:///anywhere/simple")


def test_a_root_of_slash_admits_every_absolute_path() -> None:
    """Before: / was compared as '//' and admitted nothing."""
    value = with_options("-e", "/srv/elsewhere/proj", "-f", "/opt/wheels")
    assert spec(value, ("/",)).options == tuple(value["pip_install_options"])
    assert spec(value, ("/srv/../",)).options


def test_a_url_requirement_with_a_marker_normalises_to_what_packaging_reads_again() -> None:
    """Before: 'a @ URL; marker', where PEP 508 wants a space before the semicolon."""
    for text in (
        "a @ https://host/a.whl ; python_version >= '3'",
        "a @ file:///w/a.whl ;os_name=='nt'",
    ):
        normal = normalize_requirement(text, "f")
        assert normalize_requirement(normal, "f") == normal
        assert Requirement(normal).marker is not None


def test_an_echoed_input_is_cut_short() -> None:
    long = "a @ " + "x" * 3000
    with pytest.raises(AgentError) as refused:
        parse_pip([long])
    assert len(refused.value.message) < 600, refused.value.message
    with pytest.raises(AgentError) as refused:
        parse_pip(with_options("-f", "rel" * 1000))
    assert len(refused.value.message) < 600, refused.value.message


# -- bad shapes ------------------------------------------------------------------------------

BAD = [
    "requests",
    42,
    True,
    {"packages": "requests"},
    {"packages": ["ok", 3]},
    {"packages": [None]},
    {"packages": ["ok"], "pip_install_options": "--no-index"},
    {"packages": ["ok"], "pip_install_options": [1]},
    {"packages": ["ok"], "pip_checkout": False},
    [""],
    ["   "],
    ["!!!"],
    ["-e ."],
    ["ok", "==1.0"],
    ["a\nb"],
    ["a\x00"],
    ["x" * 5000],
]


@pytest.mark.parametrize("value", BAD, ids=lambda v: repr(v)[:40])
def test_a_pip_field_of_the_wrong_shape_is_refused(value: object) -> None:
    with pytest.raises(InvalidRuntimeEnv):
        parse_pip(value)
    with pytest.raises(InvalidRuntimeEnv):
        parse_runtime_env(env_of(pip=value), EnvLimits())


def test_an_unknown_pip_key_is_refused_by_name() -> None:
    with pytest.raises(InvalidRuntimeEnv, match="pip_checkout"):
        parse_pip({"packages": ["ok"], "pip_checkout": False})


# PEP 508 whitespace is not always insignificant: it separates tokens, and inside a quoted marker
# value it is part of the value. Dropping all of it turns 'foo bar' (which pip refuses) into the
# different package 'foobar', and makes two different markers the same venv.
def test_whitespace_between_two_names_is_not_one_name() -> None:
    with pytest.raises(InvalidRuntimeEnv):
        parse_pip(["foo bar"])


def test_whitespace_inside_a_quoted_marker_value_is_part_of_the_identity() -> None:
    spaced = spec(['foo; os_name in "posix nt"'])
    joined = spec(['foo; os_name in "posixnt"'])
    assert spaced.uri != joined.uri, (spaced.packages, joined.packages)


# -- the allowed roots: one check for pip and for file:// packages -------------------------------


def test_roots_resolved_once_and_roots_by_name_give_the_same_verdicts_and_messages(
    tmp_path: Path,
) -> None:
    """``FileRoots`` (agent.core.roots), resolved once at start, is the check pip uses; the
    refusal lists the roots as the kernel names them, as before."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    names = (str(tmp_path / "via"),)
    resolved = FileRoots.of(names)
    inside = with_options("-e", str(real / "proj"))
    outside = with_options("-e", str(tmp_path / "elsewhere"))
    assert spec(inside, names) == parse_pip(inside, file_roots=resolved)
    messages = []
    for roots in (names, resolved):
        with pytest.raises(PermissionDenied) as refused:
            parse_pip(outside, file_roots=roots)
        messages.append(refused.value.message)
    assert messages[0] == messages[1]
    assert f"({real}; the allow-file-root setting)" in messages[0]


def test_pip_and_file_packages_agree_on_what_lies_inside_the_roots(tmp_path: Path) -> None:
    """One check: a path pip may read from is a path a file:// package may be opened at."""
    roots = FileRoots.of([str(tmp_path / "allowed"), ""])  # an empty root names none
    for path, inside in (
        (tmp_path / "allowed" / "a", True),
        (tmp_path / "allowed", True),
        (tmp_path / "allowed-not" / "a", False),
        (tmp_path / "a", False),
    ):
        assert roots.allow_name(str(path)) is inside
        verdict = _pip_allows(with_options("-e", str(path)), roots)
        assert verdict is inside, path


def _pip_allows(value: object, roots: FileRoots) -> bool:
    try:
        parse_pip(value, file_roots=roots)
    except PermissionDenied:
        return False
    return True


def test_no_color_is_taken_and_kept_for_pip_and_uv_alike() -> None:
    """A display option pip and uv both take: a pip env naming it may still be built by uv."""
    got = spec({"packages": ["a"], "pip_install_options": ["--no-color"]})
    assert got.options == ("--no-color",)
    assert "--no-color" not in PIP_ONLY


# -- Ray's pip as Ray's agent takes it: option lines, every pip option, pip_version, pip_check ----

_VALUES = {
    "--index-url": "https://host/simple", "--pypi-url": "https://host/simple",
    "-i": "https://host/simple", "--extra-index-url": "https://host/extra",
    "--find-links": "https://host/links", "-f": "https://host/links",
    "--editable": "git+https://host/r#egg=demo", "-e": "git+https://host/r#egg=demo",
}  # fmt: skip


def _with_value(flag: str, table: dict[str, bool]) -> list[str]:
    return [flag, _VALUES.get(flag, "v")] if table[flag] else [flag]


@pytest.mark.parametrize("flag", sorted(REQUIREMENTS_FILE))
def test_an_option_line_pip_reads_from_a_requirements_file_is_taken_and_keyed(flag: str) -> None:
    """Before: 'is an option line, not a requirement'. Ray's agent writes the list into a
    requirements file: each option pip reads there is taken as a line, its words kept in order,
    apart from the requirements, and part of the venv's key."""
    words = _with_value(flag, REQUIREMENTS_FILE)
    got = spec([" ".join(words), "demo"])
    assert got.packages == ("demo",)
    assert got.lines == (tuple(words),)
    assert got.line_options == tuple(words)
    assert got.uri != spec(["demo"]).uri
    assert got.canonical()["packages"] == [" ".join(words), "demo"]


def test_option_lines_keep_their_order_and_spelling_in_the_key() -> None:
    a, b = "--index-url https://a/simple", "--extra-index-url=https://b/simple"
    first = spec([a, "demo", b])
    assert first.lines == (
        ("--index-url", "https://a/simple"),
        ("--extra-index-url=https://b/simple",),
    )
    assert spec(["demo", a, b]).uri == first.uri, "a line's place among requirements: none"
    assert spec([b, a, "demo"]).uri != first.uri, "their order: pip's last --index-url wins"
    assert spec(["--pre", "Demo"]).uri == spec(["--pre", "demo"]).uri


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("-r /srv/allowed/r.txt", "reads a requirements file"),
        ("--requirement=/srv/allowed/r.txt", "reads a requirements file"),
        ("-c /srv/allowed/c.txt", "reads a constraints file"),
        ("--constraint /srv/allowed/c.txt", "reads a constraints file"),
        ("--no-deps", "pass any other in pip.pip_install_options"),
        ("--target /x", "writes outside the env's venv"),
        ("--extra-index=https://host/s", "abbreviations"),
        ("-ihttps://host/s", "run together"),
        ("--index-url", "needs a value"),
        ("--index-url 'https://host/s", "cannot be split"),
    ],
)
def test_an_option_line_that_reads_a_file_or_is_no_requirements_file_line_is_refused(
    line: str, words: str
) -> None:
    with pytest.raises(InvalidRuntimeEnv) as refused:
        parse_pip([line, "demo"], file_roots=ROOTS)
    assert words in refused.value.message, refused.value.message
    assert "pip.packages[0]" in refused.value.message


@pytest.mark.parametrize(
    "line",
    [
        "--index-url file:///srv/elsewhere/simple",
        "--extra-index-url /srv/allowed/simple",  # a local index: its pages link anywhere
        "--find-links /srv/elsewhere",
        "-f file:///srv/allowed/../elsewhere",
    ],
)
def test_a_place_an_option_line_names_is_checked_as_an_options_is(line: str) -> None:
    with pytest.raises(PermissionDenied, match="allow-file-root"):
        parse_pip([line, "demo"], file_roots=ROOTS)


@pytest.mark.parametrize("flag", sorted(ALLOWED))
def test_every_pip_install_option_but_the_refused_is_taken(flag: str) -> None:
    """Before: an allow-list of 37 spellings. Now pip's own table but the refused."""
    options = _with_value(flag, ALLOWED)
    assert spec(with_options(*options)).options == tuple(options)


def test_rays_default_install_options_are_taken() -> None:
    """Ray's agent's defaults, and its test_pip_install_options's: before, refused."""
    ray = ["--no-cache-dir", "--no-build-isolation", "--disable-pip-version-check"]
    assert spec(with_options(*ray)).options == tuple(ray)


@pytest.mark.parametrize("flag", sorted(REFUSED.keys() & PIP_INSTALL.keys()))
def test_a_refused_pip_option_names_why(flag: str) -> None:
    with pytest.raises(InvalidRuntimeEnv) as refused:
        parse_pip(with_options(*_with_value(flag, PIP_INSTALL)))
    assert f"{flag!r} is refused: {REFUSED[flag]}" in refused.value.message


@pytest.mark.parametrize(
    "option", ["--disable-pip", "--no-cache", "--no-warn", "--dry", "--use-feat=x", "-qq"]
)
def test_an_abbreviation_pip_would_take_is_refused(option: str) -> None:
    with pytest.raises(InvalidRuntimeEnv, match="abbreviations"):
        parse_pip(with_options(option))


def test_a_pip_version_is_normalised_and_keyed_and_makes_pip_build_the_set() -> None:
    """Before: refused. Ray's specifier, normalised as packaging prints it; unset, empty and
    null name the set without one; it is found where the set's options and lines say."""
    value = {"packages": ["--index-url https://host/simple", "demo"],
             "pip_install_options": ["--no-deps", "--trusted-host", "host"]}  # fmt: skip
    pinned = spec({**value, "pip_version": "<19, >19"})
    assert pinned.pip_version == "<19,>19"
    assert pinned.canonical()["pip_version"] == "<19,>19"
    assert pinned.uri != spec(value).uri
    assert spec({**value, "pip_version": ">19,<19"}).uri == pinned.uri
    assert spec({**value, "pip_version": ""}).uri == spec({**value, "pip_version": None}).uri
    assert spec({**value, "pip_version": ""}).uri == spec(value).uri
    assert "pip_version" in pinned.pip_only
    assert pinned.index_options() == (
        "--trusted-host",
        "host",
        "--index-url",
        "https://host/simple",
    )
    for bad in ("latest", 23, "x" * 101):
        with pytest.raises(InvalidRuntimeEnv, match="pip_version"):
            parse_pip({**value, "pip_version": bad})


def test_pip_check_is_taken_and_keyed() -> None:
    checked = spec({"packages": ["demo"], "pip_check": True})
    assert checked.pip_check
    assert checked.canonical()["pip_check"] is True
    assert checked.uri != spec({"packages": ["demo"], "pip_check": False}).uri
    assert spec({"packages": ["demo"], "pip_check": False}).uri == spec(["demo"]).uri
