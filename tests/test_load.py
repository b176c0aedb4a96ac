"""Load: 1,000 concurrent creates over 100 envs sharing 10 URIs, all in flight at once against a
real agent and a real package server; one download per URI, no error, bounded memory, and every
count back to 0 after 1,000 concurrent deletes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

from agent.app.config import Settings
from tests.harness.in_process import listed, running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import env_json, module_zip, workdir_zip
from tests.harness.polling import wait_until

ENVS = 100
CREATES_PER_ENV = 10  # 1,000 creates in all
# Peak resident memory of this whole process (agent, client and package server) may grow by
# at most this much over the test: generous (it grows by about 60 MiB here), but a leak of
# 200 KiB per create or a runaway per-request buffer would cross it.
RSS_GROWTH_LIMIT = 256 * 1024**2


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


class PeakRss:
    """This process's peak RSS from now on: the kernel's high-water mark, reset here (clear_refs
    5), or, where that cannot be reset, the largest of the samples taken."""

    def __init__(self) -> None:
        self.base = status_kib("VmRSS")
        self.reset = False
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        self.samples = [self.base]

    def sample(self) -> None:
        self.samples.append(status_kib("VmRSS"))

    def growth(self) -> int:
        self.sample()
        return (status_kib("VmHWM") if self.reset else max(self.samples)) - self.base


async def test_thousand_concurrent_creates_over_ten_shared_uris_install_each_once() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wds = [pkgs.add(f"wd{i}.zip", workdir_zip({"wd.txt": str(i)})) for i in range(5)]
        mods = [pkgs.add(f"mod{i}.zip", module_zip(f"mod{i}", str(i))) for i in range(5)]
        gates = [pkgs.hold(f"{kind}{i}.zip") for kind in ("wd", "mod") for i in range(5)]
        envs = [env_json(wds[i % 5], [mods[(i // 5) % 5]], {"I": str(i)}) for i in range(ENVS)]
        downloading = min(10, Settings(root=a.root).max_concurrent_installs)  # others queue
        peak = PeakRss()
        try:
            creates = [
                asyncio.create_task(a.create(env, request_id=f"c{i}-{n}"))
                for i, env in enumerate(envs)
                for n in range(CREATES_PER_ENV)
            ]

            def all_in_flight() -> bool:
                peak.sample()
                begun = sum(refs.count for _, refs in a.service.tables.envs())
                return begun == ENVS * CREATES_PER_ENV and len(pkgs.gets) == downloading

            await wait_until(all_in_flight, timeout_s=30, what="1,000 creates in flight")
            assert not any(c.done() for c in creates)
            assert a.service.store.installs_in_flight() == 10
            for gate in gates:
                gate.set()
            replies = await asyncio.wait_for(asyncio.gather(*creates), 60)
        finally:
            for gate in gates:
                gate.set()
        peak.sample()

        assert dict(pkgs.gets) == {name: 1 for name in pkgs.gets}, "a URI downloaded twice"
        assert len(pkgs.gets) == 10
        ids = Counter(reply.runtime_env_id for reply in replies)
        assert sorted(ids.values()) == [CREATES_PER_ENV] * ENVS
        for i, reply in enumerate(replies[::CREATES_PER_ENV]):
            assert reply.context.env_vars["I"] == str(i)
            assert (Path(reply.context.cwd) / "wd.txt").read_text() == str(i % 5)
        info = await a.info()
        assert (info.total_envs, info.cache.downloads) == (ENVS, 10)
        assert sorted(u.references for u in info.uris) == [20] * 10  # each URI in 20 envs

        deletes = [asyncio.create_task(a.delete(env_id)) for env_id in ids for _ in range(10)]
        remaining = await asyncio.wait_for(asyncio.gather(*deletes), 60)
        assert sorted(Counter(remaining).items()) == [(n, ENVS) for n in range(10)]
        growth = peak.growth()
        print(f"peak RSS growth {growth / 1024**2:.1f} MiB (hwm reset: {peak.reset})")
        assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew by {growth / 1024**2:.0f} MiB"

        await a.settle()
        info = await a.info()
        assert (info.total_envs, len(a.service.tables)) == (0, 0)
        assert [(u.references, u.state) for u in info.uris] == [(0, "unused")] * 10
        assert (info.cache.used_bytes, a.service.store.installs_in_flight()) == (0, 0)
        assert [e for e in info.envs if e.state != "failed"] == []
        assert listed(a.root, "tmp") == []
        a.service.check_invariants()
