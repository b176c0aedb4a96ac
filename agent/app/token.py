"""The agent's token: read from a file at start (``--token-file``) and checked on every call
that must carry it, by whichever door receives the call.

A call carries it as ``Bearer <token>`` (gRPC metadata ``authorization``, or an HTTP
``Authorization`` header); the comparison takes constant time. A missing and a wrong token are
told apart, and both messages say how to send it.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from agent.core.errors import TokenError, Unauthenticated

MISSING = (
    "this agent wants a token and the call carried none: send 'authorization: Bearer <token>' "
    "(gRPC metadata, or an HTTP header) with the content of its --token-file"
)
WRONG = (
    "the call's token is not this agent's: send 'authorization: Bearer <token>' (gRPC metadata, "
    "or an HTTP header) with the content of the agent's --token-file"
)


def read_token(path: str) -> bytes:
    """The token in a file: its first line, stripped; refused if empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise TokenError(f"the token file {path} is empty")
    return token.encode()


class Token:
    """The secret a call must carry, as the value ``Bearer <token>``."""

    def __init__(self, token: bytes) -> None:
        self._expected = b"Bearer " + token

    def check(self, given: bytes | None) -> None:
        """Nothing if ``given`` (the call's authorization value, None if it had none) is this
        token; else ``Unauthenticated`` saying whether it was missing or wrong."""
        if given is None:
            raise Unauthenticated(MISSING)
        if not hmac.compare_digest(given, self._expected):
            raise Unauthenticated(WRONG)
