"""Ray's runtime env plugins at the Ray door: each counted serialized string's plugin setup, run
once while Ray counts the string (as Ray's agent keeps an env's context in its env cache), its
plugin URIs given back to the host when the string is dropped.

The host itself (``agent.launcher.plugins.PluginHost``: it imports Ray) is made, through the
loader the entry point hands the server, only when the node names plugins; this module knows it
only as a ``PluginRunner``. Creates of a string whose setup is running wait for that one
(shielded: one caller cancelled does not end it for the others); a failed setup is not kept, so
the next create of the string tries anew.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

PluginUris = list[tuple[str, str]]  # (plugin name, URI)


class PluginRunner(Protocol):
    """Ray's runtime env plugins: their fields, their setup on a create (the context they
    modified, the plugin URIs now counted), those URIs given back."""

    fields: frozenset[str]

    async def setup(
        self,
        serialized: str,
        fields: Mapping[str, Any],
        context: dict[str, object],
        setup_timeout: int,
    ) -> tuple[dict[str, object], PluginUris]: ...

    def release(self, uris: PluginUris) -> None: ...


class PluginSetups:
    def __init__(self, runner: PluginRunner) -> None:
        self._runner = runner
        # serialized string -> its setup (the context JSON the plugins made, their URIs)
        self._setups: dict[str, asyncio.Task[tuple[str, PluginUris]]] = {}

    async def context(
        self,
        serialized: str,
        plugins: tuple[tuple[str, str], ...],
        answered: str,
        setup_timeout: int,
    ) -> str:
        """The context JSON after the plugins' setup of ``serialized`` (``plugins``: the env's
        plugin fields as canonical JSON; ``answered``: the context before them)."""
        task = self._setups.get(serialized)
        if task is None:
            fields = {name: json.loads(value) for name, value in plugins}
            task = asyncio.ensure_future(self._setup(serialized, fields, answered, setup_timeout))
            self._setups[serialized] = task
        try:
            context, _ = await asyncio.shield(task)
        except BaseException:
            if task.done() and self._setups.get(serialized) is task:
                del self._setups[serialized]
            raise
        return context

    async def _setup(
        self, serialized: str, fields: Mapping[str, Any], answered: str, setup_timeout: int
    ) -> tuple[str, PluginUris]:
        context, uris = await self._runner.setup(
            serialized, fields, json.loads(answered), setup_timeout=setup_timeout
        )
        return json.dumps(context), uris

    def drop(self, serialized: str) -> None:
        """A string Ray no longer counts: its setup's URIs given back (one in flight ended)."""
        task = self._setups.pop(serialized, None)
        if task is None:
            return
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            self._runner.release(task.result()[1])
