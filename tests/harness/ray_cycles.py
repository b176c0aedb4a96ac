"""A Ray driver the cycle test runs as a process of its own:
``python tests/harness/ray_cycles.py CYCLES TEMP_DIR``, with RTENV_ROOT set (the shared root).

It swaps the raylet's runtime env agent for this one (``agent.ray.install()``, as a user's
driver does), then starts and ends a local cluster CYCLES times (a bare ``ray.init(num_cpus=1)``
and ``ray.shutdown()``, no task: the agent starts and is ended by its raylet all the same) in
this one process, and prints ``RESULT <json>``: each cycle's seconds."""

from __future__ import annotations

import json
import logging
import sys
import time

import ray

import agent.ray


def main() -> None:
    cycles, temp_dir = int(sys.argv[1]), sys.argv[2]
    agent.ray.install()
    seconds = []
    for _ in range(cycles):
        started = time.monotonic()
        ray.init(
            num_cpus=1, include_dashboard=False, _temp_dir=temp_dir,
            logging_level=logging.WARNING, log_to_driver=False,
        )  # fmt: skip
        ray.shutdown()
        seconds.append(round(time.monotonic() - started, 2))
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
