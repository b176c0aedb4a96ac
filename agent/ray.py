"""The driver's API, as the README names it: ``agent.ray.install()``, called by a driver before
it starts its local cluster (``ray.init()``), makes the raylets this process starts run this
agent; ``agent.ray.uninstall()`` gives Ray's own back, ``agent.ray.installed()`` tells, and
``agent.ray.swap_agent_command(argv)`` is the rewrite of one raylet command. The launcher's
(``agent.launcher``), under the name a driver calls it by; importing it imports no Ray.
"""

from __future__ import annotations

from agent.launcher import install, installed, swap_agent_command, uninstall

__all__ = ["install", "installed", "swap_agent_command", "uninstall"]
