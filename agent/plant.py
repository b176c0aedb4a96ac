"""Planted defects, for the chaos oracle's proof: ``RTENV_PLANT=<defect>[,<defect>...]`` makes
the agent commit one of the bugs the chaos run on real Ray must catch (``scripts/chaos_ray.py
--plant``), to show that its oracle sees it: a run with a defect planted must fail, naming it.

Defects:
- ``drop_ref_early``: a package handed out again from this agent's cache loses its reference in
  the shared index at once, while its env still uses it: another agent of the root may evict it
  from under its tasks (R1 broken).
- ``reap_live_holder``: a reaping pass drops every other holder's rows, alive or not, without
  taking its lock: their packages in use become evictable (R4 broken).
- ``rm_ray_tree``: under Ray, the node's Ray folders lose the tree of every package, in use or
  not, at each pass (what Ray's tools and GC checks read there, gone while in use).

Unset in production, a check costs one set lookup. Never set it outside a test or a chaos run.
"""

from __future__ import annotations

from agent.crash import named_in

ENV_VAR = "RTENV_PLANT"
DEFECTS = frozenset({"drop_ref_early", "reap_live_holder", "rm_ray_tree"})


_PLANTED = named_in(ENV_VAR, DEFECTS, "defects")


def planted(name: str) -> bool:
    """Whether the defect ``name`` is planted in this process."""
    assert name in DEFECTS, name
    return name in _PLANTED
