"""A small node, start to end: packages served on 127.0.0.1, the agent as a child process,
envs that share packages created and deleted through the real protocol, the agent's state shown.

This is the "run" command until raylet_sim's demo (the worker pool and its workload) lands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rtenv.v1 import agent_pb2, agent_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import env_json, module_zip, workdir_zip


def _packages() -> dict[str, bytes]:
    return {
        "app-a.zip": workdir_zip({"main.py": "print('app a')\n", "conf/app.toml": "name='a'\n"}),
        "app-b.zip": workdir_zip({"main.py": "print('app b')\n"}, top="app_b"),
        "mathlib.zip": module_zip("mathlib", "1.0"),
        "textlib.zip": module_zip("textlib", "2.3"),
        "plotlib.zip": module_zip("plotlib", "0.9"),
    }


async def _serve_packages(packages: dict[str, bytes]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        body = packages.get(request.match_info["name"])
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/zip")

    app = web.Application()
    app.router.add_get("/{name}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def _wait_healthy(address: str, agent: asyncio.subprocess.Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        health = cast(Any, health_pb2_grpc.HealthStub(channel))  # the stubs lack methods
        while time.monotonic() < deadline:
            if agent.returncode is not None:
                raise SystemExit(f"the agent exited with {agent.returncode} before serving")
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit(f"the agent did not report SERVING within {timeout_s}s")


async def _show_info(address: str) -> None:
    info = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "info", "--address", address
    )
    if await info.wait() != 0:
        raise SystemExit("rtenv-agent info failed")


async def main(keep: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="rtenv-demo-", dir="/tmp"))
    root = work / "root"
    address = f"unix:{root / 'agent.sock'}"
    runner, base = await _serve_packages(_packages())
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "serve", "--root", str(root),
        "--parent-pid", str(os.getpid()), "--log-level", "WARNING",
    )  # fmt: skip
    try:
        await _wait_healthy(address, agent, timeout_s=30)
        envs = [
            env_json(f"{base}/app-a.zip", [f"{base}/mathlib.zip"]),
            env_json(f"{base}/app-a.zip", [f"{base}/mathlib.zip", f"{base}/textlib.zip"]),
            env_json(f"{base}/app-b.zip", [f"{base}/textlib.zip"], {"MODE": "fast"}),
            env_json(f"{base}/app-b.zip", [f"{base}/plotlib.zip"], {"MODE": "slow"}),
            env_json(None, [f"{base}/mathlib.zip", f"{base}/plotlib.zip"]),
            # the first env again, written with its keys in another order: the same env
            json.dumps({"py_modules": [f"{base}/mathlib.zip"], "working_dir": f"{base}/app-a.zip"}),
        ]
        async with grpc.aio.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.RuntimeEnvAgentStub(channel)  # type: ignore[no-untyped-call]
            started = time.monotonic()
            replies = await asyncio.gather(
                *(
                    stub.CreateRuntimeEnv(
                        agent_pb2.CreateRuntimeEnvRequest(
                            serialized_runtime_env=env, request_id=f"demo-create-{i}"
                        ),
                        timeout=60,
                    )
                    for i, env in enumerate(envs)
                )
            )
            took = time.monotonic() - started
            print(
                f"created {len(envs)} envs ({len({r.runtime_env_id for r in replies})} "
                f"distinct) in {took:.2f}s"
            )
            for reply in replies:
                ctx = reply.context
                print(f"  {reply.runtime_env_id}  cwd={ctx.cwd or '-'}")
                print(f"      PYTHONPATH={ctx.env_vars.get('PYTHONPATH', '')}")
            print("\nthe agent's state while the envs are in use:")
            await _show_info(address)
            for i, reply in enumerate(replies):
                await stub.DeleteRuntimeEnv(
                    agent_pb2.DeleteRuntimeEnvRequest(
                        runtime_env_id=reply.runtime_env_id, request_id=f"demo-delete-{i}"
                    ),
                    timeout=10,
                )
            info = await stub.GetRuntimeEnvsInfo(agent_pb2.GetRuntimeEnvsInfoRequest(), timeout=10)
        print("\nafter every env was deleted (packages stay cached, unused, under the budget):")
        await _show_info(address)
        leaked = [u.uri for u in info.uris if u.references != 0]
        print(
            f"\ndownloads {info.cache.downloads} for {len(info.uris)} packages; "
            f"references left: {len(leaked)}"
        )
        if leaked or info.total_envs:
            raise SystemExit(f"leaked references: {leaked}")
    finally:
        if agent.returncode is None:
            agent.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(agent.wait(), timeout=10)
            except TimeoutError:
                agent.kill()
                await agent.wait()
        await runner.cleanup()
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the agent's root afterwards")
    asyncio.run(main(parser.parse_args().keep))
