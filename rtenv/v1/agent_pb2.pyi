from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RuntimeEnvConfig(_message.Message):
    __slots__ = ("setup_timeout_seconds", "eager_install")
    SETUP_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EAGER_INSTALL_FIELD_NUMBER: _ClassVar[int]
    setup_timeout_seconds: int
    eager_install: bool
    def __init__(self, setup_timeout_seconds: _Optional[int] = ..., eager_install: _Optional[bool] = ...) -> None: ...

class CreateRuntimeEnvRequest(_message.Message):
    __slots__ = ("serialized_runtime_env", "config", "job_id", "request_id")
    SERIALIZED_RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    serialized_runtime_env: str
    config: RuntimeEnvConfig
    job_id: str
    request_id: str
    def __init__(self, serialized_runtime_env: _Optional[str] = ..., config: _Optional[_Union[RuntimeEnvConfig, _Mapping]] = ..., job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class RuntimeEnvContext(_message.Message):
    __slots__ = ("env_vars", "cwd", "py_executable", "java_jars")
    class EnvVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_VARS_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    PY_EXECUTABLE_FIELD_NUMBER: _ClassVar[int]
    JAVA_JARS_FIELD_NUMBER: _ClassVar[int]
    env_vars: _containers.ScalarMap[str, str]
    cwd: str
    py_executable: str
    java_jars: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_vars: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., py_executable: _Optional[str] = ..., java_jars: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateRuntimeEnvReply(_message.Message):
    __slots__ = ("runtime_env_id", "context", "uris")
    RUNTIME_ENV_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    URIS_FIELD_NUMBER: _ClassVar[int]
    runtime_env_id: str
    context: RuntimeEnvContext
    uris: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, runtime_env_id: _Optional[str] = ..., context: _Optional[_Union[RuntimeEnvContext, _Mapping]] = ..., uris: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteRuntimeEnvRequest(_message.Message):
    __slots__ = ("runtime_env_id", "serialized_runtime_env", "request_id")
    RUNTIME_ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    runtime_env_id: str
    serialized_runtime_env: str
    request_id: str
    def __init__(self, runtime_env_id: _Optional[str] = ..., serialized_runtime_env: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteRuntimeEnvReply(_message.Message):
    __slots__ = ("remaining_references",)
    REMAINING_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    remaining_references: int
    def __init__(self, remaining_references: _Optional[int] = ...) -> None: ...

class GetRuntimeEnvsInfoRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class RuntimeEnvInfo(_message.Message):
    __slots__ = ("runtime_env_id", "serialized_runtime_env", "references", "uris", "state", "error", "creation_time_ms", "job_ids", "eager_install")
    RUNTIME_ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    URIS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    EAGER_INSTALL_FIELD_NUMBER: _ClassVar[int]
    runtime_env_id: str
    serialized_runtime_env: str
    references: int
    uris: _containers.RepeatedScalarFieldContainer[str]
    state: str
    error: str
    creation_time_ms: int
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    eager_install: bool
    def __init__(self, runtime_env_id: _Optional[str] = ..., serialized_runtime_env: _Optional[str] = ..., references: _Optional[int] = ..., uris: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., creation_time_ms: _Optional[int] = ..., job_ids: _Optional[_Iterable[str]] = ..., eager_install: _Optional[bool] = ...) -> None: ...

class UriInfo(_message.Message):
    __slots__ = ("uri", "kind", "references", "state", "size_bytes", "last_used_ms", "local_path")
    URI_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_MS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PATH_FIELD_NUMBER: _ClassVar[int]
    uri: str
    kind: str
    references: int
    state: str
    size_bytes: int
    last_used_ms: int
    local_path: str
    def __init__(self, uri: _Optional[str] = ..., kind: _Optional[str] = ..., references: _Optional[int] = ..., state: _Optional[str] = ..., size_bytes: _Optional[int] = ..., last_used_ms: _Optional[int] = ..., local_path: _Optional[str] = ...) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("used_bytes", "unused_bytes", "budget_bytes", "downloads", "evictions", "hits", "extractions")
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNUSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DOWNLOADS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EXTRACTIONS_FIELD_NUMBER: _ClassVar[int]
    used_bytes: int
    unused_bytes: int
    budget_bytes: int
    downloads: int
    evictions: int
    hits: int
    extractions: int
    def __init__(self, used_bytes: _Optional[int] = ..., unused_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., downloads: _Optional[int] = ..., evictions: _Optional[int] = ..., hits: _Optional[int] = ..., extractions: _Optional[int] = ...) -> None: ...

class RecoverySummary(_message.Message):
    __slots__ = ("rows_kept", "rows_dropped", "orphans_deleted", "bytes_freed", "envs_forgotten", "seconds")
    ROWS_KEPT_FIELD_NUMBER: _ClassVar[int]
    ROWS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ORPHANS_DELETED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    ENVS_FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    rows_kept: int
    rows_dropped: int
    orphans_deleted: int
    bytes_freed: int
    envs_forgotten: int
    seconds: float
    def __init__(self, rows_kept: _Optional[int] = ..., rows_dropped: _Optional[int] = ..., orphans_deleted: _Optional[int] = ..., bytes_freed: _Optional[int] = ..., envs_forgotten: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetRuntimeEnvsInfoReply(_message.Message):
    __slots__ = ("envs", "uris", "cache", "total_envs", "recovery", "total_uris", "builds")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    URIS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ENVS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_URIS_FIELD_NUMBER: _ClassVar[int]
    BUILDS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[RuntimeEnvInfo]
    uris: _containers.RepeatedCompositeFieldContainer[UriInfo]
    cache: CacheStats
    total_envs: int
    recovery: RecoverySummary
    total_uris: int
    builds: _containers.RepeatedCompositeFieldContainer[BuildInfo]
    def __init__(self, envs: _Optional[_Iterable[_Union[RuntimeEnvInfo, _Mapping]]] = ..., uris: _Optional[_Iterable[_Union[UriInfo, _Mapping]]] = ..., cache: _Optional[_Union[CacheStats, _Mapping]] = ..., total_envs: _Optional[int] = ..., recovery: _Optional[_Union[RecoverySummary, _Mapping]] = ..., total_uris: _Optional[int] = ..., builds: _Optional[_Iterable[_Union[BuildInfo, _Mapping]]] = ...) -> None: ...

class BuildInfo(_message.Message):
    __slots__ = ("uri", "kind", "elapsed_seconds", "bytes_so_far", "env_ids", "job_ids", "kept", "queued")
    URI_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SO_FAR_FIELD_NUMBER: _ClassVar[int]
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    uri: str
    kind: str
    elapsed_seconds: float
    bytes_so_far: int
    env_ids: _containers.RepeatedScalarFieldContainer[str]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    kept: bool
    queued: bool
    def __init__(self, uri: _Optional[str] = ..., kind: _Optional[str] = ..., elapsed_seconds: _Optional[float] = ..., bytes_so_far: _Optional[int] = ..., env_ids: _Optional[_Iterable[str]] = ..., job_ids: _Optional[_Iterable[str]] = ..., kept: _Optional[bool] = ..., queued: _Optional[bool] = ...) -> None: ...
