"""The ``rtenv-agent`` command's entry point (``python -m agent`` too): ops' command line
(``agent.ops.cli``), handed what lives in this top layer, which no layer below imports:
``rtenv-agent ray ...`` (``agent.launcher.ray_cli``: Ray's own command line with this agent
swapped in, and ours beside it) and the host of Ray's runtime env plugins
(``agent.launcher.plugins``). Both are imported only when used: they may import Ray, which
neither ``serve`` nor ``ray-agent`` does unless a node names plugins.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.doors.ray_plugins import PluginRunner
from agent.ops import cli


def _ray(argv: Sequence[str]) -> int:
    from agent.launcher import ray_cli

    return ray_cli.main(argv)


def _load_plugins() -> PluginRunner:
    from agent.launcher.plugins import load_host

    return load_host()


TOP = cli.TopLayer(ray=_ray, load_plugins=_load_plugins)


def main(argv: Sequence[str] | None = None) -> int:
    """``rtenv-agent ARGV`` (None: this process's arguments); the exit code."""
    return cli.main(argv, TOP)
