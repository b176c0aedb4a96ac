"""A hostile client's pip field against a real agent on a real socket, real pip, real venvs.

With allowed file roots set, every place pip would read packages from must lie inside them
(direct references, find-links, indexes, editable installs, VCS over file:), whatever the
spelling (``..``, percent-escapes, symlinks); options that read files of requirements are refused
by name; nothing in the agent's environment redirects the installer; and no error sends back what
a local file holds. The land: ``allowed/`` (the root) and ``outside/`` beside it, each with
wheels and a project, and a secret file outside.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.harness.in_process import RunningAgent, running_agent
from tests.harness.pip_wheels import git_repo, isolate_pip, local_project
from tests.harness.venvs import BUILD_S, logs, nothing_left, probe, status_of, still_serves

SECRET = "root:x:0:0:SECRET-FROM-OUTSIDE"
DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID = grpc.StatusCode.INVALID_ARGUMENT
FAILED = grpc.StatusCode.FAILED_PRECONDITION
OFFLINE = ["--no-index"]


@dataclass(frozen=True)
class Land:
    allowed: Path
    outside: Path

    def wheel(self, where: Path, module: str) -> Path:
        [found] = where.glob(f"{module}-1.0-*.whl")
        return found

    @property
    def secret(self) -> Path:
        return self.outside / "secret.txt"


@pytest.fixture(autouse=True)
def hermetic_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_pip(monkeypatch)


@pytest.fixture
def land(base: Path, wheels: Path) -> Land:
    """allowed/wheels has alpha and beta, outside/wheels alpha and gamma (so gamma comes only
    from outside); each side has a project (delta inside, omega outside, a git repository too);
    allowed/link leads outside; allowed/links.html and allowed/simple link to outside's alpha."""
    allowed, outside = base / "allowed", base / "outside"
    for side, names in (
        (allowed, ("alpha_pkg", "beta_pkg")),
        (outside, ("alpha_pkg", "gamma_pkg")),
    ):
        (side / "wheels").mkdir(parents=True)
        for name in names:
            [whl] = wheels.glob(f"{name}-*.whl")
            shutil.copy(whl, side / "wheels")
    local_project(allowed / "proj", "delta_pkg", "delta inside")
    git_repo(local_project(outside / "proj", "omega_pkg", "omega outside"))
    (outside / "secret.txt").write_text(SECRET + "\n")
    (allowed / "link").symlink_to(outside / "wheels")
    out_alpha = next((outside / "wheels").glob("alpha_pkg-*.whl"))
    anchor = f'<a href="{out_alpha.as_uri()}">{out_alpha.name}</a>\n'
    (allowed / "links.html").write_text(f"<html><body>{anchor}</body></html>\n")
    for index in (allowed / "simple", outside / "simple"):
        (index / "alpha-pkg").mkdir(parents=True)
        (index / "alpha-pkg" / "index.html").write_text(f"<html><body>{anchor}</body></html>\n")
    return Land(allowed, outside)


def pip_field(packages: list[str], options: list[str]) -> str:
    return json.dumps({"pip": {"packages": packages, "pip_install_options": options}})


async def outcome(ra: RunningAgent, text: str) -> tuple[grpc.StatusCode, str]:
    try:
        reply = await ra.create(text, timeout_s=int(BUILD_S))
    except grpc.aio.AioRpcError as exc:
        return status_of(exc)
    assert await ra.delete(reply.runtime_env_id) == 0
    return grpc.StatusCode.OK, ""


# -- every place pip reads from, outside the roots -------------------------------------------

Case = Callable[[Land], tuple[list[str], list[str]]]
A = "alpha_pkg"

OUTSIDE: dict[str, tuple[Case, grpc.StatusCode]] = {
    "direct reference": (
        lambda d: ([f"alpha-pkg @ {d.wheel(d.outside / 'wheels', A).as_uri()}"], OFFLINE), DENIED),
    "direct reference with a marker": (
        lambda d: ([f"alpha-pkg @ {d.wheel(d.outside / 'wheels', A).as_uri()} ; "
                    'python_version >= "3"'], OFFLINE), DENIED),
    "direct reference through ..": (
        lambda d: ([f"alpha-pkg @ file://{d.allowed}/../outside/wheels/"
                    f"{d.wheel(d.outside / 'wheels', A).name}"], OFFLINE), DENIED),
    "direct reference through %2E%2E": (
        lambda d: ([f"alpha-pkg @ file://{d.allowed}/%2E%2E/outside/wheels/"
                    f"{d.wheel(d.outside / 'wheels', A).name}"], OFFLINE), DENIED),
    "direct reference through a symlink": (
        lambda d: ([f"alpha-pkg @ file://{d.allowed}/link/"
                    f"{d.wheel(d.outside / 'wheels', A).name}"], OFFLINE), DENIED),
    "direct reference to a project": (
        lambda d: ([f"omega-pkg @ {(d.outside / 'proj').as_uri()}"], OFFLINE), DENIED),
    "git+file direct reference": (
        lambda d: ([f"omega-pkg @ git+file://localhost{d.outside / 'proj'}"], OFFLINE), DENIED),
    "--find-links DIR": (
        lambda d: (["gamma-pkg"], [*OFFLINE, "--find-links", str(d.outside / "wheels")]), DENIED),
    "--find-links=DIR": (
        lambda d: (["gamma-pkg"], [*OFFLINE, f"--find-links={d.outside / 'wheels'}"]), DENIED),
    "-f DIR": (lambda d: (["gamma-pkg"], [*OFFLINE, "-f", str(d.outside / "wheels")]), DENIED),
    "--find-links file: URL": (
        lambda d: (["gamma-pkg"], [*OFFLINE, "-f", (d.outside / "wheels").as_uri()]), DENIED),
    "--find-links through ..": (
        lambda d: (["gamma-pkg"], [*OFFLINE, "-f", f"{d.allowed}/../outside/wheels"]), DENIED),
    "--find-links through a symlink": (
        lambda d: (["gamma-pkg"], [*OFFLINE, "-f", f"{d.allowed}/link"]), DENIED),
    "--find-links page inside linking outside": (
        lambda d: (["alpha-pkg"], [*OFFLINE, "-f", str(d.allowed / "links.html")]), INVALID),
    "--index-url outside": (
        lambda d: (["alpha-pkg"], ["--index-url", (d.outside / "simple").as_uri()]), DENIED),
    "--extra-index-url outside": (
        lambda d: (["alpha-pkg"], ["--extra-index-url", (d.outside / "simple").as_uri()]),
        DENIED),
    "--index-url inside linking outside": (
        lambda d: (["alpha-pkg"], ["-i", (d.allowed / "simple").as_uri()]), DENIED),
    "-e DIR": (lambda d: (["beta-pkg"], [*OFFLINE, "-e", str(d.outside / "proj")]), DENIED),
    "-e file: URL through %2E%2E": (
        lambda d: (["beta-pkg"], [*OFFLINE, "-e", f"file://{d.allowed}/%2E%2E/outside/proj"]),
        DENIED),
    "-e git+file": (
        lambda d: (["beta-pkg"], [*OFFLINE, "-e",
                                  f"git+file://{d.outside / 'proj'}#egg=omega-pkg"]), DENIED),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OUTSIDE))
async def test_a_place_outside_the_allowed_roots_is_refused_before_pip_runs(
    land: Land, case: str
) -> None:
    """Before: each of these installed from outside the roots (the -e ones were refused as
    INVALID_ARGUMENT, but for %2E%2E, which installed). Now: refused, no installer run."""
    make, expected = OUTSIDE[case]
    packages, options = make(land)
    async with running_agent(allow_file_roots=(str(land.allowed),)) as ra:
        code, details = await outcome(ra, pip_field(packages, options))
        assert code == expected, details
        assert "allow-file-root" in details, details
        assert SECRET not in details
        assert logs(ra) == [], "an installer ran"
        await nothing_left(ra)
        await still_serves(ra)


@pytest.mark.parametrize("roots", [(), ("{allowed}",)], ids=["no roots", "roots"])
async def test_a_file_named_as_a_project_folder_is_refused_unread(
    land: Land, roots: tuple[str, ...]
) -> None:
    """A path in pip.packages is a wheel, an sdist or a project folder (issue 37): a file named
    as a folder is refused on what was opened (never read), and outside the roots before it is
    opened; nothing of it echoed."""
    settings_roots = tuple(root.format(allowed=land.allowed) for root in roots)
    async with running_agent(allow_file_roots=settings_roots) as ra:
        code, details = await outcome(ra, pip_field([str(land.secret)], OFFLINE))
        want = DENIED if roots else grpc.StatusCode.FAILED_PRECONDITION
        assert code == want, details
        assert SECRET not in details
        assert logs(ra) == [], "an installer ran"
        await nothing_left(ra)
        await still_serves(ra)


async def test_the_inside_of_the_allowed_roots_installs_every_way(land: Land) -> None:
    """find-links, a direct reference with a marker (normalised so that PEP 508 parsers such as
    packaging can read it again), a git+file reference and an editable install, all inside
    the root."""
    allowed = land.allowed
    git_repo(allowed / "proj")
    packages = [
        "beta-pkg",
        f"alpha-pkg @ {land.wheel(allowed / 'wheels', A).as_uri()} ; python_version >= '3'",
    ]
    options = [*OFFLINE, "--find-links", str(allowed / "wheels"), "-e", str(allowed / "proj")]
    async with running_agent(allow_file_roots=(str(allowed),)) as ra:
        reply = await ra.create(pip_field(packages, options), timeout_s=int(BUILD_S))
        seen = await probe(reply.context, "alpha_pkg", "beta_pkg", "delta_pkg")
        assert (seen["alpha_pkg"][0], seen["beta_pkg"][0]) == ("alpha 1.0", "beta 1.0")
        assert seen["delta_pkg"] == ["delta inside", f"{allowed}/proj/delta_pkg/__init__.py"]
        assert await ra.delete(reply.runtime_env_id) == 0
        git = [f"delta-pkg @ git+file://localhost{allowed / 'proj'}"]
        reply = await ra.create(pip_field(git, OFFLINE), timeout_s=int(BUILD_S))
        assert (await probe(reply.context, "delta_pkg"))["delta_pkg"][0] == "delta inside"


async def test_an_allowed_root_of_slash_admits_every_path(land: Land) -> None:
    """Before: the root / was compared as '//', and refused everything (an editable install
    here)."""
    options = [*OFFLINE, "-e", str(land.outside / "proj")]
    async with running_agent(allow_file_roots=("/",)) as ra:
        reply = await ra.create(pip_field(["gamma-pkg"], [*options, "-f", str(
            land.outside / "wheels")]), timeout_s=int(BUILD_S))  # fmt: skip
        seen = await probe(reply.context, "omega_pkg", "gamma_pkg")
        assert (seen["omega_pkg"][0], seen["gamma_pkg"][0]) == ("omega outside", "gamma 1.0")


async def test_without_allowed_roots_local_paths_install_as_before(land: Land) -> None:
    packages = [f"alpha-pkg @ {land.wheel(land.outside / 'wheels', A).as_uri()}", "gamma-pkg"]
    options = [*OFFLINE, "-f", str(land.outside / "wheels")]
    async with running_agent() as ra:
        reply = await ra.create(pip_field(packages, options), timeout_s=int(BUILD_S))
        seen = await probe(reply.context, "alpha_pkg", "gamma_pkg")
        assert (seen["alpha_pkg"][0], seen["gamma_pkg"][0]) == ("alpha 1.0", "gamma 1.0")


# -- options and requirements refused whatever the roots -------------------------------------

REFUSED_OPTIONS = [
    ["-c", "{secret}"], ["--constraint", "{secret}"], ["--constraint={secret}"],
    ["-r", "{secret}"], ["--requirement={secret}"], ["-r", "{allowed}/reqs.txt"],
    ["--config-settings", "--build-option=--dist-dir=/x"], ["-C", "k=v"],
    ["--src", "/x"], ["--root", "/x"], ["--prefix", "/x"], ["--target", "/x"], ["--user"],
    ["--cache-dir", "/x"], ["--log", "/x"], ["--report", "/x"], ["--build", "/x"],
]  # fmt: skip
REFUSED_PACKAGES = [
    "./pkg", "../x.tar.gz", "x-1.0-py3-none-any.whl", "-e ./pkg", "--index-url=abs/simple",
    "-r {secret}", "-c {secret}", "--constraint={secret}",
    "{secret} ; os_name == 'posix'", "file:x.whl", "x @ ./p", "x @ /abs/p.whl",
    "x @ file:x.whl", "x @ file://host/x.whl", "x @ ftp://host/x.whl", "x @ git+ext::sh -c id",
    "x @ svn+lp:proj",
]  # fmt: skip
REFUSED_PLACES = [
    ["-f", "wheels"], ["-f", "~/wheels"], ["-f", "ftp://host/w"], ["-i", "outside/simple"],
    ["-e", "."], ["-e", "proj"], ["-e", "file:proj"], ["-f", "file://host/w"],
]  # fmt: skip


@pytest.mark.parametrize("roots", [(), ("{allowed}",)], ids=["no roots", "roots"])
async def test_files_of_requirements_and_unsafe_options_and_paths_are_refused_by_name(
    land: Land, roots: tuple[str, ...]
) -> None:
    """-c and -r read a file pip parses (and may include more, nested); before, -c was allowed
    and its first line came back in the error. Relative paths mean the agent's working
    directory; unknown schemes are not pip's to read. All refused, nothing echoed but the
    client's own words."""
    (land.allowed / "reqs.txt").write_text(f"-r {land.secret}\n-c {land.secret}\n")
    fill = {"secret": str(land.secret), "allowed": str(land.allowed)}
    settings_roots = tuple(root.format(**fill) for root in roots)
    envs: list[tuple[list[str], list[str]]] = [
        (["alpha-pkg"], [*OFFLINE, *(part.format(**fill) for part in option)])
        for option in [*REFUSED_OPTIONS, *REFUSED_PLACES]
    ]
    envs += [([package.format(**fill)], OFFLINE) for package in REFUSED_PACKAGES]
    async with running_agent(allow_file_roots=settings_roots) as ra:
        for packages, options in envs:
            code, details = await outcome(ra, pip_field(packages, options))
            assert code == INVALID, (packages, options, code, details)
            assert SECRET not in details
            assert details.startswith(("pip.packages", "pip.pip_install_options")), details
        assert logs(ra) == [], "an installer ran"
        await nothing_left(ra)
        await still_serves(ra)


# -- the agent's environment -----------------------------------------------------------------


def _config_file(land: Land) -> Path:
    path = land.outside / "pip.conf"
    path.write_text(f"[global]\nfind-links = {land.outside / 'wheels'}\n")
    return path


def _uv_config_file(land: Land) -> Path:
    path = land.outside / "uv.toml"
    path.write_text(f'find-links = ["{land.outside / "wheels"}"]\n')
    return path


REDIRECTS: dict[str, Callable[[Land, Path], dict[str, str]]] = {
    "PIP_FIND_LINKS": lambda d, _: {"PIP_FIND_LINKS": str(d.outside / "wheels")},
    "UV_FIND_LINKS": lambda d, _: {"UV_FIND_LINKS": str(d.outside / "wheels")},
    "UV_CONSTRAINT": lambda d, _: {"UV_CONSTRAINT": str(d.secret)},
    "UV_CONFIG_FILE": lambda d, _: {"UV_CONFIG_FILE": str(_uv_config_file(d))},
    "PIP_CONSTRAINT": lambda d, _: {"PIP_CONSTRAINT": str(d.secret)},
    "PIP_TARGET": lambda d, base: {"PIP_TARGET": str(base / "target")},
    "PIP_CONFIG_FILE": lambda d, _: {"PIP_CONFIG_FILE": str(_config_file(d))},
    "user config in HOME": lambda d, base: {
        "HOME": str(base / "home"),
        "PIP_CONFIG_FILE": "",
        "XDG_CONFIG_HOME": "",
    },
}


# What each installer says of a requirement nothing offers, and of a build that failed.
NOT_FOUND_WORDS = {
    "pip": "No matching distribution found for gamma-pkg",
    "uv": "gamma-pkg was not found in the provided package locations",
}
BUILD_FAILED_WORDS = {"pip": "metadata-generation-failed", "uv": "build_wheel` failed"}


@pytest.mark.parametrize("installer", ["pip", "uv"])
@pytest.mark.parametrize("case", list(REDIRECTS))
async def test_installer_configuration_in_the_agents_environment_redirects_nothing(
    land: Land, base: Path, monkeypatch: pytest.MonkeyPatch, case: str, installer: str
) -> None:
    """Before: the installer read the agent's PIP_* variables and pip config files: gamma came
    from outside the roots, the constraint file's line came back in the error, the packages went
    to PIP_TARGET. Now it sees only the env's options, whichever installer builds the venv
    (uv's UV_* variables and its user uv.toml likewise)."""
    for conf, text in [
        (base / "home" / ".config" / "pip" / "pip.conf", "[global]\nfind-links = {}\n"),
        (base / "home" / ".config" / "uv" / "uv.toml", 'find-links = ["{}"]\n'),
    ]:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(text.format(land.outside / "wheels"))
    for key, value in REDIRECTS[case](land, base).items():
        if value:
            monkeypatch.setenv(key, value)
        else:
            monkeypatch.delenv(key, raising=False)
    options = [*OFFLINE, "-f", str(land.allowed / "wheels")]
    roots = (str(land.allowed),)
    async with running_agent(allow_file_roots=roots, pip_installer=installer) as ra:
        reply = await ra.create(pip_field(["beta-pkg"], options), timeout_s=int(BUILD_S))
        assert (await probe(reply.context, "beta_pkg"))["beta_pkg"][0] == "beta 1.0"
        assert not (base / "target").exists()
        code, details = await outcome(ra, pip_field(["gamma-pkg"], options))
        assert code == FAILED, details
        assert NOT_FOUND_WORDS[installer] in details, details
        assert SECRET not in details


# -- what an installer's failure sends back --------------------------------------------------


@pytest.mark.parametrize("installer", ["pip", "uv"])
async def test_a_failed_build_sends_back_the_installers_lines_not_what_the_build_printed(
    land: Land, installer: str
) -> None:
    """Before: the last 20 lines of the log came back, the build's output among them, and it
    quoted the file the build read. Now only the installer's own lines come back; the whole
    output stays in the log on the agent's node."""
    local_project(land.allowed / "bad", "bad_pkg", "x", fail_with=land.secret)
    text = pip_field([f"bad-pkg @ {(land.allowed / 'bad').as_uri()}"], OFFLINE)
    roots = (str(land.allowed),)
    async with running_agent(allow_file_roots=roots, pip_installer=installer) as ra:
        code, details = await outcome(ra, text)
        assert code == FAILED, details
        assert SECRET not in details
        assert BUILD_FAILED_WORDS[installer] in details, details
        [log] = logs(ra)
        assert str(log) in details
        assert SECRET in log.read_text(), "the log keeps the whole output for the operator"
        await nothing_left(ra)
