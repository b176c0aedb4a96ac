"""A create's installs, one task per package of the env, each started at once but a venv built
by a tool of the env (``Origin.TOOL``: the uv of a ``uv_version``, ``agent.core.uv_tool``),
which starts once the env's tools are installed: the venv's installer runs the tool's binary.

The tools are the env's own packages, held by it as every other (counted, shared, evictable once
no env names them), so a venv that waits for one never waits for a package it does not hold.
A tool that fails fails the create with its own error; the venv waiting for it is not started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent.core.kinds import Build, Origin, row_of
from agent.core.packages import Package

Ensure = Callable[[Package], Awaitable[Path]]  # the store's ``ensure``


def start_ensures(packages: Sequence[Package], ensure: Ensure) -> list[asyncio.Future[Path]]:
    """One task per package, in their order: the tools' and the others' started now, each uv
    venv's once the tools are installed (if the env has any)."""
    tools = {
        p.key: asyncio.ensure_future(ensure(p))
        for p in packages
        if row_of(p.key.kind).origin is Origin.TOOL
    }
    first = tuple(tools.values())
    out: list[asyncio.Future[Path]] = []
    for package in packages:
        task = tools.get(package.key)
        if task is None:
            built_by_tool = first and row_of(package.key.kind).build is Build.UV_VENV
            task = asyncio.ensure_future(
                _after(first, ensure, package) if built_by_tool else ensure(package)
            )
        out.append(task)
    return out


async def _after(tools: Sequence[asyncio.Future[Path]], ensure: Ensure, package: Package) -> Path:
    """``ensure(package)`` once every tool is installed; a tool's failure raised instead. The
    tools are waited for, never cancelled from here (they are the create's tasks too)."""
    await asyncio.wait(tools)
    for tool in tools:
        tool.result()  # a failed or cancelled tool: its error, and no build without it
    return await ensure(package)
