from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GcsStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class InternalKVGetRequest(_message.Message):
    __slots__ = ("key", "namespace")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    namespace: bytes
    def __init__(self, key: _Optional[bytes] = ..., namespace: _Optional[bytes] = ...) -> None: ...

class InternalKVGetReply(_message.Message):
    __slots__ = ("status", "value")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    status: GcsStatus
    value: bytes
    def __init__(self, status: _Optional[_Union[GcsStatus, _Mapping]] = ..., value: _Optional[bytes] = ...) -> None: ...
