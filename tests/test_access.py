"""Access: a token every RPC but health checks must carry; file:// packages confined to allowed
roots; the socket private (0600) in a folder others cannot write to."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent.app.config import Settings
from agent.app.token import MISSING, WRONG, Token
from agent.core.errors import ErrorKind, TokenError, Unauthenticated
from agent.ops.server import Agent
from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.agent_process import refused, run_cli
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.packages import env_json, workdir_zip
from tests.harness.rpc import rpc_refused

TOKEN = "s3cret-token-for-tests"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


# -- the token -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [(), bearer("wrong"), bearer(TOKEN + "x"), (("authorization", TOKEN),), bearer(TOKEN[:-1])],
    ids=["none", "wrong", "longer", "no-bearer", "prefix"],
)
async def test_rpc_without_the_right_token_is_unauthenticated_saying_how_to_send_it(
    base: Path, metadata: tuple[tuple[str, str], ...]
) -> None:
    (base / "token").write_text(TOKEN + "\n")
    package = base / "wd.zip"
    package.write_bytes(workdir_zip({"main.py": "M = 1\n"}))
    async with running_agent(token_file=str(base / "token")) as a:
        create = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=env_json(f"file://{package}")
        )
        for call in (
            a.stub.CreateRuntimeEnv(create, timeout=10, metadata=metadata),
            a.stub.GetRuntimeEnvsInfo(
                agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10, metadata=metadata
            ),
            a.stub.DeleteRuntimeEnv(
                agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id="f" * 32),
                timeout=10,
                metadata=metadata,
            ),
        ):
            await rpc_refused(
                call, UNAUTHENTICATED, "authorization: Bearer <token>", "--token-file"
            )
        assert len(a.service.tables) == 0, "a refused create counted a reference"
        assert a.uri_dirs() == [], "a refused create installed its package"

        reply = await a.stub.CreateRuntimeEnv(create, timeout=10, metadata=bearer(TOKEN))
        assert (Path(reply.context.cwd) / "main.py").is_file()
        info = await a.stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10, metadata=bearer(TOKEN)
        )
        assert info.total_envs == 1


async def test_health_check_needs_no_token_and_reflection_does(base: Path) -> None:
    (base / "token").write_text(TOKEN)
    async with (
        running_agent(token_file=str(base / "token")) as a,
        grpc.aio.insecure_channel(a.agent.address) as channel,
    ):
        health: Any = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rtenv.v1.RuntimeEnvAgent"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
        reflect: Any = stub.ServerReflectionInfo
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            _ = [r async for r in reflect(iter([request]), timeout=10)]
        assert caught.value.code() == UNAUTHENTICATED, caught.value.details()
        replies = [r async for r in reflect(iter([request]), timeout=10, metadata=bearer(TOKEN))]
        names = {s.name for s in replies[0].list_services_response.service}
        assert "rtenv.v1.RuntimeEnvAgent" in names


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ((), "the call carried none"),
        (bearer("wrong"), "the call's token is not this agent's"),
        ((("authorization", TOKEN),), "the call's token is not this agent's"),
    ],
    ids=["missing", "wrong", "no-bearer"],
)
async def test_a_missing_token_and_a_wrong_token_are_told_apart(
    base: Path, metadata: tuple[tuple[str, str], ...], says: str
) -> None:
    (base / "token").write_text(TOKEN + "\n")
    async with running_agent(token_file=str(base / "token")) as a:
        call = a.stub.GetRuntimeEnvsInfo(
            agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10, metadata=metadata
        )
        await rpc_refused(call, UNAUTHENTICATED, says, "authorization: Bearer <token>")


async def test_info_command_sends_the_token_from_its_token_file(base: Path) -> None:
    (base / "token").write_text(TOKEN + "\n")
    async with running_agent(token_file=str(base / "token"), cache_budget_bytes=12345) as a:
        address = a.agent.address
        code, out, err = await run_cli(
            "info", "--address", address, "--token-file", str(base / "token")
        )
        assert code == 0, err
        assert "of budget 12.1 KiB" in out
        code, out, err = await run_cli("info", "--address", address, "--timeout", "5")
        assert code == 1, out
        assert "UNAUTHENTICATED: this agent wants a token and the call carried none" in err, err
        assert "authorization: Bearer <token>" in err, err
        assert err.rstrip().endswith("(info: pass --token-file FILE)"), err


@pytest.mark.parametrize(("content", "words"), [("", "is empty"), (None, "cannot read")])
async def test_agent_with_an_empty_or_unreadable_token_file_refuses_to_start(
    base: Path, content: str | None, words: str
) -> None:
    token = base / "token"
    if content is not None:
        token.write_text(content + "\n  \n")
    agent = Agent(Settings(root=base / "root", token_file=str(token)))
    with pytest.raises(TokenError) as caught:
        await agent.start()
    assert words in caught.value.message
    assert str(token) in caught.value.message


# -- file roots ------------------------------------------------------------------------------


async def create_status(a: RunningAgent, path: Path | str) -> grpc.StatusCode:
    """The status of a create of the file:// package at ``path``; a refusal names the setting."""
    details = ""
    try:
        await a.create(env_json(f"file://{path}"))
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    else:
        code = grpc.StatusCode.OK
    assert code != PERMISSION_DENIED or "the allow-file-root setting" in details, details
    return code


async def test_file_packages_are_confined_to_the_allowed_roots(base: Path) -> None:
    allowed, other, sibling = base / "pkgs", base / "other", base / "pkgs-evil"
    for folder in (allowed, other, sibling, allowed / "sub"):
        folder.mkdir()
    body = workdir_zip({"main.py": "M = 1\n"})
    for path in (allowed / "in.zip", allowed / "sub" / "deep.zip", other / "out.zip"):
        path.write_bytes(body)
    (sibling / "s.zip").write_bytes(body)
    (allowed / "link.zip").symlink_to(other / "out.zip")
    (allowed / "dirlink").symlink_to(other)
    async with running_agent(allow_file_roots=(str(allowed),)) as a:
        assert await create_status(a, other / "out.zip") == PERMISSION_DENIED
        assert await create_status(a, sibling / "s.zip") == PERMISSION_DENIED
        assert await create_status(a, allowed / "link.zip") == PERMISSION_DENIED
        assert await create_status(a, allowed / "dirlink" / "out.zip") == PERMISSION_DENIED
        assert await create_status(a, f"{allowed}/../other/out.zip") == PERMISSION_DENIED
        assert await create_status(a, f"{allowed}/%2E%2E/other/out.zip") == PERMISSION_DENIED
        assert len(a.service.tables) == 0
        await a.settle()  # staging is removed in the background
        assert (a.uri_dirs(), listed(a.root, "tmp")) == ([], [])
        assert await create_status(a, allowed / "in.zip") == grpc.StatusCode.OK
        assert await create_status(a, allowed / "sub" / "deep.zip") == grpc.StatusCode.OK
        assert len(a.uri_dirs()) == 2
        a.service.check_invariants()


async def test_several_allowed_roots_each_admit_their_packages(base: Path) -> None:
    first, second = base / "a", base / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "p.zip").write_bytes(workdir_zip({"x.py": str(folder)}))
    async with running_agent(allow_file_roots=(str(first), str(second))) as a:
        assert await create_status(a, first / "p.zip") == grpc.StatusCode.OK
        assert await create_status(a, second / "p.zip") == grpc.StatusCode.OK


# -- the socket ------------------------------------------------------------------------------


async def test_socket_folder_writable_by_others_is_refused_with_exit_2(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    args = ("--root", str(base / "root"), "--address", f"unix:{shared}/a.sock")
    code, err = await refused(base / "refused.log", *args)
    assert code == 2, err
    assert f"the socket's folder {shared} is writable by others" in err, err
    assert not (shared / "a.sock").exists()


@pytest.mark.parametrize("explicit", [False, True], ids=["default", "explicit"])
async def test_socket_is_0600_in_a_folder_others_cannot_write_whatever_the_umask(
    base: Path, explicit: bool
) -> None:
    """Under umask 0 the folders the agent makes must still not be writable by others (else it
    refuses its own socket folder)."""
    address = f"unix:{base}/sock/a.sock" if explicit else ""
    agent = Agent(Settings(root=base / "root", address=address))
    old = os.umask(0)
    try:
        try:
            await agent.start()
        finally:
            os.umask(old)
        path = Path(agent.address.removeprefix("unix:"))
        mode = os.stat(path).st_mode
        assert (stat.S_ISSOCK(mode), stat.S_IMODE(mode)) == (True, 0o600)
        assert not os.stat(path.parent).st_mode & 0o022
        async with grpc.aio.insecure_channel(agent.address) as channel:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10)
            assert info.total_envs == 0
    finally:
        await agent.stop(grace=0.5)


def test_token_check_tells_missing_from_wrong_and_takes_only_bearer_and_the_token() -> None:
    """The door-neutral check both doors call: None when right, else Unauthenticated."""
    token = Token(TOKEN.encode())
    token.check(f"Bearer {TOKEN}".encode())
    for given, message in [
        (None, MISSING),
        (b"", WRONG),
        (TOKEN.encode(), WRONG),
        (f"Bearer {TOKEN}x".encode(), WRONG),
        (f"bearer {TOKEN}".encode(), WRONG),
    ]:
        with pytest.raises(Unauthenticated) as caught:
            token.check(given)
        assert (caught.value.message, caught.value.kind) == (message, ErrorKind.UNAUTHENTICATED)
