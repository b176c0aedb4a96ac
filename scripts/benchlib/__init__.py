"""The benchmark's parts; ``scripts/bench.py`` is the entry point.

- ``figures``: what a workload reports (figures against baselines, goals, standard measures),
  the table, the JSON file and the plot.
- ``procs``: the processes the benchmark starts (agent, echo server, package server), /proc
  sampling of their CPU and memory, the disk probe and the page-cache re-read.
- ``packages``: the zips the workloads install.
- ``rpc``: the one client code every gRPC figure and its baseline go through.
- ``baselines``: the physical limits: curl+unzip, aiohttp+zipfile, bare worker spawns, LRU.
- ``hot``, ``cold``, ``churn``, ``recovery``, ``workers``: the workloads.
- ``echo_server``, ``pkg_server``, ``fetch_baseline``: programs run as child processes.
"""
