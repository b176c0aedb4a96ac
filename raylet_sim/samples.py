"""The demo's sample packages and the tiny HTTP server that serves them on 127.0.0.1.

Working dirs hold ``task.py`` (the task the workers run) and a data file; py_modules each hold a
package ``libN`` with a value. Several envs share each package. The server counts every GET, so
the demo can show that each package was downloaded once.

Nothing is held per env or per package: an env, a value or a package's zip is made from the seed
and its index or name when asked for, the same every time. So a hundred thousand envs cost
nothing until a task uses one, and a package's bytes exist only while it is being served.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import zipfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

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

_CHUNK = 1024 * 1024  # filler is written, and a body sent, this many bytes at a time
_MAKING_AT_ONCE = 2  # package bodies made (and being sent) at once: the server's memory bound


@dataclass(frozen=True)
class EnvSpec:
    index: int
    working_dir: str  # package name
    py_modules: tuple[str, ...]  # package names
    serialized: str  # the env key: JSON as a task gives it

    def expected(self, task_index: int, values: Mapping[str, int]) -> dict[str, object]:
        return {
            "env": str(self.index),
            "sum": sum(values[m] for m in self.py_modules),
            "tag": self.working_dir,
            "task": task_index,
        }


def _index(name: str, prefix: str, count: int) -> int | None:
    """N of a name ``<prefix>N`` with 0 <= N < count, written without leading zeros, or None."""
    digits = name.removeprefix(prefix)
    if digits == name or not digits.isdigit() or len(digits) > 9 or str(int(digits)) != digits:
        return None  # (over 9 digits: past any count, and never parsed)
    return int(digits) if int(digits) < count else None


class Samples:
    """``n_envs`` envs over about one working dir per 6 envs (``appN``) and one py_module per 3
    (``libN``), each env naming one working dir and one to three py_modules; ``filler_bytes`` of
    random data in each working dir, half that in each py_module."""

    def __init__(self, n_envs: int, base_url: str, *, seed: int, filler_bytes: int) -> None:
        self.n_wd = max(2, n_envs // 6)
        self.n_mod = max(3, n_envs // 3)
        self.base_url = base_url
        self.seed = seed
        self.filler_bytes = filler_bytes
        self.envs = _Envs(self, n_envs)
        self.values = _Values(self)  # py_module package -> its VALUE
        self.packages = _Packages(self)  # "<name>.zip" -> its zip, made at each lookup

    def rng(self, what: str) -> random.Random:
        return random.Random(f"{self.seed}/{what}")  # a str seed is hashed: stable across runs

    def env(self, index: int) -> EnvSpec:
        wd = f"app{index % self.n_wd}"
        rng = self.rng(f"env{index}")
        picked = rng.sample(range(self.n_mod), k=rng.randint(1, 3))
        mods = tuple(sorted(f"lib{i}" for i in picked))
        env = {
            "working_dir": f"{self.base_url}/{wd}.zip",
            "py_modules": [f"{self.base_url}/{m}.zip" for m in mods],
            "env_vars": {"DEMO_ENV": str(index), "DEMO_MODULES": ",".join(mods)},
        }
        return EnvSpec(index, wd, mods, json.dumps(env))

    def unpacked_bytes(self, name: str) -> int:
        """The bytes of package ``name``'s files (without its ``.zip``)."""
        return sum(len(data) for data in self._texts(name).values()) + self._filler(name)

    def _texts(self, name: str) -> dict[str, bytes]:
        if name.startswith("app"):
            return {
                f"{name}/task.py": TASK_PY.encode(),
                f"{name}/data/input.txt": f"{name}\n".encode(),
            }
        return {f"{name}/__init__.py": f"VALUE = {self.values[name]}\n".encode()}

    def _filler(self, name: str) -> int:
        return self.filler_bytes if name.startswith("app") else self.filler_bytes // 2

    def make_zip(self, name: str) -> bytes:
        """Package ``name``'s zip, the same bytes at every call (no clock in it): its files
        deflated, its random filler stored (it would not shrink), written a chunk at a time."""
        rng = self.rng(f"{name}/filler")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for path, data in self._texts(name).items():
                zf.writestr(_entry(path, zipfile.ZIP_DEFLATED), data)
            blob = f"{name}/data/blob.bin" if name.startswith("app") else f"{name}/table.bin"
            left = self._filler(name)
            with zf.open(_entry(blob, zipfile.ZIP_STORED), "w") as f:
                while left:
                    f.write(rng.randbytes(min(left, _CHUNK)))
                    left -= min(left, _CHUNK)
        return buf.getvalue()


def _entry(path: str, compression: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(path)  # dated 1980-01-01
    info.compress_type = compression
    info.external_attr = 0o644 << 16  # rw-r--r--
    return info


class _Envs(Sequence[EnvSpec]):
    def __init__(self, samples: Samples, count: int) -> None:
        self._samples = samples
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> EnvSpec: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[EnvSpec]: ...
    def __getitem__(self, index: int | slice) -> EnvSpec | Sequence[EnvSpec]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        return self._samples.env(index % self._count)


class _Values(Mapping[str, int]):
    def __init__(self, samples: Samples) -> None:
        self._samples = samples

    def __getitem__(self, name: str) -> int:
        if _index(name, "lib", self._samples.n_mod) is None:
            raise KeyError(name)
        return self._samples.rng(f"{name}/value").randrange(1000)

    def __iter__(self) -> Iterator[str]:
        return (f"lib{i}" for i in range(self._samples.n_mod))

    def __len__(self) -> int:
        return self._samples.n_mod


class _Packages(Mapping[str, bytes]):
    def __init__(self, samples: Samples) -> None:
        self._samples = samples

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not key.endswith(".zip"):
            return False
        name, s = key.removesuffix(".zip"), self._samples
        return _index(name, "app", s.n_wd) is not None or _index(name, "lib", s.n_mod) is not None

    def __getitem__(self, key: str) -> bytes:
        if key not in self:
            raise KeyError(key)
        return self._samples.make_zip(key.removesuffix(".zip"))

    def __iter__(self) -> Iterator[str]:
        yield from (f"app{i}.zip" for i in range(self._samples.n_wd))
        yield from (f"lib{i}.zip" for i in range(self._samples.n_mod))

    def __len__(self) -> int:
        return self._samples.n_wd + self._samples.n_mod


def build_samples(n_envs: int, base_url: str, *, seed: int, filler_bytes: int) -> Samples:
    """The samples (nothing is made until asked for: see the module's docstring)."""
    return Samples(n_envs, base_url, seed=seed, filler_bytes=filler_bytes)


class PackageServer:
    """Serves packages by name on 127.0.0.1 and counts GETs per name: the bodies in
    ``packages``, or else those that ``made`` makes at each lookup (in a thread, a few at a time,
    each sent in slices: so only those few are in memory at once)."""

    def __init__(self) -> None:
        self.packages: dict[str, bytes] = {}
        self.made: Mapping[str, bytes] = {}
        self.gets: Counter[str] = Counter()
        self._making = asyncio.Semaphore(_MAKING_AT_ONCE)
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
        if body is not None:
            return web.Response(body=body, content_type="application/zip")
        if name not in self.made:
            return web.Response(status=404, text=f"no package {name[:100]}")
        async with self._making:
            body = await asyncio.to_thread(self.made.__getitem__, name)
            response = web.StreamResponse(headers={"Content-Type": "application/zip"})
            response.content_length = len(body)
            view = memoryview(body)
            try:
                await response.prepare(request)
                for start in range(0, len(body), _CHUNK):
                    await response.write(view[start : start + _CHUNK])
                await response.write_eof()
            except ConnectionError:
                pass  # the agent gave up on this download (or stopped): nothing to answer
            return response

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
