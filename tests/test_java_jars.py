"""java_jars against a real agent (in-process, on a unix socket) and a real package server on
127.0.0.1: a ``.jar`` kept whole in a folder of its own, a ``.zip`` unpacked, both returned as
the context's ``java_jars`` (gRPC, and Ray's door in Ray's format), counted and released as
py_modules are, and the folders put on a real Java class path as Ray's Java worker puts them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import aiohttp
import grpc
import pytest

from agent.app.config import RaySettings
from rtenv.ray.v1 import runtime_env_agent_pb2 as ray_pb2
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import make_zip
from tests.harness.pip_wheels import run
from tests.harness.ray_door import RayClient
from tests.harness.tempdirs import short_tempdir

JAR = make_zip({"META-INF/MANIFEST.MF": "Manifest-Version: 1.0\n", "rtenv/A.class": b"\xca\xfe"})
LIBS = make_zip({"libs/b.jar": JAR, "libs/notes.txt": "two jars' worth\n"})  # one top folder


def _states(info: object) -> dict[str, tuple[int, str]]:
    return {u.uri: (u.references, u.state) for u in info.uris}  # type: ignore[attr-defined]


async def test_a_jar_is_kept_whole_in_its_folder_and_a_zip_is_unpacked_in_the_context() -> None:
    async with package_server() as pkgs, running_agent() as a:
        jar_url, zip_url = pkgs.add("a.jar", JAR), pkgs.add("libs.zip", LIBS)
        reply = await a.create(json.dumps({"java_jars": [jar_url, zip_url, jar_url]}))
        jar_dir, zip_dir = (Path(p) for p in reply.context.java_jars)
        assert (jar_dir / "a.jar").read_bytes() == JAR, "the jar, byte for byte"
        assert sorted(p.name for p in jar_dir.iterdir()) == ["a.jar"]
        assert (jar_dir / "a.jar").stat().st_mode & 0o444 == 0o444, "readable by the worker"
        assert (zip_dir / "b.jar").read_bytes() == JAR, "unpacked, its one top folder dropped"
        assert (zip_dir / "notes.txt").is_file()
        assert list(reply.uris) == [f"java_jars:{jar_url}", f"java_jars:{zip_url}"]
        assert (reply.context.cwd, dict(reply.context.env_vars)) == ("", {})
        assert (pkgs.gets["a.jar"], pkgs.gets["libs.zip"]) == (1, 1)
        a.service.check_invariants()


async def test_java_jars_are_counted_and_released_per_uri_as_py_modules_are() -> None:
    async with package_server() as pkgs, running_agent() as a:
        jar_url, zip_url = pkgs.add("a.jar", JAR), pkgs.add("libs.zip", LIBS)
        one = await a.create(json.dumps({"java_jars": [jar_url]}))
        both = await a.create(json.dumps({"java_jars": [jar_url, zip_url]}))
        assert one.context.java_jars[0] == both.context.java_jars[0], "one folder, shared"
        states = _states(await a.info())
        assert (states[jar_url], states[zip_url]) == ((2, "ready"), (1, "ready"))
        assert await a.delete(one.runtime_env_id) == 0
        states = _states(await a.info())
        assert (states[jar_url], states[zip_url]) == ((1, "ready"), (1, "ready"))
        assert await a.delete(both.runtime_env_id) == 0
        await a.settle()
        states = _states(await a.info())
        assert (states[jar_url], states[zip_url]) == ((0, "unused"), (0, "unused"))
        again = await a.create(json.dumps({"java_jars": [jar_url]}))  # from the cache
        assert again.context.java_jars == one.context.java_jars
        assert pkgs.gets["a.jar"] == 1, "an unused jar is reused, not fetched again"
        a.service.check_invariants()


async def test_a_jar_not_matching_its_pinned_digest_is_refused_and_leaves_nothing() -> None:
    async with package_server() as pkgs, running_agent() as a:
        url = pkgs.add("a.jar", JAR)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.create(json.dumps({"java_jars": [f"{url}#sha256={'0' * 64}"]}))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"the URI expects {'0' * 64}" in (caught.value.details() or "")
        good = f"{url}#sha256={hashlib.sha256(JAR).hexdigest()}"
        reply = await a.create(json.dumps({"java_jars": [good]}))
        assert (Path(reply.context.java_jars[0]) / "a.jar").read_bytes() == JAR
        assert [u.uri for u in (await a.info()).uris] == [good]


async def test_rays_door_returns_the_java_jars_folders_in_rays_context() -> None:
    async with (
        package_server() as pkgs,
        running_agent(ray=RaySettings()) as a,
        aiohttp.ClientSession() as session,
    ):
        ray = RayClient(session, a.agent.ray_address)
        jar_url = pkgs.add("a.jar", JAR)
        text = json.dumps({"java_jars": [jar_url]})
        reply = await ray.create(text)
        assert reply.status == ray_pb2.AGENT_RPC_STATUS_OK, reply.error_message
        context = json.loads(reply.serialized_runtime_env_context)
        (folder,) = context["java_jars"]
        assert (Path(folder) / "a.jar").read_bytes() == JAR
        grpc_reply = await a.create(text)  # one env across both doors
        assert list(grpc_reply.context.java_jars) == [folder]


_HELLO = """package rtenv;
public class Hello {
    public static void main(String[] args) { System.out.println(Other.greet()); }
}
"""
_OTHER = """package rtenv;
public class Other { public static String greet() { return "hello from two jars"; } }
"""


async def _jar_of(src: Path, name: str, out: Path, *classpath: Path) -> bytes:
    """Compile ``src/rtenv/<name>.java`` and jar it (bounded in time)."""
    classes = out / f"{name}-classes"
    cp = [*(str(p) for p in classpath)] or [str(classes)]
    steps = [
        ["javac", "-cp", ":".join(cp), "-d", str(classes), str(src / "rtenv" / f"{name}.java")],
        ["jar", "cf", str(out / f"{name}.jar"), "-C", str(classes), "."],
    ]
    for command in steps:
        code, _, err = await run(*command, timeout_s=120)
        assert code == 0, err
    return (out / f"{name}.jar").read_bytes()


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("java", "javac", "jar")), reason="needs a JDK"
)
async def test_a_java_worker_loads_classes_from_a_kept_jar_and_an_unpacked_zip_of_jars() -> None:
    """The class path made as Ray's ``exec_worker`` makes it from ``java_jars`` (each folder's
    ``/*`` and the folder): Hello from a jar kept whole calls Other from a jar in a zip."""
    work = short_tempdir()
    try:
        src = work / "src" / "rtenv"
        src.mkdir(parents=True)
        (src / "Hello.java").write_text(_HELLO)
        (src / "Other.java").write_text(_OTHER)
        other = await _jar_of(work / "src", "Other", work)
        hello = await _jar_of(work / "src", "Hello", work, work / "Other.jar")
        async with package_server() as pkgs, running_agent() as a:
            urls = [
                pkgs.add("hello.jar", hello),
                pkgs.add("deps.zip", make_zip({"d/o.jar": other})),
            ]
            reply = await a.create(json.dumps({"java_jars": urls}))
            class_path = ":".join(f"{jar}/*:{jar}" for jar in reply.context.java_jars)
            code, out, err = await run("java", "-cp", class_path, "rtenv.Hello", timeout_s=120)
        assert (code, out.strip()) == (0, "hello from two jars"), err
    finally:
        shutil.rmtree(work, ignore_errors=True)
