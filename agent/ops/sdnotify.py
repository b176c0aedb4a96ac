"""systemd's readiness protocol (``Type=notify``), without libsystemd: when the service manager
sets ``NOTIFY_SOCKET``, the agent sends ``READY=1`` once it serves and ``STOPPING=1`` when it
begins to shut down, each as one datagram on that unix socket (a path, or ``@name`` for an
abstract one).

The variable is taken out of the environment when read (as ``sd_notify(unset_environment=1)``
does), so installers and other children never talk to the service manager in the agent's name.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

ENV_VAR = "NOTIFY_SOCKET"


class Notifier:
    """Sends states to the service manager; does nothing when there is none."""

    def __init__(self, address: str) -> None:
        self.address = address  # as given: "" (off), "/path" or "@abstract"

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] = os.environ) -> Notifier:
        """Read (and remove) ``NOTIFY_SOCKET``; an unsupported kind is logged and ignored."""
        address = environ.pop(ENV_VAR, "")
        if address and not address.startswith(("/", "@")):
            log.warning(
                "%s=%r is not a unix socket path or @abstract name; not notifying",
                ENV_VAR,
                address[:200],
                extra={"notify_socket": address[:200]},
            )
            address = ""
        return cls(address)

    def send(self, state: str) -> bool:
        """Send ``state`` (e.g. "READY=1") in one datagram; never blocks, never raises.
        Return whether it was sent."""
        if not self.address:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(state.encode(), target)
        except OSError as exc:
            log.warning(
                "could not notify the service manager at %s: %s",
                self.address,
                exc,
                extra={"notify_socket": self.address, "state": state},
            )
            return False
        return True
