"""Every module that names client input in an error quotes it through ``echo``: a huge value
(a zip member's name, a symlink's target, a URI's path, a requirement, a host, an installer's
line that quotes one) comes back as its first characters and its length, never whole. One test
per module; each failed before the module quoted through ``echo`` (whole values, or cuts that did
not say how long the value was)."""

from __future__ import annotations

import stat
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest

from agent.core.errors import AgentError, PermissionDenied, UnsafeArchive, echo
from agent.core.hostname import host_problem
from agent.core.packages import Package
from agent.core.pip_spec import parse_pip
from agent.core.uris import ParsedUri, UriKey, UriKind, parse_uri
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.file_source import FileRoots, open_package
from agent.install.installers import InstallTools, build_installers
from agent.install.unpack.archive import extract_zip
from agent.install.unpack.plan import ArchiveLimits
from agent.install.venvs.build import _tail
from agent.state.state_db import StateDB
from agent.state.store import UriStore

SHORT = 1024  # bytes: what a message about one huge value may take at most
HUGE = 100_000


def _short_naming(message: str, length: int) -> None:
    assert len(message.encode()) < SHORT, f"{len(message)} characters: {message[:300]}..."
    assert f"({length} characters)" in message, message


def test_archive_quotes_a_huge_member_name_and_symlink_target_cut(tmp_path: Path) -> None:
    name = "../" + "n" * 65_000  # a zip name's length is 16 bits: 65535 at most
    archive = tmp_path / "names.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(name, b"x")
    with pytest.raises(UnsafeArchive) as refused:
        extract_zip(archive, tmp_path / "a", strip_top_level=False, limits=ArchiveLimits(),
                    label="working_dir:file:///names.zip")  # fmt: skip
    _short_naming(refused.value.message, len(name))

    target = "/" + "t" * 4000  # under the 4096 bytes a symlink's target may have
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(link, target)
    with pytest.raises(UnsafeArchive) as refused:
        extract_zip(archive, tmp_path / "b", strip_top_level=False, limits=ArchiveLimits(),
                    label="working_dir:file:///link.zip")  # fmt: skip
    _short_naming(refused.value.message, len(target))


async def test_fetch_quotes_a_huge_uri_path_outside_the_roots_cut(tmp_path: Path) -> None:
    path = "/elsewhere/" + "p" * HUGE
    uri = ParsedUri("file", f"file://{path}", path, None)
    async with aiohttp.ClientSession() as session:
        fetcher = Fetcher(session, FetchLimits(), file_roots=(str(tmp_path),))
        with pytest.raises(PermissionDenied) as refused:
            fetcher.check_origin(uri, "working_dir:file:///elsewhere/...")
    _short_naming(refused.value.message, len(path))


def test_file_source_quotes_a_huge_path_outside_the_roots_cut(tmp_path: Path) -> None:
    path = "/elsewhere/" + "p" * HUGE
    with pytest.raises(PermissionDenied) as refused:
        open_package(path, FileRoots.of([str(tmp_path)]), "working_dir:file:///elsewhere/...")
    _short_naming(refused.value.message, len(path))


def test_pip_spec_quotes_a_huge_requirement_and_field_name_through_echo() -> None:
    requirement = "r" * HUGE
    with pytest.raises(AgentError) as refused:
        parse_pip([requirement])
    _short_naming(refused.value.message, HUGE)
    assert echo(requirement) in refused.value.message

    field = "f" * HUGE
    with pytest.raises(AgentError) as refused:
        parse_pip({"packages": ["a"], field: []})
    _short_naming(refused.value.message, HUGE)
    assert echo(field) in refused.value.message  # quoted once, not a repr of a repr


def test_venv_quotes_a_huge_installer_line_cut(tmp_path: Path) -> None:
    line = "ERROR: No matching distribution found for " + "r" * 50_000  # within the 64 KiB read
    log = tmp_path / "log"
    log.write_text(f"$ pip install\n{line}\n")
    _short_naming(_tail(log), len(line))


async def test_store_cuts_a_huge_uri_once_as_the_label_of_its_messages(tmp_path: Path) -> None:
    path = "/missing" + "/" + "/".join(["d" * 200] * 19)  # under parse_uri's 4096 characters
    key = UriKey(UriKind.WORKING_DIR, f"file://{path}")
    root = tmp_path / "root"
    root.mkdir()
    db = StateDB(root / "state.db")
    await db.open()  # the store works over the root's index, this process a holder of it
    async with aiohttp.ClientSession() as session:
        installers = build_installers(
            InstallTools(
                Fetcher(session, FetchLimits()),
                ArchiveLimits(),
                sys.executable,
                "pip",
                root / "logs",
            )
        )
        store = UriStore(root, installers, db=db, refcount=lambda _: 0, budget_bytes=10**9)
        try:
            with pytest.raises(AgentError) as failed:
                await store.ensure(Package(key, parse_uri(key.kind.value, key.uri)))
        finally:
            await store.close()
            await db.close()
    _short_naming(failed.value.message, len(str(key)))
    assert "no such file on this node" in failed.value.message


def test_hostname_quotes_a_huge_host_cut() -> None:
    host = "h" * HUGE + "..example"
    problem = host_problem(host)
    assert problem is not None
    _short_naming(problem, len(host))
