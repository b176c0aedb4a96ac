"""Pure units of a build's progress: the line's words, when the next line is due (an injected
clock), the watch's tick over the store's entries (injected clock and measure), the bound on
builds kept going past a setup timeout, and Ray's setup log line format."""

from __future__ import annotations

import re
from pathlib import Path

from agent.core.progress import BuildProgress, Throttle, progress_line
from agent.core.uris import UriKey, UriKind
from agent.doors.ray_setup_log import ray_line, setup_log_path
from agent.state.builds import Builds, measure_staging
from agent.state.entries import Build, UriEntry, UriState


def test_a_progress_line_says_what_it_builds_how_far_and_for_how_long() -> None:
    line = progress_line(BuildProgress("pip:pip://ab12", "pip", 42.4, 13 * 1024 * 1024, 3, 7))
    assert line == "building pip:pip://ab12: 3/7 packages, 13.0 MiB so far, 42s"
    bare = progress_line(BuildProgress("uv:uv://cd", "uv", 5.0, 512))
    assert bare == "building uv:uv://cd: 512 B so far, 5s"
    done = progress_line(BuildProgress("uv:uv://cd", "uv", 5.0, 512, packages_done=4))
    assert done == "building uv:uv://cd: 4 packages installed, 512 B so far, 5s"
    queued = progress_line(BuildProgress("pip:pip://ab", "pip", 9.0, 0, queued=True))
    assert queued == "building pip:pip://ab: queued for an install slot, 0 B so far, 9s"


def test_the_throttle_says_a_first_line_after_every_s_then_every_every_s() -> None:
    throttle = Throttle(every_s=5.0)
    assert not throttle.due("a", started=100.0, now=104.9)  # a build shorter says nothing
    assert throttle.due("a", started=100.0, now=105.0)
    assert not throttle.due("a", started=100.0, now=109.0)
    assert throttle.due("a", started=100.0, now=110.5)
    assert throttle.due("b", started=100.0, now=110.5)  # each build its own
    throttle.forget({"b"})
    assert throttle.due("a", started=108.0, now=113.0)  # forgotten: from its start again


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entry(kind: UriKind, uri: str, started: float, staging: Path | None) -> UriEntry:
    entry = UriEntry(UriKey(kind, uri), Path("/nowhere"), UriState.INSTALLING)
    entry.build = Build(started, staging)
    return entry


async def test_a_tick_measures_and_emits_the_lines_due_only() -> None:
    clock, measured, emitted = _Clock(), [], []
    slow = _entry(UriKind.PIP, "pip://slow", 1000.0, Path("/staging/slow"))
    queued = _entry(UriKind.PIP, "pip://queued", 1000.0, None)
    entries = {e.key: e for e in (slow, queued)}

    def measure(path: Path) -> tuple[int, int]:
        measured.append(path)
        return 4096, 2

    builds = Builds(entries, max_kept=1, clock=clock, every_s=5.0, measure=measure)
    builds.emit = lambda key, line: emitted.append((key.uri, line))
    assert await builds.tick() == 0  # nothing due at its start
    clock.now = 1006.0
    assert await builds.tick() == 2
    assert measured == [Path("/staging/slow")]  # a queued build has no staging to measure
    assert emitted == [
        ("pip://slow", "building pip:pip://slow: 2 packages installed, 4.0 KiB so far, 6s"),
        ("pip://queued", "building pip:pip://queued: queued for an install slot, 0 B so far, 6s"),
    ]
    clock.now = 1008.0
    assert await builds.tick() == 0  # the next one is 5 s after the last
    views = {e.key.uri: p for e, p in builds.in_flight()}
    assert views["pip://slow"].bytes_so_far == 4096  # info's figure, with no I/O


def test_a_staging_folder_is_measured_in_bytes_and_packages_installed(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name in ("a-1.0.dist-info", "b-2.0.dist-info", "a"):
        (site / name).mkdir(parents=True)
    (site / "a" / "x.py").write_bytes(b"x" * 100)
    (tmp_path / "download.whl").write_bytes(b"y" * 1000)
    assert measure_staging(tmp_path) == (1100, 2)


def test_builds_kept_going_are_bounded_and_only_installing_ones() -> None:
    a = _entry(UriKind.PIP, "pip://a", 0.0, None)
    b = _entry(UriKind.PIP, "pip://b", 0.0, None)
    ready = UriEntry(UriKey(UriKind.PIP, "pip://r"), Path("/r"), UriState.READY)
    entries = {e.key: e for e in (a, b, ready)}
    builds = Builds(entries, max_kept=1)
    assert builds.keep([a.key, ready.key]) == (a.key,)
    assert builds.keep([a.key, b.key]) == (a.key,)  # b: past the bound, cancelled as before
    assert builds.left(a)
    assert not builds.left(b)


def test_a_setup_log_line_is_in_rays_format_and_only_for_rays_job_ids(tmp_path: Path) -> None:
    line = ray_line("building pip:pip://ab: 1 B so far, 5s", 0.25)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,250\tINFO rtenv-agent:0 -- building pip:pip://ab: "
        r"1 B so far, 5s\n",
        line,
    )
    assert setup_log_path(tmp_path, "01000000") == tmp_path / "runtime_env_setup-01000000.log"
    for hostile in ("../x", "a/b", "", "x" * 65, "01 00"):
        assert setup_log_path(tmp_path, hostile) is None


def test_info_prints_the_builds_in_flight_and_who_waits_on_each() -> None:
    from agent.ops.info_address import format_info
    from rtenv.v1 import agent_pb2

    reply = agent_pb2.GetRuntimeEnvsInfoReply(
        builds=[
            agent_pb2.BuildInfo(
                uri="pip://ab12", kind="pip", elapsed_seconds=42.4, bytes_so_far=3 * 1024**2,
                env_ids=["e1"], job_ids=["01000000"],
            ),
            agent_pb2.BuildInfo(uri="uv://cd", kind="uv", elapsed_seconds=700, kept=True),
        ]
    )  # fmt: skip
    text = format_info(reply)
    assert "BUILDING" in text
    assert "pip              42s     3.0 MiB  pip://ab12" in text
    assert "waited on by 1 create (e1); jobs: 01000000" in text
    assert "uv              700s         0 B  uv://cd" in text
    assert "kept going past a setup timeout: no create waits" in text
    assert "BUILDING" not in format_info(agent_pb2.GetRuntimeEnvsInfoReply())
