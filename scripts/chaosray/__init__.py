"""Chaos on real Ray (issue 40): K local clusters (bare ``ray.init()`` drivers under this agent's
Ray switch, and a multi-node ``ray.cluster_utils.Cluster``) on one shared agent root, a seeded mix
of tasks and actors over working_dir, py_modules (zips and wheels), pip and uv envs that share
packages, while the runner kills raylets, agents, GCSes, workers and drivers. ``workload`` makes
the packages and the env cases (pure, seeded), ``server`` serves them on 127.0.0.1, and
``driver.py`` is the program each cluster's driver runs (stdlib and Ray only: it never imports
the agent), reporting one ``CHAOS {json}`` line per event; ``scripts/chaos_ray.py`` runs it all.
"""
