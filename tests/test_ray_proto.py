"""Ray's wire protocol, as this project writes it (proto/rtenv/ray/v1): the committed stubs are
what protoc makes of the .proto files, and every message has Ray 2.60's field numbers and types,
checked field by field against Ray's own generated descriptors when Ray is installed."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor

from rtenv.ray.v1 import gcs_kv_pb2, runtime_env_agent_pb2

REPO = Path(__file__).resolve().parents[1]
PROTOS = ("rtenv/ray/v1/runtime_env_agent.proto", "rtenv/ray/v1/gcs_kv.proto")
STUBS = (
    "runtime_env_agent_pb2.py", "runtime_env_agent_pb2.pyi", "gcs_kv_pb2.py", "gcs_kv_pb2.pyi",
)  # fmt: skip
REGENERATE = "python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. " + " ".join(
    f"proto/{p}" for p in PROTOS
)

# Ray's module and message for each of ours (ray.core.generated.<module>.<message>).
RAY_MESSAGES = {
    "GetOrCreateRuntimeEnvRequest": "runtime_env_agent_pb2",
    "GetOrCreateRuntimeEnvReply": "runtime_env_agent_pb2",
    "DeleteRuntimeEnvIfPossibleRequest": "runtime_env_agent_pb2",
    "DeleteRuntimeEnvIfPossibleReply": "runtime_env_agent_pb2",
    "GetRuntimeEnvsInfoRequest": "runtime_env_agent_pb2",
    "GetRuntimeEnvsInfoReply": "runtime_env_agent_pb2",
    "RuntimeEnvState": "runtime_env_common_pb2",
    "RuntimeEnvConfig": "runtime_environment_pb2",
    "InternalKVGetRequest": "gcs_service_pb2",
    "InternalKVGetReply": "gcs_service_pb2",
    "GcsStatus": "gcs_service_pb2",
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ray-stubs")
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={out}",
         f"--pyi_out={out}", *(f"proto/{p}" for p in PROTOS)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"protoc failed:\n{done.stderr}"
    return out / "rtenv" / "ray" / "v1"


@pytest.mark.parametrize("name", STUBS)
def test_committed_ray_stub_is_byte_for_byte_what_protoc_generates(
    generated: Path, name: str
) -> None:
    committed = (REPO / "rtenv" / "ray" / "v1" / name).read_bytes()
    assert committed == (generated / name).read_bytes(), (
        f"rtenv/ray/v1/{name} has drifted from its .proto; regenerate with:\n  {REGENERATE}"
    )


def _ours(name: str) -> descriptor.Descriptor:
    for module in (runtime_env_agent_pb2, gcs_kv_pb2):
        found: descriptor.Descriptor | None = module.DESCRIPTOR.message_types_by_name.get(name)
        if found is not None:
            return found
    raise AssertionError(f"{name} is in no proto of rtenv/ray/v1")


def _shape(message: descriptor.Descriptor) -> dict[str, tuple[int, int, bool, str]]:
    """name -> (number, wire type, repeated, message or enum type's short name)."""
    out = {}
    for f in message.fields:
        sub = f.message_type or f.enum_type
        out[f.name] = (f.number, f.type, f.is_repeated, sub.name if sub else "")
    return out


def _ray_module(name: str) -> ModuleType:
    pytest.importorskip("ray", reason="Ray (the test extra) is not installed")
    return importlib.import_module(f"ray.core.generated.{name}")


@pytest.mark.parametrize("message", sorted(RAY_MESSAGES))
def test_each_message_has_rays_field_names_numbers_and_types(message: str) -> None:
    ray_message = _ray_module(RAY_MESSAGES[message]).DESCRIPTOR.message_types_by_name[message]
    assert _shape(_ours(message)) == _shape(ray_message)


def test_the_status_enum_has_rays_values() -> None:
    ray_enum = _ray_module("runtime_env_agent_pb2").DESCRIPTOR.enum_types_by_name["AgentRpcStatus"]
    ours = runtime_env_agent_pb2.DESCRIPTOR.enum_types_by_name["AgentRpcStatus"]
    assert {v.name: v.number for v in ours.values} == {v.name: v.number for v in ray_enum.values}


def test_the_optional_fields_keep_presence_as_rays_do() -> None:
    """limit, success, error and creation_time_ms are proto3 ``optional``: unset differs from
    zero (Ray's agent reads ``HasField("limit")``)."""
    assert not runtime_env_agent_pb2.GetRuntimeEnvsInfoRequest().HasField("limit")
    assert runtime_env_agent_pb2.GetRuntimeEnvsInfoRequest(limit=0).HasField("limit")
    state = runtime_env_agent_pb2.RuntimeEnvState(success=False)
    assert state.HasField("success")
    assert not state.HasField("error")
