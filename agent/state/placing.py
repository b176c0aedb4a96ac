"""Making an install the root's, once its installer made the package in staging: the rename
into ``uris/`` with what is left of the staging folder removed, in one thread hop (``place``),
then its row committed to the index before anyone is told (``commit``). Each step survives a
cancellation: a hop or a transaction already started is waited for, and its outcome decides
what is deleted (a package no row vouches for goes; a committed one stays, the root's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from agent.core.errors import IndexUnavailable
from agent.install.disk.root import move_to_trash, remove_tree
from agent.install.disk.staging import place_package, through
from agent.state.entries import UriEntry
from agent.state.state_db import StateDB, UriRow

Delete = Callable[[list[Path]], None]  # the store's deletion in the background


async def place(trash: Path, unpacked: Path, final: Path, staging: Path, delete: Delete) -> None:
    """Rename the package into place (``place_package``), then delete what is left of the
    staging folder (the download), in one thread hop. The hop ends even if the install is
    cancelled meanwhile; a package it placed then goes again, as no commit will vouch for it
    (nothing in uris/ without a row)."""
    step = asyncio.ensure_future(
        asyncio.to_thread(_place_and_clear, trash, unpacked, final, staging)
    )
    try:
        leftover = await through(step)
    except asyncio.CancelledError:
        if not step.cancelled() and step.exception() is None:
            left = step.result()
            delete([move_to_trash(trash, final), *([left] if left else [])])
        raise
    if leftover is not None:
        delete([leftover])


async def commit(db: StateDB, entry: UriEntry, delete: Delete) -> None:
    """Make the install durable, and known to every agent, before anyone is told of it;
    undo the rename if that fails. If the claim is no longer this agent's, raise
    IndexUnavailable (the create may try again) and leave the folder alone."""
    row = UriRow(
        entry.key.kind.value, entry.key.uri, entry.path.name, entry.size, entry.last_used_ms
    )
    step = asyncio.create_task(db.record_install(row), name=f"commit {entry.key.label}")
    try:
        # a cancellation waits for the commit, to know its outcome
        committed = await through(step)
    except BaseException:
        if step.cancelled() or step.exception() is not None:  # not committed: nobody
            delete([move_to_trash(db.trash, entry.path)])  # vouches for it
        else:  # committed: the package stays, ready for every agent
            entry.committed = step.result()
        raise
    if not committed:  # the claim was taken from this agent: a peer may have placed and
        # committed its own install at entry.path since, so the folder is left to the
        # next claim (place_package sets a leftover aside) or to a start's recovery
        raise IndexUnavailable(
            f"{entry.key.label}: another agent of the root took over this install (it "
            "found this agent's claim dead); nothing was committed; try again"
        )


def _place_and_clear(trash: Path, unpacked: Path, final: Path, staging: Path) -> Path | None:
    """``place_package``, then the staging folder removed (its download and anything else the
    installer left: the package is out of it). Blocking: one thread hop."""
    leftover = place_package(trash, unpacked, final)
    remove_tree(staging)
    return leftover
