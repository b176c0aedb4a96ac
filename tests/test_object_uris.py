"""Pure parts of the object stores: their URIs (``object_uris`` through ``parse_uri``), the
clients' settings from the environment and the AWS files (``object_config``), how obstore's
errors are worded (``object_source._outcome``), and the fetcher's bounds on a body, driven by a
stand-in store."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

from agent.core.errors import (
    DownloadFailed,
    InvalidRuntimeEnv,
    ObjectStoreSetup,
    PackageNotFound,
    PackageRejected,
    PermissionDenied,
)
from agent.core.object_uris import ObjectLocation, locate
from agent.core.uris import parse_uri
from agent.install.fetch.base import FetchLimits
from agent.install.fetch.fetcher import Fetcher
from agent.install.fetch.object_config import (
    aws_files,
    azure_settings,
    gcs_settings,
    parse_connection_string,
    s3_settings,
)
from agent.install.fetch.object_source import ObjectRead, ObjectStores, ObjectUnavailable, _outcome
from agent.install.fetch.transport import MockTransport, Request, Response

DIGEST = "ab" * 32

# -- URIs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "where"),
    [
        ("s3://my-bucket/jobs/wd.zip", ObjectLocation("s3", "my-bucket", "jobs/wd.zip")),
        ("S3://b.example.com/a.zip", ObjectLocation("s3", "b.example.com", "a.zip")),
        ("gs://my_bucket/deep/k/wd.zip", ObjectLocation("gs", "my_bucket", "deep/k/wd.zip")),
        (
            "azure://pkgs@acct01.blob.core.windows.net/jobs/wd.zip",
            ObjectLocation("azure", "pkgs", "jobs/wd.zip", "acct01"),
        ),
        ("azure://pkgs/jobs/wd.zip", ObjectLocation("azure", "pkgs", "jobs/wd.zip", None)),
        (
            "abfss://fs-1@acct01.dfs.core.windows.net/dir/m.zip",
            ObjectLocation("abfss", "fs-1", "dir/m.zip", "acct01"),
        ),
    ],
)
def test_object_store_uris_parse_to_their_bucket_key_and_account(
    uri: str, where: ObjectLocation
) -> None:
    parsed = parse_uri("working_dir", f"{uri}#sha256={DIGEST}")
    assert (parsed.scheme, parsed.path, parsed.sha256) == (where.scheme, where.key, DIGEST)
    assert locate(parsed.url) == where


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("s3://", "names its bucket"),
        ("s3://bucket", "names an object's key"),
        ("s3://bucket/", "names an object's key"),
        ("s3://Bucket/k.zip", "not an S3 bucket name"),
        ("s3://ab/k.zip", "not an S3 bucket name"),
        ("s3://a..b/k.zip", "not an S3 bucket name"),
        ("s3://192.168.1.2/k.zip", "not an IP address"),
        ("s3://b-/k.zip", "not an S3 bucket name"),
        ("s3://user@bucket/k.zip", "takes no user info"),
        ("s3://bucket:9000/k.zip", "AWS_ENDPOINT_URL"),
        ("s3://bucket/k.zip?versionId=3", "takes no query"),
        ("s3://bucket/a//k.zip", "empty, '.' or '..' segment"),
        ("s3://bucket/a/../k.zip", "empty, '.' or '..' segment"),
        ("s3://bucket/k.zip/", "empty, '.' or '..' segment"),
        ("s3://bucket/" + "k" * 1025, "the limit is 1024"),
        ("s3://bucket/k.zip#md5=1", "#sha256=<64 hex digits>"),
        ("s3://bucket/k.whl", "wheel"),
        ("gcs://bucket/k.zip", "a Google Cloud Storage object is gs://<bucket>/<key>"),
        ("gs://UPPER/k.zip", "not a Google Cloud Storage bucket name"),
        ("gs://" + "a" * 64 + "/k.zip", "not a Google Cloud Storage bucket name"),
        ("gs://_lead/k.zip", "not a Google Cloud Storage bucket name"),
        ("gs://bucket:1/k.zip", "takes no port"),
        ("azure:///k.zip", "names its container"),
        ("azure://Pkgs@acct.blob.core.windows.net/k.zip", "not an Azure container name"),
        ("azure://a--b@acct.blob.core.windows.net/k.zip", "not an Azure container name"),
        ("azure://pkgs@acct.example.com/k.zip", "is not an Azure storage account's"),
        ("azure://pkgs@ACCT.blob.core.windows.net/k.zip", "not an Azure storage account name"),
        ("azure://pkgs@acct.blob.core.windows.net", "names an object's key"),
        ("abfss://pkgs/k.zip", "names its container and account"),
        ("abfss://pkgs@acct.blob.core.windows.net/k.zip", "<account>.dfs.core.windows.net"),
    ],
)
def test_bad_object_store_uris_are_refused_saying_what_is_wrong(uri: str, needle: str) -> None:
    with pytest.raises(InvalidRuntimeEnv) as info:
        parse_uri("py_modules[0]", uri)
    assert info.value.message.startswith("py_modules[0]")
    assert needle in info.value.message


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["s3://", "gs://", "azure://", "abfss://", "AZURE://"]),
    st.text(alphabet=st.sampled_from("ab1-_.@/:?#%Z\u00e9"), max_size=40),
)
def test_any_object_store_uri_is_accepted_and_located_or_refused_as_invalid(
    prefix: str, rest: str
) -> None:
    """Whatever follows the scheme: an InvalidRuntimeEnv, or a URI whose location's key is the
    parsed path and whose bucket is non-empty."""
    try:
        parsed = parse_uri("working_dir", prefix + rest)
    except InvalidRuntimeEnv:
        return
    where = locate(parsed.url)
    assert (where.key, where.scheme) == (parsed.path, parsed.scheme)
    assert where.bucket
    assert where.key
    assert not where.key.startswith("/")


# -- settings ---------------------------------------------------------------------------------

CREDENTIALS = """
[default]
aws_access_key_id = AKIDEFAULT
aws_secret_access_key = default-secret

[ci]
aws_access_key_id = AKICI
aws_secret_access_key = ci-secret
aws_session_token = ci-token
"""
CONFIG = """
[default]
region = eu-west-1

[profile ci]
region = ap-south-1
endpoint_url = http://127.0.0.1:9000
"""


def test_the_aws_files_are_found_as_the_aws_tools_find_them() -> None:
    assert aws_files({"HOME": "/home/u"}) == ("/home/u/.aws/credentials", "/home/u/.aws/config")
    env = {"HOME": "/h", "AWS_SHARED_CREDENTIALS_FILE": "/c", "AWS_CONFIG_FILE": "/f"}
    assert aws_files(env) == ("/c", "/f")


def test_a_profile_gives_keys_region_and_endpoint_that_the_environment_does_not() -> None:
    ci = s3_settings({"AWS_PROFILE": "ci"}, CREDENTIALS, CONFIG)
    assert ci.as_dict() == {
        "access_key_id": "AKICI", "secret_access_key": "ci-secret", "session_token": "ci-token",
        "region": "ap-south-1", "endpoint": "http://127.0.0.1:9000",
    }  # fmt: skip
    assert ci.allow_http  # an http:// endpoint
    default = s3_settings({}, CREDENTIALS, CONFIG)
    assert default.as_dict() == {
        "access_key_id": "AKIDEFAULT", "secret_access_key": "default-secret",
        "region": "eu-west-1",
    }  # fmt: skip
    assert not default.allow_http


def test_the_environment_wins_over_the_files_and_the_s3_endpoint_over_the_general_one() -> None:
    env = {
        "AWS_PROFILE": "ci", "AWS_ACCESS_KEY_ID": "AKIENV", "AWS_REGION": "us-west-2",
        "AWS_ENDPOINT_URL": "https://general.example", "AWS_ENDPOINT_URL_S3": "https://s3.example",
    }  # fmt: skip
    assert s3_settings(env, CREDENTIALS, CONFIG).as_dict() == {"endpoint": "https://s3.example"}
    general = {"AWS_ENDPOINT_URL": "http://127.0.0.1:4566"}
    settings = s3_settings(general, None, None)
    assert (settings.as_dict(), settings.allow_http) == (
        {"endpoint": "http://127.0.0.1:4566"},
        True,
    )


def test_a_profile_no_file_holds_and_a_broken_file_are_setup_errors_naming_the_file() -> None:
    with pytest.raises(
        ObjectStoreSetup, match=r"profile 'nope', which neither /h/\.aws/credentials"
    ):
        s3_settings({"HOME": "/h", "AWS_PROFILE": "nope"}, CREDENTIALS, CONFIG)
    with pytest.raises(ObjectStoreSetup, match=r"/h/\.aws/credentials is not a valid AWS ini file"):
        s3_settings({"HOME": "/h"}, "aws_access_key_id = x\n", None)
    assert s3_settings({}, None, None).as_dict() == {}  # no files, no profile named: none


def test_storage_emulator_host_points_gcs_at_an_emulator_unsigned_unless_a_token_is_set() -> None:
    bare = gcs_settings({"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert bare.as_dict() == {"base_url": "http://127.0.0.1:4443", "skip_signature": True}
    assert bare.allow_http
    signed = gcs_settings({"STORAGE_EMULATOR_HOST": "http://h:1/", "GOOGLE_BEARER_TOKEN": "t"})
    assert signed.as_dict() == {"base_url": "http://h:1"}
    assert gcs_settings({}).as_dict() == {}  # obstore's own GOOGLE_* variables
    assert gcs_settings({"GOOGLE_BASE_URL": "http://127.0.0.1:1"}).allow_http


def test_azure_takes_the_uris_account_then_the_environments_then_a_connection_string() -> None:
    assert azure_settings({"AZURE_STORAGE_ACCOUNT_NAME": "envacct"}, "uriacct").as_dict() == {
        "account_name": "uriacct"
    }
    assert azure_settings({"AZURE_STORAGE_ACCOUNT": "rayacct"}, None).as_dict() == {
        "account_name": "rayacct"
    }
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5==;"
        "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    )
    settings = azure_settings({"AZURE_STORAGE_CONNECTION_STRING": conn}, None)
    assert settings.as_dict() == {
        "account_name": "devstoreaccount1", "account_key": "a2V5==",
        "endpoint": "http://127.0.0.1:10000/devstoreaccount1",
    }  # fmt: skip
    assert settings.allow_http
    emulator = azure_settings({"AZURE_STORAGE_USE_EMULATOR": "true"}, None)
    assert (emulator.as_dict(), emulator.allow_http) == ({"use_emulator": True}, True)
    with pytest.raises(ObjectStoreSetup, match="no Azure storage account"):
        azure_settings({}, None)


def test_a_connection_string_is_its_pairs_and_a_malformed_one_is_a_setup_error() -> None:
    assert parse_connection_string("AccountName=a;SharedAccessSignature=sv=1&sig=x==;") == {
        "accountname": "a", "sharedaccesssignature": "sv=1&sig=x==",
    }  # fmt: skip
    with pytest.raises(ObjectStoreSetup, match="not a list of Key=value pairs"):
        parse_connection_string("AccountName=a;garbage")


# -- obstore's errors -------------------------------------------------------------------------

S3 = ObjectLocation("s3", "pkgs", "jobs/wd.zip")


@pytest.mark.parametrize(
    ("error", "outcome", "needle"),
    [
        (FileNotFoundError("... 404 Not Found: <Code>NoSuchKey</Code>"), PackageNotFound,
         "S3 has no object 'jobs/wd.zip' in bucket 'pkgs' (NoSuchKey)"),
        (PermissionDeniedError("403 Forbidden: <Code>InvalidAccessKeyId</Code>"),
         PermissionDenied, "credentials for bucket 'pkgs' (InvalidAccessKeyId)"),
        (UnauthenticatedError("401"), PermissionDenied, "AWS_PROFILE"),
        (GenericError("Server returned non-2xx status code: 503 Service Unavailable"),
         ObjectUnavailable, "S3 answered 503"),
        (GenericError("Server returned non-2xx status code: 429 Too Many Requests"),
         ObjectUnavailable, "S3 answered 429"),
        (GenericError("Server returned non-2xx status code: 400: <Code>InvalidRequest</Code>"),
         PackageRejected, "S3 answered 400 (InvalidRequest)"),
        (GenericError("Generic S3 error: HTTP error: request or response body error"),
         ObjectUnavailable, "body error"),
        (GenericError("Generic S3 error: Missing bucket name"), PackageRejected, "Missing bucket"),
        (GenericError("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/"
                      "token in 1ms - HTTP error: error sending request"), ObjectStoreSetup,
         "no S3 credentials"),
    ],
)  # fmt: skip
def test_obstores_errors_are_worded_final_or_worth_another_try(
    error: Exception, outcome: type[Exception], needle: str
) -> None:
    worded = _outcome(error, S3, "working_dir:s3://pkgs/jobs/wd.zip")
    assert type(worded) is outcome
    assert needle in str(worded)


# -- the fetcher's bounds on a body, from a stand-in store ------------------------------------


class _Store(ObjectStores):
    """Declares ``size`` and sends ``body`` (in 4 KiB chunks), whatever it declared."""

    def __init__(self, size: int, body: bytes) -> None:
        super().__init__(object(), connect_timeout_s=1, read_timeout_s=1)  # type: ignore[arg-type]
        self.size, self.body, self.gets = size, body, 0

    async def open(self, url: str, label: str, chunk_bytes: int) -> ObjectRead:
        self.gets += 1

        async def chunks() -> AsyncGenerator[memoryview, None]:
            for start in range(0, len(self.body), 4096):
                yield memoryview(self.body[start : start + 4096])

        return ObjectRead(self.size, chunks())


async def _no_wait(delay: float) -> None:
    pass


async def test_a_body_past_the_limit_is_refused_by_the_bytes_read_not_the_size_declared(
    tmp_path: Path,
) -> None:
    store = _Store(size=100, body=b"x" * 20_000)
    fetcher = Fetcher(_no_transport(), FetchLimits(max_download_bytes=10_000), objects=store)
    uri = parse_uri("working_dir", "s3://pkgs/a.zip")
    with pytest.raises(PackageRejected, match="is larger than 10000 bytes; the limit is 10000"):
        await fetcher.fetch(uri, tmp_path / "a.zip", label="wd")
    assert (tmp_path / "a.zip").stat().st_size <= 10_000


async def test_a_body_shorter_than_declared_is_retried_then_unavailable(tmp_path: Path) -> None:
    store = _Store(size=10_000, body=b"x" * 5000)
    limits = FetchLimits(attempts=3)
    fetcher = Fetcher(_no_transport(), limits, objects=store, sleep=_no_wait)
    uri = parse_uri("working_dir", "s3://pkgs/a.zip")
    with pytest.raises(DownloadFailed, match="after 3 attempts: body ended after 5000 of 10000"):
        await fetcher.fetch(uri, tmp_path / "a.zip", label="wd")
    assert store.gets == 3


def _no_transport() -> MockTransport:
    def refuse(request: Request) -> Response:
        raise AssertionError(f"no http request expected: {request.url}")

    return MockTransport(refuse)
