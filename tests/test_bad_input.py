"""Malformed requests against one real in-process agent: each gets its status code and a message
naming the field or the limit, and none of them changes the agent's state."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from agent.core.runtime_env import MAX_ARG_STRLEN, EnvLimits
from rtenv.v1 import agent_pb2
from tests.harness.in_process import RunningAgent, listed, running_agent
from tests.harness.package_server import PackageServer, package_server
from tests.harness.packages import env_json, workdir_zip
from tests.harness.tempdirs import short_tempdir

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_URIS = 3
MAX_ENV_VAR_BYTES = 32 * 1024
MAX_JSON_BYTES = EnvLimits().max_json_bytes
GRPC_MAX_MESSAGE = 4 * 1024 * 1024  # Settings.max_message_bytes
ZERO_SHA = "0" * 64

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@dataclass
class Target:
    agent: RunningAgent
    pkgs: PackageServer
    files: Path  # holds a directory "adir" and no file "missing.zip"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target() -> AsyncIterator[Target]:
    files = short_tempdir()
    (files / "adir").mkdir()
    limits = EnvLimits(max_uris=MAX_URIS, max_env_var_bytes=MAX_ENV_VAR_BYTES)
    try:
        async with package_server() as pkgs, running_agent(env=limits) as agent:
            pkgs.add("not-a-zip.zip", b"plain text, not a zip archive\n")
            pkgs.add("not-a-jar.jar", b"plain text, not a jar\n")
            pkgs.add("good.zip", workdir_zip({"main.py": "print('ok')\n"}))
            pkgs.add("forbidden.zip", b"", statuses=[403] * 100)
            yield Target(agent, pkgs, files)
    finally:
        shutil.rmtree(files, ignore_errors=True)


Request = agent_pb2.CreateRuntimeEnvRequest | agent_pb2.DeleteRuntimeEnvRequest
Build = Callable[[Target], Request]


def create(env: str | dict[str, Any] | Callable[[Target], str], *, timeout_s: int = 0) -> Build:
    """A create of ``env``: raw text, an object to serialize, or text built from the target."""

    def build(t: Target) -> Request:
        if callable(env):
            text = env(t)
        elif isinstance(env, dict):
            text = json.dumps(env)
        else:
            text = env
        return agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=text,
            config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=timeout_s),
        )

    return build


def delete(*, env_id: str = "", serialized: str = "") -> Build:
    def build(t: Target) -> Request:
        if serialized:
            return agent_pb2.DeleteRuntimeEnvRequest(serialized_runtime_env=serialized)
        return agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id)

    return build


def wd(uri: object) -> dict[str, Any]:
    return {"working_dir": uri}


def many_vars(count: int, size: int) -> dict[str, Any]:
    return {"env_vars": {f"V{i}": "x" * size for i in range(count)}}


def case(case_id: str, build: Build, code: grpc.StatusCode, substring: str) -> Any:
    return pytest.param(build, code, substring, id=case_id)


CASES = [
    # -- the JSON document --
    case("json-invalid", create("{"), INVALID, "not valid JSON"),
    case("json-empty-string", create(""), INVALID, "serialized_runtime_env is empty"),
    case("json-whitespace-only", create("  \n "), INVALID, "serialized_runtime_env is empty"),
    case("json-array", create("[]"), INVALID, "must be a JSON object, got a list"),
    case("json-string", create('"working_dir"'), INVALID, "must be a JSON object, got a string"),
    case("json-null", create("null"), INVALID, "must be a JSON object, got null"),
    case("json-too-deep", create("[" * 100_000), INVALID, "not valid JSON"),
    case(
        "json-duplicate-key",
        create('{"env_vars": {}, "env_vars": {}}'),
        INVALID,
        "'env_vars' appears twice",
    ),
    case(
        "json-over-max-json-bytes",
        create("{" + " " * MAX_JSON_BYTES + "}"),
        INVALID,
        f"the limit is {MAX_JSON_BYTES}",
    ),
    # -- top-level fields --
    case(
        "field-unknown", create({"workdir": "x"}), INVALID, "unknown runtime_env field(s) 'workdir'"
    ),
    case("field-nsight-spelling", create({"nsight": "default"}), INVALID, "Ray spells 'nsight'"),
    *(
        case(f"field-{name}-needs-the-node", create({name: value}), PRECONDITION, needs)
        for name, value, needs in [
            ("conda", ["numpy"], "'conda' cannot be used on this node: it needs a conda install"),
            ("conda", "env", "'conda' cannot be used on this node: it needs a conda installation"),
            ("image_uri", "img:1", "'image_uri' cannot be used on this node: it needs a container"),
            ("container", {"image": "i"}, "'container' cannot be used on this node: it needs a"),
            ("_nsight", "default", "'_nsight' cannot be used on this node: it needs NVIDIA Nsight"),
            ("_rocprof_sys", {}, "'_rocprof_sys' cannot be used on this node: it needs ROCm's"),
        ]
    ),
    # -- py_executable, java_jars --
    case("py_executable-int", create({"py_executable": 3}), INVALID, "py_executable must be a"),
    case(
        "py_executable-too-long",
        create({"py_executable": "p" * 5000}),
        INVALID,
        "py_executable is 5000 characters long; the limit is 4096",
    ),
    case(
        "py_executable-newline",
        create({"py_executable": "python\nrm -rf /"}),
        INVALID,
        "contains a control character",
    ),
    case(
        "py_executable-unclosed-quote",
        create({"py_executable": "python '-X"}),
        INVALID,
        "not a command in shell words",
    ),
    case("java_jars-string", create({"java_jars": "file:///a.jar"}), INVALID, "java_jars must be"),
    case(
        "java_jars-tarball",
        create({"java_jars": ["file:///a.jar", "file:///b.tar"]}),
        INVALID,
        "java_jars[1] 'file:///b.tar': a java_jars URI names a .jar",
    ),
    # -- working_dir --
    case("working_dir-int", create(wd(42)), INVALID, "working_dir must be a URI string, got int"),
    case("working_dir-empty", create(wd("")), INVALID, "working_dir must not be empty"),
    case("working_dir-relative", create(wd("pkgs/a.zip")), INVALID, "relative and bare paths"),
    case("working_dir-bare-name", create(wd("a.zip")), INVALID, "relative and bare paths"),
    case("working_dir-absolute-path", create(wd("/p/a.zip")), INVALID, "relative and bare paths"),
    case(
        "working_dir-hdfs", create(wd("hdfs://nn/a.zip")), INVALID, "scheme 'hdfs' is not supported"
    ),
    case("working_dir-s3-no-key", create(wd("s3://bucket")), INVALID, "names an object's key"),
    case("working_dir-file-host", create(wd("file://host/p/a.zip")), INVALID, "not host 'host'"),
    case("working_dir-file-root", create(wd("file:///")), INVALID, "path must be absolute"),
    case("working_dir-file-query", create(wd("file:///p/a.zip?x=1")), INVALID, "takes no query"),
    case("working_dir-http-no-host", create(wd("http:///p/a.zip")), INVALID, "needs a host"),
    case("working_dir-bad-port", create(wd("http://h:99999/a.zip")), INVALID, "bad port"),
    case("working_dir-space", create(wd("file:///p/a b.zip")), INVALID, "whitespace or control"),
    case("uri-over-4096-chars", create(wd("file:///" + "a" * 5000)), INVALID, "the limit is 4096"),
    case("fragment-md5", create(wd("file:///p/a.zip#md5=abc")), INVALID, "#sha256=<64 hex digits>"),
    case(
        "fragment-sha256-short",
        create(wd("file:///p/a.zip#sha256=" + "a" * 63)),
        INVALID,
        "#sha256=<64 hex digits>",
    ),
    # -- py_modules --
    case(
        "py_modules-string",
        create({"py_modules": "file:///p/m.zip"}),
        INVALID,
        "py_modules must be a list of URIs, got a string",
    ),
    case(
        "py_modules-int-item",
        create({"py_modules": [7]}),
        INVALID,
        "py_modules[0] must be a URI string, got int",
    ),
    case(
        "py_modules-bad-second",
        create({"py_modules": ["file:///m.zip", "m.zip"]}),
        INVALID,
        "py_modules[1]",
    ),
    case(
        "too-many-uris",
        create({"py_modules": [f"file:///p/m{i}.zip" for i in range(MAX_URIS + 1)]}),
        INVALID,
        f"names {MAX_URIS + 1} distinct URIs; the limit is {MAX_URIS}",
    ),
    # -- env_vars --
    case(
        "env_vars-list",
        create({"env_vars": ["A=1"]}),
        INVALID,
        "env_vars must be an object of string to string, got a list",
    ),
    case(
        "env_vars-int-value",
        create({"env_vars": {"A": 1}}),
        INVALID,
        "env_vars['A'] must be a string, got int",
    ),
    case(
        "env_vars-name-with-equals",
        create({"env_vars": {"A=B": "1"}}),
        INVALID,
        "'A=B' is not a valid variable name",
    ),
    case(
        "env_vars-empty-name",
        create({"env_vars": {"": "1"}}),
        INVALID,
        "'' is not a valid variable name",
    ),
    case(
        "env_vars-nul-value",
        create({"env_vars": {"A": "x\x00y"}}),
        INVALID,
        "env_vars['A'] contains a NUL byte",
    ),
    case(
        "env_vars-value-over-128KiB",
        create({"env_vars": {"BIG": "x" * MAX_ARG_STRLEN}}),
        INVALID,
        f"env_vars['BIG'] is {MAX_ARG_STRLEN + 5} bytes as 'KEY=value'; "
        f"one variable may not exceed {MAX_ARG_STRLEN} bytes",
    ),
    case(
        "env_vars-total-over-limit",
        create(many_vars(5, 8000)),
        INVALID,
        f"the limit is {MAX_ENV_VAR_BYTES} bytes (max_env_var_bytes",
    ),
    # -- config --
    case("config-list", create({"config": []}), INVALID, "config must be an object, got a list"),
    case(
        "config-unknown-key",
        create({"config": {"retries": 3}}),
        INVALID,
        "unknown config field(s) 'retries'",
    ),
    case(
        "config-timeout-negative",
        create({"config": {"setup_timeout_seconds": -5}}),
        INVALID,
        "config.setup_timeout_seconds must be a positive integer",
    ),
    case("config-timeout-zero", create({"config": {"setup_timeout_seconds": 0}}), INVALID, "got 0"),
    case(
        "config-timeout-bool",
        create({"config": {"setup_timeout_seconds": True}}),
        INVALID,
        "got True",
    ),
    case(
        "config-timeout-float",
        create({"config": {"setup_timeout_seconds": 1.5}}),
        INVALID,
        "got 1.5",
    ),
    case(
        "config-timeout-string",
        create({"config": {"setup_timeout_seconds": "10"}}),
        INVALID,
        "got '10'",
    ),
    case(
        "config-eager-string",
        create({"config": {"eager_install": "yes"}}),
        INVALID,
        "config.eager_install must be a boolean",
    ),
    case(
        "request-config-timeout-below-minus-1",
        create("{}", timeout_s=-2),
        INVALID,
        "config.setup_timeout_seconds must be positive or -1, got -2",
    ),
    # -- lone UTF-16 surrogates (valid JSON escapes, not encodable text) --
    case("surrogate-env-var-value", create(r'{"env_vars": {"A": "\ud800"}}'), INVALID, "surrogate"),
    case("surrogate-env-var-name", create(r'{"env_vars": {"A\udc00": "1"}}'), INVALID, "surrogate"),
    case(
        "surrogate-working_dir",
        create(r'{"working_dir": "file:///p/\ud800.zip"}'),
        INVALID,
        "surrogate",
    ),
    case(
        "surrogate-py_modules",
        create(r'{"py_modules": ["file:///p/\udfff.zip"]}'),
        INVALID,
        "surrogate",
    ),
    case(
        "surrogate-delete-json",
        delete(serialized=r'{"env_vars": {"A": "\ud800"}}'),
        INVALID,
        "surrogate",
    ),
    # -- transport limit: refused by grpc before the agent sees it --
    case(
        "grpc-message-over-max",
        create(lambda t: "x" * (GRPC_MAX_MESSAGE + 1)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
    # -- delete --
    case("delete-names-nothing", delete(), INVALID, "set runtime_env_id or serialized_runtime_env"),
    case(
        "delete-unknown-id",
        delete(env_id="0" * 32),
        NOT_FOUND,
        f"runtime env {'0' * 32} is unknown",
    ),
    case("delete-malformed-json", delete(serialized="{nope"), INVALID, "not valid JSON"),
    case("delete-json-array", delete(serialized="[1]"), INVALID, "must be a JSON object"),
    case(
        "delete-never-created-env",
        delete(serialized=env_json(env_vars={"NEVER": "1"})),
        NOT_FOUND,
        "is unknown",
    ),
    # -- packages that cannot be installed --
    case(
        "file-uri-missing",
        create(lambda t: env_json(f"file://{t.files}/missing.zip")),
        NOT_FOUND,
        "no such file on this node",
    ),
    case(
        "file-uri-directory",
        create(lambda t: env_json(f"file://{t.files}/adir")),
        PRECONDITION,
        "is a directory; a package must be a zip file",
    ),
    case(
        "http-404",
        create(lambda t: env_json(f"{t.pkgs.base_url}/absent.zip")),
        NOT_FOUND,
        "the server answered 404",
    ),
    case(
        "http-403",
        create(lambda t: env_json(f"{t.pkgs.base_url}/forbidden.zip")),
        PRECONDITION,
        "the server answered 403",
    ),
    case(
        "http-body-not-a-zip",
        create(lambda t: env_json(f"{t.pkgs.base_url}/not-a-zip.zip")),
        PRECONDITION,
        "is not a readable zip archive",
    ),
    case(
        "http-jar-not-a-zip",
        create(lambda t: json.dumps({"java_jars": [f"{t.pkgs.base_url}/not-a-jar.jar"]})),
        PRECONDITION,
        "the download is not a jar: a jar is a zip archive",
    ),
    case(
        "http-sha256-mismatch",
        create(lambda t: env_json(f"{t.pkgs.base_url}/good.zip#sha256={ZERO_SHA}")),
        PRECONDITION,
        f"the URI expects {ZERO_SHA}",
    ),
]


async def call(a: RunningAgent, request: Request) -> Any:
    if isinstance(request, agent_pb2.CreateRuntimeEnvRequest):
        return await a.stub.CreateRuntimeEnv(request, timeout=30)
    return await a.stub.DeleteRuntimeEnv(request, timeout=30)


@pytest.mark.parametrize(("build", "code", "substring"), CASES)
async def test_malformed_request_gets_its_status_and_a_message_naming_the_problem(
    target: Target, build: Build, code: grpc.StatusCode, substring: str
) -> None:
    a = target.agent
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(a, build(target))
    error = caught.value
    assert (error.code(), substring in (error.details() or "")) == (code, True), error.details()
    info = await a.info()
    assert (info.total_envs, [u.uri for u in info.uris]) == (0, []), "the refusal left state"
    a.service.check_invariants()


@pytest.mark.parametrize("digits", [30, 400])
async def test_huge_setup_timeout_is_clamped_to_the_agent_maximum(
    target: Target, digits: int
) -> None:
    """A timeout too large for a float is clamped like any other, not an internal error."""
    a = target.agent
    huge = "1" + "0" * digits
    reply = await a.create(
        f'{{"env_vars": {{"T": "{digits}"}}, "config": {{"setup_timeout_seconds": {huge}}}}}'
    )
    assert await a.delete(reply.runtime_env_id) == 0


async def test_agent_still_serves_with_intact_state_after_the_bad_input(target: Target) -> None:
    """After every refusal above, a valid create works and is the only thing the agent holds."""
    a = target.agent
    good = f"{target.pkgs.base_url}/good.zip"
    reply = await a.create(env_json(good, env_vars={"OK": "1"}))
    assert reply.context.env_vars["OK"] == "1"
    assert (Path(reply.context.cwd) / "main.py").is_file()

    info = await a.info()
    assert info.total_envs == 1
    live = [(e.runtime_env_id, e.references, e.state) for e in info.envs if e.state != "failed"]
    assert live == [(reply.runtime_env_id, 1, "ready")]
    assert [e.references for e in info.envs if e.state == "failed"] == [
        0 for e in info.envs if e.state == "failed"
    ], "a failed create kept a reference"
    uris = [(u.kind, u.uri, u.references, u.state) for u in info.uris]
    assert uris == [("working_dir", good, 1, "ready")]
    a.service.check_invariants()
    await a.settle()  # staging of a failed install is removed in the background
    assert listed(a.root, "tmp") == [], "a failed install left staging files"

    assert await a.delete(reply.runtime_env_id) == 0
    info = await a.info()
    assert info.total_envs == 0
    assert [(u.references, u.state) for u in info.uris] == [(0, "unused")]
    a.service.check_invariants()
