"""pip envs through a real in-process agent: real venvs built by real pip from an offline
wheelhouse, one per distinct set, the installer's failures and timeouts, and eviction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import grpc
import pytest

from agent.core.errors import InstallerFailed, echo
from agent.core.pip_spec import parse_pip
from agent.core.uris import UriKey, UriKind
from agent.install.venvs.build import build_venv
from tests.harness.in_process import running_agent
from tests.harness.packages import env_json, workdir_zip
from tests.harness.pip_wheels import (
    SCRIPT,
    alive,
    isolate_pip,
    pip_env,
    processes_mentioning,
    read_pids,
    reaped,
    run,
    slow_env,
    slow_sdist,
    survivors,
)
from tests.harness.polling import wait_until
from tests.harness.venvs import (
    BUILD_S,
    logs,
    nothing_left,
    pip_dirs,
    probe,
    status_of,
    still_serves,
)


@pytest.fixture(autouse=True)
def hermetic_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's installers see no pip configuration of this machine, only their options."""
    isolate_pip(monkeypatch)


# -- building and using a venv ---------------------------------------------------------------


async def test_installer_spawns_survive_grpc_traffic_in_the_agent() -> None:
    """The installer's spawn (build_venv, the python a stand-in that exits 0) never dies before
    it runs while the agent's process serves RPCs: 200 spawns under 4 streams of calls."""
    spec = parse_pip(["anything"])
    assert spec is not None
    async with running_agent() as ra:
        done = asyncio.Event()

        async def traffic() -> None:
            while not done.is_set():
                await ra.info()

        streams = [asyncio.create_task(traffic()) for _ in range(4)]
        crash = ""
        try:
            own = ra.service.store.db.staging  # a pass reaps strays
            for i in range(100):  # two spawns each: the venv, then the installer
                staging = own / f"probe-{i}"
                staging.mkdir()
                try:
                    await build_venv(
                        spec, staging, python="/bin/true", installer="pip",
                        log_path=ra.root / "probe.log", label="probe",
                    )  # fmt: skip
                except InstallerFailed as exc:
                    crash = f"build {i + 1} of 100: {exc.message.split(';')[0]}"
                    break
        finally:
            done.set()
            await asyncio.gather(*streams)
        assert not crash, f"a spawn died before it ran /bin/true ({crash})"


async def test_the_context_runs_the_venv_python_which_imports_the_wheel_after_the_working_dir(
    wheels: Path, tmp_path: Path
) -> None:
    zip_path = tmp_path / "wd.zip"
    zip_path.write_bytes(workdir_zip({"wdmod.py": "VALUE = 'from the working dir'\n"}))
    text = pip_env(["Alpha_Pkg"], wheels, working_dir=zip_path.as_uri())
    spec = parse_pip(json.loads(text)["pip"])
    assert spec is not None
    async with running_agent() as ra:
        reply = await ra.create(text, timeout_s=int(BUILD_S))
        venv = ra.service.store.path_for(UriKey(UriKind.PIP, spec.uri))
        assert venv.parent == ra.root.resolve() / "uris"
        assert venv.name.startswith("pip-")
        assert f"pip:{spec.uri}" in reply.uris
        context = reply.context
        assert context.py_executable == str(venv / "bin" / "python")
        pythonpath = context.env_vars["PYTHONPATH"].split(os.pathsep)
        assert pythonpath == [context.cwd], "the working dir is on the path; the venv is not"

        seen = await probe(context, "alpha_pkg", "wdmod")
        assert seen["executable"] == context.py_executable
        assert seen["prefix"] == str(venv)
        assert seen["alpha_pkg"][0] == "alpha 1.0"
        assert seen["alpha_pkg"][1].startswith(f"{venv}/lib/")
        assert seen["wdmod"] == ["from the working dir", f"{context.cwd}/wdmod.py"]
        assert not seen["grpc"], "the venv sees the agent's own packages"
        site = next(i for i, p in enumerate(seen["path"]) if p.endswith("site-packages"))
        assert seen["path"].index(context.cwd) < site, seen["path"]

        staging = str(ra.root / "tmp").encode()
        for script in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
            if script.is_file() and not script.is_symlink():
                assert staging not in script.read_bytes(), f"{script} names the staging path"
        # the console script pip wrote runs: its shebang names the venv where it is now
        assert await run(str(venv / "bin" / SCRIPT)) == (0, "alpha 1.0\n", "")
        info = await ra.info()
        [entry] = [u for u in info.uris if u.kind == "pip"]
        assert (entry.uri, entry.references, entry.local_path) == (spec.uri, 1, str(venv))
        assert await ra.delete(reply.runtime_env_id) == 0


async def test_twenty_concurrent_creates_of_one_set_build_one_venv_and_another_set_a_second(
    wheels: Path,
) -> None:
    spellings = [
        ["alpha-pkg", "beta-pkg"],
        ["Beta_Pkg", "ALPHA.pkg"],
        ["beta-pkg", "alpha_pkg", "Alpha-Pkg"],
        [" alpha-pkg", "beta-pkg "],
    ]
    same = [pip_env(spellings[i % 4], wheels, env_vars={"I": str(i)}) for i in range(20)]
    other = pip_env(["gamma-pkg"], wheels)
    async with running_agent() as ra:
        replies = await asyncio.wait_for(
            asyncio.gather(*(ra.create(t, timeout_s=int(BUILD_S)) for t in [*same, other])),
            BUILD_S * 2,
        )
        *ours, theirs = replies
        assert len({r.runtime_env_id for r in ours}) == 20, "the env_vars make twenty envs"
        assert len({r.context.py_executable for r in ours}) == 1
        assert theirs.context.py_executable != ours[0].context.py_executable
        assert len(pip_dirs(ra)) == 2
        assert len(logs(ra)) == 2, "one installer run per distinct set"
        info = await ra.info()
        assert info.cache.extractions == 2
        assert sorted(u.references for u in info.uris if u.kind == "pip") == [1, 20]

        mine = await probe(ours[0].context, "alpha_pkg", "beta_pkg", "gamma_pkg")
        assert (mine["alpha_pkg"][0], mine["beta_pkg"][0], mine["gamma_pkg"]) == (
            "alpha 1.0", "beta 1.0", None,
        )  # fmt: skip
        yours = await probe(theirs.context, "alpha_pkg", "beta_pkg", "gamma_pkg")
        # alpha came in as gamma's dependency, from the same wheelhouse
        assert (yours["alpha_pkg"][0], yours["beta_pkg"], yours["gamma_pkg"][0]) == (
            "alpha 1.0", None, "gamma 1.0",
        )  # fmt: skip
        ra.service.check_invariants()


def _stand_in(folder: Path, body: str) -> str:
    """A 'python' for build_venv: a shell script with ``body``, given the installer's argv."""
    script = folder / "python-stand-in"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


async def test_the_installer_sees_no_pip_or_uv_configuration_of_the_agents_environment(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: PIP_* (a find-links, a constraints file, a target: any of pip's options),
    _PIP_RUNNING_IN_SUBPROCESS (pip --python then installs into the agent's own environment)
    and UV_* reached the installer, which ran in the agent's working directory."""
    for key, value in {
        "PIP_FIND_LINKS": "/elsewhere", "PIP_TARGET": "/elsewhere", "PIP_CONFIG_FILE": "/x.conf",
        "_PIP_RUNNING_IN_SUBPROCESS": "1", "UV_INDEX_URL": "file:///elsewhere", "KEEP_ME": "1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    spec = parse_pip(["anything"])
    assert spec is not None
    staging = base / "staging"
    staging.mkdir()
    seen = base / "seen"
    python = _stand_in(base, f'{{ pwd; echo "$@"; env; }} >> {seen}')
    await build_venv(
        spec, staging, python=python, installer="pip", log_path=base / "log", label="probe"
    )
    lines = seen.read_text().splitlines()
    assert lines.count(str(staging)) == 2, "both commands run in the staging folder"
    assert any("--isolated install" in line for line in lines), lines
    configured = sorted({line for line in lines if line.startswith(("PIP_", "_PIP_", "UV_"))})
    assert configured == [f"PIP_CONFIG_FILE={os.devnull}", "UV_NO_CONFIG=1"]
    assert "KEEP_ME=1" in lines


async def test_a_failure_sends_back_the_installers_own_last_lines_cut_short(base: Path) -> None:
    """What a build printed (indented by pip, or hidden behind a carriage return) never goes
    back; the installer's lines do, at most 10, each quoted by echo (at most 200 characters of it,
    its length when cut, control characters escaped),
    found in the log's last 64 KiB however long it is. The log keeps everything."""
    secret = "SECRET-FROM-A-FILE"
    output = base / "output"
    with output.open("w") as out:
        out.write(f"ERROR: early line, more than 64 KiB from the end {secret}\n")
        out.write(f"      {'x' * 100} build output\n" * 2000)
        out.write(f"      the build read: {secret}\n")
        out.write(f"  progress\rERROR: {secret}\n")
        out.write(f"\tindented with a tab {secret}\n")
        out.write("error: one too many\n")
        for i in range(10):
            out.write(f"ERROR: line {i} \x1b[31mred\x1b[0m {'y' * (30 * i)}\n")
    spec = parse_pip(["anything"])
    assert spec is not None
    staging = base / "staging"
    staging.mkdir()
    log_path = base / "log"
    python = _stand_in(base, f"cat {output}; exit 1")
    with pytest.raises(InstallerFailed) as failed:
        await build_venv(
            spec, staging, python=python, installer="pip", log_path=log_path, label="probe"
        )
    message = failed.value.message
    assert secret not in message
    assert secret in log_path.read_text()
    shown = message.split("\n")[1:]
    written = [f"ERROR: line {i} \x1b[31mred\x1b[0m {'y' * (30 * i)}" for i in range(10)]
    assert shown == [echo(line, 200) for line in written], shown  # quoted as client input is
    assert all(len(line) <= 240 and line.isprintable() for line in shown), shown
    assert shown[-1].endswith(f"... ({len(written[-1])} characters)"), shown[-1]
    assert str(log_path) in message


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("installer", "words"),
    [
        ("pip", "No matching distribution found for doesnotexist==1.0"),  # pip's own
        ("uv", "doesnotexist was not found in the provided package locations"),  # uv's
    ],
)
async def test_an_unresolvable_requirement_fails_with_the_installers_words_and_leaves_nothing(
    wheels: Path, installer: str, words: str
) -> None:
    text = pip_env(["doesnotexist==1.0"], wheels)
    async with running_agent(pip_installer=installer) as ra:
        for attempt in (1, 2):  # a failure is not cached: the next create runs pip again
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await ra.create(text, timeout_s=int(BUILD_S))
            code, details = status_of(failed.value)
            assert code == grpc.StatusCode.FAILED_PRECONDITION, details
            assert words in details
            assert len(logs(ra)) == attempt
            [log] = [path for path in logs(ra) if str(path) in details]
            assert words in log.read_text()
            await nothing_left(ra)
        await still_serves(ra)


async def test_a_cancelled_create_kills_the_installer_and_leaves_no_partial_venv(
    tmp_path: Path,
) -> None:
    """Its last create gone (the client cancelled), a never-ending install is killed, its whole
    group, and nothing of it is left. (A setup timeout keeps it going: the next test.)"""
    slow = tmp_path / "slow"
    slow_sdist(slow)
    text = slow_env(slow)
    with reaped(set()) as found:
        async with running_agent() as ra:
            staging = f"{ra.root / 'tmp'}/"
            create = asyncio.create_task(ra.create(text, timeout_s=120))

            def seen() -> bool:
                found.update(processes_mentioning(staging))
                return bool(found)

            await wait_until(seen, timeout_s=BUILD_S, what="an installer process")
            create.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await create
            await wait_until(lambda: not survivors(found), what=f"{found} killed")
            await nothing_left(ra)
            await still_serves(ra)


async def test_an_install_outlives_a_cancelled_waiter_and_its_last_waiters_timeout_till_the_stop(
    tmp_path: Path,
) -> None:
    slow = tmp_path / "slow"
    pidfile = slow_sdist(slow)

    def env(tag: str) -> str:
        return slow_env(slow, env_vars={"TAG": tag})

    spec = parse_pip(json.loads(env("a"))["pip"])
    assert spec is not None
    key = UriKey(UriKind.PIP, spec.uri)
    with reaped(set()) as found:
        async with running_agent() as ra:

            def waiters() -> int:
                entry = ra.service.store.entry(key)
                return -1 if entry is None else int(entry.waiters)

            first = asyncio.create_task(ra.create(env("a"), timeout_s=120))
            await wait_until(pidfile.exists, timeout_s=BUILD_S, what="pip running the backend")
            found.update(read_pids(pidfile))
            found.update(processes_mentioning(f"{ra.root / 'tmp'}/"))
            assert len(found) >= 4, "pip, pip under the venv, the backend and its child"

            second = asyncio.create_task(ra.create(env("b"), timeout_s=3))
            await wait_until(lambda: waiters() == 2, timeout_s=2, what="b joins the install")
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            await wait_until(lambda: waiters() == 1, timeout_s=2, what="a gone from the agent")
            assert all(map(alive, found)), "the install died with a waiter others still had"

            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await second
            code, details = status_of(failed.value)
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
            assert "1 build(s) go on" in details
            entry = ra.service.store.entry(key)
            assert entry is not None
            assert (entry.waiters, entry.kept) == (0, True)
            assert all(map(alive, found)), "a setup timeout threw the build away"
            await still_serves(ra)
        # the agent's stop cancels the builds it kept going: the whole group killed
        await wait_until(lambda: not survivors(found), what=f"group {found} killed at the stop")


# -- eviction --------------------------------------------------------------------------------


async def test_a_venv_in_use_is_never_evicted_and_goes_once_released(
    wheels: Path, tmp_path: Path
) -> None:
    zip_path = tmp_path / "other.zip"
    zip_path.write_bytes(workdir_zip({"f.txt": "x" * 1000}))
    async with running_agent(cache_budget_bytes=0) as ra:
        held = await ra.create(pip_env(["alpha-pkg"], wheels), timeout_s=int(BUILD_S))
        [venv] = pip_dirs(ra)
        other = await ra.create(env_json(working_dir=zip_path.as_uri()))
        assert await ra.delete(other.runtime_env_id) == 0
        await ra.settle()
        info = await ra.info()
        assert info.cache.evictions == 1, "the released package went, over a budget of 0"
        assert pip_dirs(ra) == [venv], "the venv in use went with it"
        assert (await probe(held.context, "alpha_pkg"))["alpha_pkg"][0] == "alpha 1.0"

        assert await ra.delete(held.runtime_env_id) == 0
        await ra.settle()
        assert pip_dirs(ra) == []
        info = await ra.info()
        assert info.cache.evictions == 2
        assert list(info.uris) == []
        ra.service.check_invariants()
