"""What the URI store keeps per package in this agent: its ``UriEntry`` (state, size, last use,
the install task and who waits on it, whether this agent's reference is held in the index),
the ``UriState`` lifecycle, and the ``StoreStats`` figures. Values only: ``store.py`` changes
them, ``passes.py`` follows the index with them, the app reads them.

Lifecycle of one (kind, URI) key, in this agent::

    absent --ensure--> INSTALLING --ok--> READY, held --(count 0)--> READY, not held
                           |                                            |    |
                           |        ensure: taken again (INSTALLING) <--+    |
                           |                   a pass evicts it: absent <----+
                           +--error--> absent (every waiter gets the error; the next ensure retries)

INSTALLING is *obtaining*: the reference is taken in the index, then the package is found
ready (a hit), or claimed and installed here, or waited for while a peer installs it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from agent.core.uris import UriKey


class UriState(Enum):
    INSTALLING = "installing"  # being obtained: referenced in the index, then found or installed
    READY = "ready"


@dataclass
class UriEntry:
    key: UriKey
    path: Path
    state: UriState = UriState.INSTALLING
    size: int = 0  # bytes on disk: measured at install, and again at each release
    last_used_ms: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    waiters: int = 0  # ensure() calls awaiting the install
    abandoned: bool = False  # INSTALLING, its task cancelled as its last waiter left: nobody
    # joins it (its end is a cancellation), an ensure waits for it to end and obtains anew
    held: bool = False  # this agent's reference is committed in the index
    was_ready: bool = False  # READY before its current obtain began
    committed: bool = False  # its install's commit went through, then it was cancelled: the
    # package is the root's (``_install`` makes it READY here, not forgotten)
    kept: bool = False  # INSTALLING, left by every create at a setup timeout and kept going by
    # the store (``builds``): not cancelled when its last waiter leaves; a later ensure joins it
    build: Build | None = field(default=None, repr=False)  # while installing under this
    # agent's claim: where and since when (``builds``: progress lines, info)
    used_here: bool = False  # an env of this agent used it since it entered this view: under
    # Ray, its kind's Ray folder shows it while it is ready (``ray_folders``)
    dropping: bool = False  # READY, released while held: the drop of its committed reference
    # is noted for the index; while the note is not taken by a transaction, or the drop is
    # deferred (its row kept: this agent alone on the root), ``ensure`` holds it again by
    # cancelling the drop (``StateDB.keep_ref``), no transaction


@dataclass
class Build:
    """An install under this agent's claim, as its progress reads it: since when (the store's
    monotonic clock), its staging folder once it has a slot (None: queued), and the bytes
    found there at the last look."""

    started: float
    staging: Path | None = None
    bytes_so_far: int = 0
    packages_done: int = 0  # installed in it so far (a venv's ``*.dist-info`` folders)


@dataclass
class StoreStats:
    used_bytes: int
    unused_bytes: int
    budget_bytes: int
    downloads: int
    extractions: int
    evictions: int
    hits: int
