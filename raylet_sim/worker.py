"""A worker process: runs tasks sent by the pool, one JSON line in, one JSON line out.

Started by the pool with the runtime env's context already applied: its variables (PYTHONPATH
included), its cwd and its command (``py_executable``). It announces itself with a ``ready``
line, then answers each task ``{"task_id", "call": "module:function", "args"}`` with
``{"task_id", "ok", "result" or "error"}``. It exits when its stdin closes, and, quietly (exit
1), when its stdout's reader is gone. What a task prints goes to stderr, so stdout stays the
protocol.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any, NoReturn, TextIO

from raylet_sim.watch import Watcher, from_environment


def _run(call: str, args: list[Any]) -> Any:
    module_name, _, function = call.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, function)(*args)


def serve(requests: TextIO, replies: TextIO, watcher: Watcher | None = None) -> None:
    ready: dict[str, Any] = {"ready": True, "pid": os.getpid(), "cwd": os.getcwd()}
    if watcher is not None:
        ready["watching"] = watcher.files
        watcher.start()
    replies.write(json.dumps(ready) + "\n")
    replies.flush()
    for line in requests:
        task = json.loads(line)
        reply: dict[str, Any] = {"task_id": task["task_id"]}
        try:
            reply.update(ok=True, result=_run(task["call"], task["args"]))
        except Exception as exc:
            reply.update(
                ok=False,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=5),
            )
        if watcher is not None:
            reply["violations"] = watcher.take()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    if watcher is not None:  # stdin closed: a last look, a last report
        watcher.stop()
        replies.write(json.dumps({"violations": watcher.take()}) + "\n")
        replies.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a task's prints, and its children's, must not corrupt the protocol
    try:
        serve(sys.stdin, replies, from_environment())
    except BrokenPipeError:  # nobody reads the replies any more: the pool is gone
        _exit_unread(replies)


def _exit_unread(replies: TextIO) -> NoReturn:
    """Exit 1, quietly: the replies' pipe is closed, so what is left of them goes to /dev/null
    as they close (else their last flush says the pipe broke, on stderr, in Python's dev mode)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, replies.fileno())
    os.close(devnull)
    replies.close()
    sys.exit(1)


if __name__ == "__main__":
    main()
