"""INTERNAL (or UNKNOWN) is unreachable from any input: generated JSON, URIs and archives are thrown
at ONE live agent process (real gRPC over its unix socket, started once for the module), and
every answer is OK or an expected status; afterwards the agent still answers health and info.

Packages come from a folder the module owns, as file:// URIs (an allowed root) and over a real
aiohttp server on 127.0.0.1. Generated hosts are loopback spellings or unparsable, and pip
specs are never valid, so nothing leaves the machine. Examples per test: RTENV_HYPOTHESIS_EXAMPLES
(default 25), e.g. ``RTENV_HYPOTHESIS_EXAMPLES=500 .venv/bin/pytest tests/test_no_internal.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtenv.v1 import agent_pb2, agent_pb2_grpc
from tests.harness.tempdirs import short_tempdir

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("RTENV_HYPOTHESIS_EXAMPLES", "25"))
BUGS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
START_S = 30.0
CALL_S = 30.0
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Target:
    stub: agent_pb2_grpc.RuntimeEnvAgentStub
    channel: grpc.Channel
    proc: subprocess.Popen[bytes]
    files: Path  # an allowed file root, also served over http
    http: str  # http://127.0.0.1:PORT
    log: Path

    def call(self, method: str, request: Any) -> tuple[grpc.StatusCode, str, Any]:
        """One RPC; the agent must answer it, with anything but a bug."""
        assert self.proc.poll() is None, f"the agent died:\n{self.log.read_text()[-3000:]}"
        try:
            reply = getattr(self.stub, method)(request, timeout=CALL_S)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            assert code not in BUGS, f"{method} answered {code.name}: {details}\n{request!r:.2000}"
            assert code is not grpc.StatusCode.DEADLINE_EXCEEDED or "setup" in details, details
            return code, details, None
        return grpc.StatusCode.OK, "", reply

    def create(self, text: str, request_id: str = "", timeout_s: int = 0) -> grpc.StatusCode:
        """Create; delete again what was created, so the agent ends as it began."""
        request = agent_pb2.CreateRuntimeEnvRequest(
            serialized_runtime_env=text,
            request_id=request_id,
            config=agent_pb2.RuntimeEnvConfig(setup_timeout_seconds=timeout_s),
        )
        code, _, reply = self.call("CreateRuntimeEnv", request)
        if reply is not None:
            delete = agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=reply.runtime_env_id)
            assert self.call("DeleteRuntimeEnv", delete)[0] is grpc.StatusCode.OK
        return code


class _Files:
    """A real aiohttp server on 127.0.0.1 serving the folder, in a thread with its own loop."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="files", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_static("/", self.folder)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> _Files:
        self._thread.start()
        assert self._ready.wait(START_S), "the file server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_S)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    base = short_tempdir()
    files = base / "files"
    files.mkdir()
    log = base / "agent.log"
    # pip never reaches an index: no generated spec is valid, and this makes sure of it
    env = dict(os.environ, PIP_NO_INDEX="1", HTTP_PROXY="http://127.0.0.1:9",
               HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")  # fmt: skip
    args = ["--root", str(base / "root"), "--allow-file-root", str(files)]
    args += ["--download-attempts", "1", "--default-setup-timeout", "20"]
    try:
        with _Files(files) as server, log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent", "serve", *args],
                stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=env,
            )  # fmt: skip
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline().decode().strip()  # bounded: the agent's own
                address = line.removeprefix("rtenv-agent serving on ")
                assert address != line, f"no serving line: {line!r}\n{log.read_text()}"
                with grpc.insecure_channel(address) as channel:
                    stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
                    yield Target(stub, channel, proc, files, f"http://127.0.0.1:{server.port}", log)
            finally:
                _stop(proc)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- JSON -------------------------------------------------------------------------------------

ODD_TEXT = st.text(st.characters(exclude_categories=[]), max_size=40)  # surrogates included
NUMBERS = st.one_of(
    st.integers(min_value=-(10**4000), max_value=10**4000),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, ODD_TEXT)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(ODD_TEXT, inner, max_size=5),
    max_leaves=20,
)
NOT_A_PIP_SPEC = st.one_of(  # each fails to parse: nothing is ever installed from an index
    SCALARS.filter(lambda v: not isinstance(v, str) or not v.strip()),
    st.lists(st.one_of(st.none(), st.booleans(), NUMBERS, st.just([])), min_size=1, max_size=3),
    st.fixed_dictionaries({"packages": st.integers() | st.none(), "pip_check": ANY_JSON}),
    st.fixed_dictionaries({"packages": st.just(["x"]), "bogus": ANY_JSON}),
)
ENV_OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "working_dir": ANY_JSON,
        "py_modules": ANY_JSON | st.lists(ANY_JSON, max_size=4),
        "env_vars": ANY_JSON | st.dictionaries(ODD_TEXT, ANY_JSON | ODD_TEXT, max_size=4),
        "pip": NOT_A_PIP_SPEC,
        "config": ANY_JSON
        | st.fixed_dictionaries(
            {}, optional={"setup_timeout_seconds": ANY_JSON, "eager_install": ANY_JSON}
        ),
        "conda": ANY_JSON,
        "py_executable": ANY_JSON | ODD_TEXT,
        "java_jars": ANY_JSON | st.lists(ANY_JSON, max_size=4),
    },
)


def _dumps(value: Any) -> str:
    return json.dumps(value)  # ensure_ascii: a lone surrogate travels as an escape


RAW_TEXT = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            '{"config": {"setup_timeout_seconds": 1' + "0" * 5000 + "}}",
            "[" * 100_000 + "]" * 100_000,
            '{"env_vars": {"A": "\\ud800"}}',
            '{"a": 1, "a": 2}',
            " " * 1000 + "{}",
            "NaN",
            '{"env_vars": {"K": "' + "v" * 140_000 + '"}}',
        ]
    ),
)
REQUEST_IDS = st.one_of(st.just(""), st.text(max_size=20), st.text(min_size=120, max_size=140))


@SETTINGS
@given(
    text=st.one_of(ENV_OBJECTS.map(_dumps), ANY_JSON.map(_dumps), RAW_TEXT),
    request_id=REQUEST_IDS,
    timeout_s=st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
def test_generated_json_is_never_answered_internal(
    target: Target, text: str, request_id: str, timeout_s: int
) -> None:
    target.create(text, request_id, timeout_s)
    delete = agent_pb2.DeleteRuntimeEnvRequest(serialized_runtime_env=text, request_id=request_id)
    target.call("DeleteRuntimeEnv", delete)


@SETTINGS
@given(env_id=st.one_of(st.text(max_size=80), st.text(min_size=1000, max_size=2000)))
def test_generated_env_ids_are_never_answered_internal(target: Target, env_id: str) -> None:
    code, _, _ = target.call(
        "DeleteRuntimeEnv", agent_pb2.DeleteRuntimeEnvRequest(runtime_env_id=env_id)
    )
    assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)


# -- URIs -------------------------------------------------------------------------------------

URI_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="#"), max_size=30)
ESCAPES = st.sampled_from(["%00", "%2e%2e", "%2F", "%zz", "%", "%c3%28", "%ff", "..", "//"])
PATHS = st.lists(st.one_of(URI_TEXT, ESCAPES), max_size=5).map("/".join)
# Loopback spellings, or hosts no parser accepts (a bracket, and nothing that would end the host
# before it): nothing is ever looked up, or reached, off this machine.
HOST_TEXT = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="/?#\\"), max_size=20
)
LOOPBACK = ["127.0.0.1", "localhost", "[::1]", "LOCALHOST", "127.0.0.1."]
HOSTS = st.one_of(
    st.sampled_from([*LOOPBACK, ""]),
    st.tuples(HOST_TEXT, st.sampled_from(["[", "]", "[:", "]:"])).map("".join),
)
OUR_PORT = ":{port}"  # filled in with the module's file server
PORTS = st.one_of(
    st.just(OUR_PORT),
    st.sampled_from([":", ":0", ":-1", ":65536", ":99999999", ": 1", ":1x", ":\u0663"]),
    HOST_TEXT.filter(lambda p: not p.isdigit()).map(lambda p: f":{p}"),
)
FRAGMENTS = st.one_of(st.just(""), st.just("#sha256=" + "0" * 64), URI_TEXT.map(lambda f: f"#{f}"))
SCHEMES = st.one_of(
    st.sampled_from(["file", "FILE", "ftp", "s3", "gs", "", "1x", "HTTP", "https"]),
    st.text("abcxyz+-.", min_size=1, max_size=6),
)


@st.composite
def uris(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["file", "http", "free"]))
    path, fragment = draw(PATHS), draw(FRAGMENTS)
    if kind == "file":
        host = draw(st.sampled_from(["", "localhost", "host", "{root}"]))
        return f"file://{host}/{path}{fragment}"
    if kind == "http":
        host, port = draw(HOSTS), draw(PORTS)
        if host in LOOPBACK and port == OUR_PORT:
            host = "127.0.0.1"  # the one server of ours; never a port someone else listens on
        query = draw(st.one_of(st.just(""), URI_TEXT.map(lambda q: f"?{q}")))
        return f"{draw(st.sampled_from(['http', 'https']))}://{host}{port}/{path}{query}{fragment}"
    scheme = draw(SCHEMES)
    slashes = ["", "/", "///"] if scheme.lower().startswith("http") else ["", "/", "//", "///"]
    return f"{scheme}:{draw(st.sampled_from(slashes))}{path}{fragment}"


@SETTINGS
@given(uri=uris(), field=st.sampled_from(["working_dir", "py_modules"]))
def test_generated_uris_are_never_answered_internal(target: Target, uri: str, field: str) -> None:
    port = target.http.rsplit(":", 1)[1]
    uri = uri.replace(OUR_PORT, f":{port}").replace("file://{root}/", f"file://{target.files}/")
    value: Any = uri if field == "working_dir" else [uri]
    target.create(json.dumps({field: value}), timeout_s=20)


# -- archives ---------------------------------------------------------------------------------

MODES = st.one_of(
    st.sampled_from([0o100644, 0o100755, 0o040755, 0o120777, 0o010644, 0o020644, 0o140644, 0]),
    st.integers(min_value=0, max_value=0xFFFF),
)
MEMBER_NAMES = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30),
    st.sampled_from(["../x", "/abs", "a/../../b", "a//b", "./", "a/", "\\win\\path", "C:/x",
                     "proj/../..", "proj/" + "d/" * 40 + "f", "x" * 300, "proj/\u202etxt.py"]),
)  # fmt: skip
MEMBERS = st.lists(
    st.tuples(
        MEMBER_NAMES, MODES, st.binary(max_size=64), st.sampled_from([zipfile.ZIP_STORED, 8])
    ),
    min_size=0,
    max_size=6,
)
DAMAGE = st.one_of(
    st.none(),
    st.tuples(st.just("cut"), st.integers(min_value=0, max_value=400)),
    st.tuples(st.just("flip"), st.integers(min_value=0, max_value=400), st.integers(0, 255)),
)


def _zip(members: list[tuple[str, int, bytes, int]], damage: Any) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are part of the point
        with zipfile.ZipFile(buf, "w") as zf:
            for name, mode, data, compression in members:
                info = zipfile.ZipInfo(name)
                info.external_attr = mode << 16
                info.compress_type = compression
                zf.writestr(info, data)
    body = bytearray(buf.getvalue())
    if damage is not None and damage[0] == "cut":
        del body[damage[1] :]
    elif damage is not None and body:
        body[damage[1] % len(body)] = damage[2]
    return bytes(body)


def _local_name_not_utf8(body: bytes) -> bool:
    """A member whose local header spells its name in bytes that are not
    UTF-8, under the UTF-8 flag (zipfile raises UnicodeDecodeError, not BadZipFile)."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            for info in zf.infolist():
                with zf.open(info):
                    pass
    except UnicodeDecodeError:
        return True
    except Exception:  # any other damage is for the agent to refuse
        return False
    return False


def local_name_not_utf8_zip() -> bytes:
    """One member, "proj/é.txt" (so the UTF-8 flag is set), whose local header's copy of the
    name has its sixth byte turned into 0x80; the central directory's copy is intact."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("proj/\u00e9.txt", b"x")
    body = bytearray(buf.getvalue())
    body[body.index("proj/\u00e9".encode()) + 5] = 0x80  # the local header comes first
    return bytes(body)


def test_a_zip_whose_local_name_is_not_utf8_is_refused_not_internal(target: Target) -> None:
    """Found by the property test: zipfile raised UnicodeDecodeError, answered INTERNAL."""
    body = local_name_not_utf8_zip()
    assert _local_name_not_utf8(body)
    (target.files / "known-bug.zip").write_bytes(body)
    uri = f"file://{target.files}/known-bug.zip"
    request = agent_pb2.CreateRuntimeEnvRequest(
        serialized_runtime_env=json.dumps({"working_dir": uri})
    )
    with pytest.raises(grpc.RpcError) as caught:
        target.stub.CreateRuntimeEnv(request, timeout=CALL_S)
    code = caught.value.code()
    assert code is grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()


@SETTINGS
@given(
    members=MEMBERS,
    damage=DAMAGE,
    how=st.sampled_from(["file", "http"]),
    field=st.sampled_from(["working_dir", "py_modules"]),
)
def test_generated_archives_are_never_answered_internal(
    target: Target, members: list[tuple[str, int, bytes, int]], damage: Any, how: str, field: str
) -> None:
    body = _zip(members, damage)
    name = hashlib.sha256(body).hexdigest()[:16] + ".zip"
    (target.files / name).write_bytes(body)
    uri = f"file://{target.files}/{name}" if how == "file" else f"{target.http}/{name}"
    value: Any = uri if field == "working_dir" else [uri]
    target.create(json.dumps({field: value}), timeout_s=20)


# -- afterwards -------------------------------------------------------------------------------


def test_zz_the_agent_still_answers_health_and_info_and_logged_no_bug(target: Target) -> None:
    """Runs last in the module (by name): the one agent took every example above and serves."""
    check = target.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    reply = check(health_pb2.HealthCheckRequest(), timeout=CALL_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    code, _, info = target.call("GetRuntimeEnvsInfo", agent_pb2.GetRuntimeEnvsInfoRequest())
    assert code is grpc.StatusCode.OK
    assert info.total_envs == 0, "every create above was deleted again"
    text = target.log.read_text(errors="replace")
    assert text.count("failed with a bug") == 0, text[-5000:]
    assert text.count("Traceback") == 0, text[-5000:]
