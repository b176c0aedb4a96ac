"""Ray's auth token, as the agent a raylet starts finds it: when Ray's token auth is on
(``RAY_AUTH_MODE=token``), ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token`` (the places Ray itself looks); a token file is a regular file, opened
without blocking and read up to its bound. No token where auth is on is a ``ConfigError``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.core.errors import ConfigError, echo

DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"  # under the home folder, as Ray looks for it
MAX_TOKEN_FILE_BYTES = 64 * 1024  # a token file is one line; more is not a token file


def ray_token(
    environ: Mapping[str, str], home: Callable[[], Path], read: Callable[[Path], str]
) -> str | None:
    """Ray's auth token when its token auth is on (RAY_AUTH_MODE=token): RAY_AUTH_TOKEN, else
    the file at RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token (``home()`` is asked only then: a
    process with no HOME and no passwd entry has none); stripped. None when auth is off."""
    if environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        return None
    token = environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    named = environ.get("RAY_AUTH_TOKEN_PATH", "")
    if named:
        path, where = Path(named), "RAY_AUTH_TOKEN_PATH"
    else:
        try:
            path = home() / DEFAULT_TOKEN_FILE
        except (RuntimeError, KeyError, OSError) as exc:
            raise ConfigError(
                "RAY_AUTH_MODE=token but no token: RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH are "
                f"not set and there is no home folder for ~/.ray/auth_token ({echo(str(exc))}); "
                "set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
            ) from None
        where = "the default token file"
    try:
        token = read(path).strip()
    except FileNotFoundError:
        raise ConfigError(
            f"RAY_AUTH_MODE=token but no token: RAY_AUTH_TOKEN is not set and {echo(str(path))} "
            f"({where}) does not exist; set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"cannot read Ray's token file {echo(str(path))} ({where}): {reason}"
        ) from exc
    if not token:
        raise ConfigError(f"Ray's token file {echo(str(path))} ({where}) is empty")
    return token


def read_token_file(path: Path) -> str:
    """A token file's text: a regular file only (opened without blocking: a FIFO named there
    would hang the start), read up to its bound."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"Ray's token file {echo(str(path))} is not a regular file")
        with os.fdopen(fd, "rb") as f:
            fd = -1  # the file object owns it now
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(
            f"{echo(str(path))} is over {MAX_TOKEN_FILE_BYTES} bytes: not a token file"
        )
    return data.decode()
