"""The committed stubs are exactly what protoc makes of the .proto, and the .proto keeps the names
and field numbers of the first published protocol (v1, as ``CONTRACT`` below lists them): clients
written from it must keep working."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool

REPO = Path(__file__).resolve().parents[1]
PROTO = "rtenv/v1/agent.proto"
STUBS = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")
REGENERATE = (
    "python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. "
    f"proto/{PROTO}  (run from the repository root, with the grpcio-tools pyproject.toml pins)"
)


def protoc(*args: str) -> None:
    """Run grpc_tools.protoc on the .proto from the repository root (bounded)."""
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", *args, f"proto/{PROTO}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"protoc failed:\n{done.stderr}"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stubs")
    protoc(f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}")
    return out / "rtenv" / "v1"


@pytest.fixture(scope="module")
def proto_file(tmp_path_factory: pytest.TempPathFactory) -> descriptor.FileDescriptor:
    """The .proto itself, compiled by protoc into a fresh pool (not the committed stubs)."""
    out = tmp_path_factory.mktemp("descriptors") / "set.pb"
    protoc(f"--descriptor_set_out={out}")
    file_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    files = [pool.AddSerializedFile(f.SerializeToString()) for f in file_set.file]
    return files[-1]


def test_installed_grpcio_tools_is_the_version_pyproject_pins() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [d for d in project["project"]["optional-dependencies"]["dev"] if "grpcio-tools" in d]
    assert pins == [f"grpcio-tools=={metadata.version('grpcio-tools')}"], (
        f"the drift test regenerates with the installed grpcio-tools "
        f"{metadata.version('grpcio-tools')}, but pyproject.toml pins {pins}; install the pin"
    )


@pytest.mark.parametrize("name", STUBS)
def test_committed_stub_is_byte_for_byte_what_protoc_generates(generated: Path, name: str) -> None:
    committed = (REPO / "rtenv" / "v1" / name).read_bytes()
    fresh = (generated / name).read_bytes()
    assert committed == fresh, (
        f"rtenv/v1/{name} has drifted from proto/{PROTO}; regenerate the stubs with:\n"
        f"  {REGENERATE}"
    )


_TYPES = {
    descriptor.FieldDescriptor.TYPE_STRING: "string",
    descriptor.FieldDescriptor.TYPE_INT32: "int32",
    descriptor.FieldDescriptor.TYPE_INT64: "int64",
    descriptor.FieldDescriptor.TYPE_BOOL: "bool",
}

# The first published protocol (v1): message -> field -> (number, type). Fields may be added, never
# renumbered or retyped; so every one listed here must be present as listed (an added field is
# listed once published, marked with when).
CONTRACT: dict[str, dict[str, tuple[int, str]]] = {
    "RuntimeEnvConfig": {"setup_timeout_seconds": (1, "int32"), "eager_install": (2, "bool")},
    "CreateRuntimeEnvRequest": {
        "serialized_runtime_env": (1, "string"),
        "config": (2, "RuntimeEnvConfig"),
        "job_id": (3, "string"),
        "request_id": (4, "string"),
    },
    "RuntimeEnvContext": {
        "env_vars": (1, "map<string,string>"),
        "cwd": (2, "string"),
        "py_executable": (3, "string"),
        # added later (issue 18): pinned from then on
        "java_jars": (4, "repeated string"),
    },
    "CreateRuntimeEnvReply": {
        "runtime_env_id": (1, "string"),
        "context": (2, "RuntimeEnvContext"),
        "uris": (3, "repeated string"),
    },
    "DeleteRuntimeEnvRequest": {
        "runtime_env_id": (1, "string"),
        "serialized_runtime_env": (2, "string"),
        "request_id": (3, "string"),
    },
    "DeleteRuntimeEnvReply": {"remaining_references": (1, "int64")},
    "GetRuntimeEnvsInfoRequest": {"limit": (1, "int64")},
    "RuntimeEnvInfo": {
        "runtime_env_id": (1, "string"),
        "serialized_runtime_env": (2, "string"),
        "references": (3, "int64"),
        "uris": (4, "repeated string"),
        "state": (5, "string"),
        "error": (6, "string"),
        "creation_time_ms": (7, "int64"),
        # added later (issue 14): pinned from then on
        "job_ids": (8, "repeated string"),
        "eager_install": (9, "bool"),
    },
    "UriInfo": {
        "uri": (1, "string"),
        "kind": (2, "string"),
        "references": (3, "int64"),
        "state": (4, "string"),
        "size_bytes": (5, "int64"),
        "last_used_ms": (6, "int64"),
        "local_path": (7, "string"),
    },
    "CacheStats": {
        "used_bytes": (1, "int64"),
        "unused_bytes": (2, "int64"),
        "budget_bytes": (3, "int64"),
        "downloads": (4, "int64"),
        "evictions": (5, "int64"),
        "hits": (6, "int64"),
    },
    "GetRuntimeEnvsInfoReply": {
        "envs": (1, "repeated RuntimeEnvInfo"),
        "uris": (2, "repeated UriInfo"),
        "cache": (3, "CacheStats"),
        "total_envs": (4, "int64"),
    },
}


def _type_of(field: descriptor.FieldDescriptor) -> str:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = (_type_of(message.fields_by_name[n]) for n in ("key", "value"))
        return f"map<{key},{value}>"
    base = message.name if message is not None else _TYPES.get(field.type, str(field.type))
    return f"repeated {base}" if field.is_repeated else base


@pytest.mark.parametrize("message", sorted(CONTRACT))
def test_proto_message_keeps_the_field_numbers_and_types_design_md_fixes(
    proto_file: descriptor.FileDescriptor, message: str
) -> None:
    assert proto_file.package == "rtenv.v1"
    fields = proto_file.message_types_by_name[message].fields_by_name
    actual = {
        name: (fields[name].number, _type_of(fields[name])) if name in fields else None
        for name in CONTRACT[message]
    }
    assert actual == CONTRACT[message]


def test_delete_request_names_the_env_by_the_oneof_env(
    proto_file: descriptor.FileDescriptor,
) -> None:
    request = proto_file.message_types_by_name["DeleteRuntimeEnvRequest"]
    oneof = request.oneofs_by_name["env"]
    assert [f.name for f in oneof.fields] == ["runtime_env_id", "serialized_runtime_env"]
    assert request.fields_by_name["request_id"].containing_oneof is None


def test_service_keeps_its_name_methods_and_message_types(
    proto_file: descriptor.FileDescriptor,
) -> None:
    service = proto_file.services_by_name["RuntimeEnvAgent"]
    assert service.full_name == "rtenv.v1.RuntimeEnvAgent"
    methods = {
        m.name: (
            m.input_type.full_name,
            m.output_type.full_name,
            m.client_streaming or m.server_streaming,
        )
        for m in service.methods
    }
    assert methods == {
        "CreateRuntimeEnv": (
            "rtenv.v1.CreateRuntimeEnvRequest",
            "rtenv.v1.CreateRuntimeEnvReply",
            False,
        ),
        "DeleteRuntimeEnv": (
            "rtenv.v1.DeleteRuntimeEnvRequest",
            "rtenv.v1.DeleteRuntimeEnvReply",
            False,
        ),
        "GetRuntimeEnvsInfo": (
            "rtenv.v1.GetRuntimeEnvsInfoRequest",
            "rtenv.v1.GetRuntimeEnvsInfoReply",
            False,
        ),
    }
