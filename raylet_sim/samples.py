"""The demo's sample packages and the tiny HTTP server that serves them on 127.0.0.1.

Working dirs hold ``task.py`` (the task the workers run) and a data file; py_modules each hold a
package ``libN`` with a value. Several envs share each package. The server counts every GET, so
the demo can show that each package was downloaded once.
"""

from __future__ import annotations

import io
import json
import random
import zipfile
from collections import Counter
from dataclasses import dataclass

from aiohttp import web

TASK_PY = '''\
"""The demo task: import this env's py_modules, read this working dir's data file."""
import importlib
import os


def run(task_index):
    names = [n for n in os.environ["DEMO_MODULES"].split(",") if n]
    total = sum(importlib.import_module(name).VALUE for name in names)
    with open(os.path.join("data", "input.txt")) as f:
        tag = f.readline().strip()
    return {"env": os.environ["DEMO_ENV"], "sum": total, "tag": tag, "task": task_index,
            "pid": os.getpid()}
'''


@dataclass(frozen=True)
class EnvSpec:
    index: int
    working_dir: str  # package name
    py_modules: tuple[str, ...]  # package names
    serialized: str  # the env key: JSON as a task gives it

    def expected(self, task_index: int, values: dict[str, int]) -> dict[str, object]:
        return {
            "env": str(self.index),
            "sum": sum(values[m] for m in self.py_modules),
            "tag": self.working_dir,
            "task": task_index,
        }


@dataclass
class Samples:
    packages: dict[str, bytes]  # name -> zip bytes
    sizes: dict[str, int]  # name -> bytes unpacked
    values: dict[str, int]  # py_module package -> its VALUE
    envs: list[EnvSpec]


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def build_samples(n_envs: int, base_url: str, *, seed: int, filler_bytes: int) -> Samples:
    """Packages and ``n_envs`` envs over them: about one working dir per 6 envs and one
    py_module per 3, each env naming one working dir and one to three py_modules."""
    rng = random.Random(seed)
    n_wd = max(2, n_envs // 6)
    n_mod = max(3, n_envs // 3)
    packages: dict[str, bytes] = {}
    sizes: dict[str, int] = {}
    values: dict[str, int] = {}
    for i in range(n_wd):
        name = f"app{i}"
        files = {
            f"{name}/task.py": TASK_PY.encode(),
            f"{name}/data/input.txt": f"{name}\n".encode(),
            f"{name}/data/blob.bin": rng.randbytes(filler_bytes),
        }
        packages[f"{name}.zip"] = _zip(files)
        sizes[name] = sum(len(v) for v in files.values())
    for i in range(n_mod):
        name = f"lib{i}"
        values[name] = rng.randrange(1000)
        files = {
            f"{name}/__init__.py": f"VALUE = {values[name]}\n".encode(),
            f"{name}/table.bin": rng.randbytes(filler_bytes // 2),
        }
        packages[f"{name}.zip"] = _zip(files)
        sizes[name] = sum(len(v) for v in files.values())
    envs = []
    for index in range(n_envs):
        wd = f"app{index % n_wd}"
        mods = tuple(sorted(rng.sample(sorted(values), k=rng.randint(1, min(3, n_mod)))))
        env = {
            "working_dir": f"{base_url}/{wd}.zip",
            "py_modules": [f"{base_url}/{m}.zip" for m in mods],
            "env_vars": {"DEMO_ENV": str(index), "DEMO_MODULES": ",".join(mods)},
        }
        envs.append(EnvSpec(index, wd, mods, json.dumps(env)))
    return Samples(packages, sizes, values, envs)


class PackageServer:
    """Serves packages by name on 127.0.0.1 and counts GETs per name."""

    def __init__(self) -> None:
        self.packages: dict[str, bytes] = {}
        self.gets: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.gets[name] += 1
        body = self.packages.get(name)
        if body is None:
            return web.Response(status=404, text=f"no package {name}")
        return web.Response(body=body, content_type="application/zip")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
