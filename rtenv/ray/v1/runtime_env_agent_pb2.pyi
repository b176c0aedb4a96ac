from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentRpcStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_RPC_STATUS_OK: _ClassVar[AgentRpcStatus]
    AGENT_RPC_STATUS_FAILED: _ClassVar[AgentRpcStatus]
AGENT_RPC_STATUS_OK: AgentRpcStatus
AGENT_RPC_STATUS_FAILED: AgentRpcStatus

class RuntimeEnvConfig(_message.Message):
    __slots__ = ("setup_timeout_seconds", "eager_install", "log_files")
    SETUP_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EAGER_INSTALL_FIELD_NUMBER: _ClassVar[int]
    LOG_FILES_FIELD_NUMBER: _ClassVar[int]
    setup_timeout_seconds: int
    eager_install: bool
    log_files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, setup_timeout_seconds: _Optional[int] = ..., eager_install: _Optional[bool] = ..., log_files: _Optional[_Iterable[str]] = ...) -> None: ...

class GetOrCreateRuntimeEnvRequest(_message.Message):
    __slots__ = ("serialized_runtime_env", "runtime_env_config", "job_id", "source_process")
    SERIALIZED_RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_CONFIG_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PROCESS_FIELD_NUMBER: _ClassVar[int]
    serialized_runtime_env: str
    runtime_env_config: RuntimeEnvConfig
    job_id: bytes
    source_process: str
    def __init__(self, serialized_runtime_env: _Optional[str] = ..., runtime_env_config: _Optional[_Union[RuntimeEnvConfig, _Mapping]] = ..., job_id: _Optional[bytes] = ..., source_process: _Optional[str] = ...) -> None: ...

class GetOrCreateRuntimeEnvReply(_message.Message):
    __slots__ = ("status", "error_message", "serialized_runtime_env_context")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_RUNTIME_ENV_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    status: AgentRpcStatus
    error_message: str
    serialized_runtime_env_context: str
    def __init__(self, status: _Optional[_Union[AgentRpcStatus, str]] = ..., error_message: _Optional[str] = ..., serialized_runtime_env_context: _Optional[str] = ...) -> None: ...

class DeleteRuntimeEnvIfPossibleRequest(_message.Message):
    __slots__ = ("serialized_runtime_env", "source_process")
    SERIALIZED_RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    SOURCE_PROCESS_FIELD_NUMBER: _ClassVar[int]
    serialized_runtime_env: str
    source_process: str
    def __init__(self, serialized_runtime_env: _Optional[str] = ..., source_process: _Optional[str] = ...) -> None: ...

class DeleteRuntimeEnvIfPossibleReply(_message.Message):
    __slots__ = ("status", "error_message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: AgentRpcStatus
    error_message: str
    def __init__(self, status: _Optional[_Union[AgentRpcStatus, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class GetRuntimeEnvsInfoRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class RuntimeEnvState(_message.Message):
    __slots__ = ("runtime_env", "ref_cnt", "success", "error", "creation_time_ms")
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    REF_CNT_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    runtime_env: str
    ref_cnt: int
    success: bool
    error: str
    creation_time_ms: int
    def __init__(self, runtime_env: _Optional[str] = ..., ref_cnt: _Optional[int] = ..., success: _Optional[bool] = ..., error: _Optional[str] = ..., creation_time_ms: _Optional[int] = ...) -> None: ...

class GetRuntimeEnvsInfoReply(_message.Message):
    __slots__ = ("runtime_env_states", "total")
    RUNTIME_ENV_STATES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    runtime_env_states: _containers.RepeatedCompositeFieldContainer[RuntimeEnvState]
    total: int
    def __init__(self, runtime_env_states: _Optional[_Iterable[_Union[RuntimeEnvState, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...
