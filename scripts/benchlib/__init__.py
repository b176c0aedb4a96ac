"""The benchmark's parts; ``scripts/bench.py`` is the entry point.

- ``figures``: what a workload reports (figures against baselines, goals, standard measures),
  the table, the JSON file and the plot.
- ``procs``: the processes the benchmark starts (agent, echo server, package server), /proc
  sampling of their CPU and memory, the disk probe and the page-cache re-read.
- ``packages``: the zips the workloads install.
- ``rpc``: the one client code every figure and its baseline go through, over a ``Target``:
  the gRPC door, or Ray's HTTP protocol (``ray_http``: this agent's Ray door, Ray's own agent).
- ``baselines``: the physical limits: curl+unzip, aiohttp+zipfile, bare worker spawns, LRU.
- ``hot``, ``cold``, ``churn``, ``recovery``, ``workers``, ``shared_root``, ``fleet``: the
  workloads.
- ``peer``: the peer run (``--peer ray``), this agent next to Ray's own agent; ``raynode``
  the real Ray head nodes it starts and stops.
- ``echo_server``, ``pkg_server``, ``fetch_baseline``, ``ray_e2e`` (a Ray driver): programs run
  as child processes.
"""
