"""How the agent reaches an object store: the settings of one bucket's client, from the agent's
environment and, for S3, the AWS files. Pure: the environment and the files' text are given.

obstore reads each cloud's standard variables itself (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``:
keys, tokens, regions, endpoints); this module adds what it does not read, as each cloud's
own tools do:

- S3: ``AWS_PROFILE`` (else ``default``) in ``~/.aws/credentials`` and ``~/.aws/config``
  (``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``): its keys when the environment has no
  ``AWS_ACCESS_KEY_ID``, its ``region`` when there is no ``AWS_REGION`` nor
  ``AWS_DEFAULT_REGION``, its ``endpoint_url`` when no variable names one. The endpoint is
  ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL`` (as boto3 orders them), else obstore's
  ``AWS_ENDPOINT``, else the profile's; an ``http://`` endpoint is allowed plain HTTP.
- GCS: ``STORAGE_EMULATOR_HOST`` (the variable Google's client libraries honour) points the
  client at an emulator, whose requests are unsigned (as those libraries send them) unless
  ``GOOGLE_BEARER_TOKEN`` is set; else obstore's own ``GOOGLE_APPLICATION_CREDENTIALS``,
  ``GOOGLE_SERVICE_ACCOUNT``... An ``http://`` ``GOOGLE_BASE_URL`` is allowed plain HTTP.
- Azure: the account the URI names, else ``AZURE_STORAGE_ACCOUNT_NAME``, else Ray's
  ``AZURE_STORAGE_ACCOUNT``; ``AZURE_STORAGE_CONNECTION_STRING`` (its ``AccountName``,
  ``AccountKey``, ``SharedAccessSignature``, ``BlobEndpoint``, ``UseDevelopmentStorage``) for
  what no variable gives. Azurite: ``AZURE_STORAGE_USE_EMULATOR=true`` and
  ``AZURITE_BLOB_STORAGE_URL`` (default ``http://127.0.0.1:10000``), both read by obstore.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.core.errors import ObjectStoreSetup, echo

Env = Mapping[str, str]
ConfigValue = str | bool


@dataclass(frozen=True)
class StoreSettings:
    """One bucket's client: obstore config keys (on top of what obstore reads from the
    environment itself), and whether plain HTTP is allowed (an http:// endpoint)."""

    config: tuple[tuple[str, ConfigValue], ...]
    allow_http: bool = False

    def as_dict(self) -> dict[str, ConfigValue]:
        return dict(self.config)


def aws_files(env: Env) -> tuple[str, str]:
    """The AWS credentials and config files, as the AWS tools find them."""
    home = PurePosixPath(env.get("HOME") or "/")
    return (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / ".aws" / "credentials"),
        env.get("AWS_CONFIG_FILE") or str(home / ".aws" / "config"),
    )


def s3_settings(env: Env, credentials_text: str | None, config_text: str | None) -> StoreSettings:
    """The S3 client's settings; ``*_text``: the files of ``aws_files`` (None: absent)."""
    credentials_path, config_path = aws_files(env)
    profile_name = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    from_credentials = _section(credentials_text, credentials_path, profile_name)
    config_section = profile_name if profile_name == "default" else f"profile {profile_name}"
    from_config = _section(config_text, config_path, config_section)
    named = "AWS_PROFILE" in env or "AWS_DEFAULT_PROFILE" in env
    if named and from_credentials is None and from_config is None:
        raise ObjectStoreSetup(
            f"AWS_PROFILE names the profile {echo(profile_name)}, which neither "
            f"{credentials_path} nor {config_path} holds"
        )
    profile = {**(from_config or {}), **(from_credentials or {})}  # credentials file wins
    config: dict[str, ConfigValue] = {}
    if not env.get("AWS_ACCESS_KEY_ID") and "aws_access_key_id" in profile:
        config["access_key_id"] = profile["aws_access_key_id"]
        config["secret_access_key"] = profile.get("aws_secret_access_key", "")
        if "aws_session_token" in profile:
            config["session_token"] = profile["aws_session_token"]
    if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")) and "region" in profile:
        config["region"] = profile["region"]
    endpoint = (
        env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or env.get("AWS_ENDPOINT")
        or profile.get("endpoint_url")
    )
    if endpoint:
        config["endpoint"] = endpoint
    return StoreSettings(tuple(sorted(config.items())), _plain(endpoint))


def gcs_settings(env: Env) -> StoreSettings:
    """The GCS client's settings."""
    config: dict[str, ConfigValue] = {}
    base_url = env.get("GOOGLE_BASE_URL")
    emulator = env.get("STORAGE_EMULATOR_HOST")
    if emulator:
        base_url = emulator if "://" in emulator else f"http://{emulator}"
        config["base_url"] = base_url.rstrip("/")
        if not env.get("GOOGLE_BEARER_TOKEN"):
            config["skip_signature"] = True
    return StoreSettings(tuple(sorted(config.items())), _plain(base_url))


def azure_settings(env: Env, account: str | None) -> StoreSettings:
    """The Azure client's settings for the account the URI names (None: the environment's)."""
    parsed = parse_connection_string(env.get("AZURE_STORAGE_CONNECTION_STRING", ""))
    config: dict[str, ConfigValue] = {}
    emulator = _true(env.get("AZURE_STORAGE_USE_EMULATOR")) or _true(
        parsed.get("usedevelopmentstorage")
    )
    if emulator:
        config["use_emulator"] = True
    name = (
        account
        or env.get("AZURE_STORAGE_ACCOUNT_NAME")
        or env.get("AZURE_STORAGE_ACCOUNT")
        or parsed.get("accountname")
    )
    if name:
        config["account_name"] = name
    elif not emulator:  # the emulator's account is devstoreaccount1
        raise ObjectStoreSetup(
            "no Azure storage account: name it in the URI "
            "(azure://<container>@<account>.blob.core.windows.net/<blob>) or set "
            "AZURE_STORAGE_ACCOUNT_NAME (or AZURE_STORAGE_ACCOUNT, or "
            "AZURE_STORAGE_CONNECTION_STRING) in the agent's environment"
        )
    same_account = not parsed.get("accountname") or parsed.get("accountname") == name
    if same_account and not _any(env, "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY"):
        if "accountkey" in parsed:
            config["account_key"] = parsed["accountkey"]
        elif "sharedaccesssignature" in parsed and not _any(env, "AZURE_STORAGE_SAS_KEY"):
            config["sas_key"] = parsed["sharedaccesssignature"]
    endpoint = env.get("AZURE_STORAGE_ENDPOINT") or env.get("AZURE_ENDPOINT")
    if not endpoint and same_account and "blobendpoint" in parsed:
        endpoint = config["endpoint"] = parsed["blobendpoint"]
    if emulator and not endpoint:
        endpoint = env.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
    return StoreSettings(tuple(sorted(config.items())), _plain(endpoint))


def parse_connection_string(text: str) -> dict[str, str]:
    """An Azure connection string's ``Key=value;`` pairs, keys lowercased (Azure's are
    case-insensitive); a value may hold '=' (a SAS token's query)."""
    pairs: dict[str, str] = {}
    for part in text.split(";"):
        key, eq, value = part.strip().partition("=")
        if not part.strip():
            continue
        if not eq or not key:
            raise ObjectStoreSetup(
                "AZURE_STORAGE_CONNECTION_STRING is not a list of Key=value pairs separated "
                f"by ';' (near {echo(part.split('=')[0], 40)})"
            )
        pairs[key.strip().lower()] = value.strip()
    return pairs


def _section(text: str | None, path: str, name: str) -> dict[str, str] | None:
    """One section of an AWS ini file, or None if the file or the section is absent."""
    if text is None:
        return None
    parser = configparser.ConfigParser(interpolation=None, default_section="\x00none")
    try:
        parser.read_string(text, source=path)
    except configparser.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ObjectStoreSetup(f"{path} is not a valid AWS ini file: {echo(first)}") from exc
    if not parser.has_section(name):
        return None
    return {key.lower(): value.strip() for key, value in parser.items(name)}


def _plain(endpoint: str | None) -> bool:
    return bool(endpoint) and str(endpoint).lower().startswith("http://")


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _any(env: Env, *names: str) -> bool:
    return any(env.get(name) for name in names)
