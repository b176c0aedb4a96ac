"""The cold-large baseline, a child process: a sequential aiohttp download of a URL to a file,
then ``zipfile.extractall`` of it. ``python -m benchlib.fetch_baseline --url U --dest D`` prints
one JSON line: download_s, extract_s, total_s (interpreter start-up left out, as the agent's
start is left out of its create), cpu_s and peak_rss_bytes of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
import zipfile
from pathlib import Path

import aiohttp


async def download(url: str, dest: Path) -> int:
    total = 0
    async with (
        aiohttp.ClientSession(trust_env=False) as session,
        session.get(url, timeout=aiohttp.ClientTimeout(total=600)) as resp,
    ):
        resp.raise_for_status()
        with open(dest, "wb") as out:  # noqa: ASYNC230 - the plain sequential baseline
            async for chunk in resp.content.iter_chunked(1024 * 1024):
                out.write(chunk)
                total += len(chunk)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args()
    args.dest.mkdir(parents=True)
    archive = args.dest / "package.zip"
    cpu0 = time.process_time()
    started = time.perf_counter()
    size = asyncio.run(download(args.url, archive))
    downloaded = time.perf_counter()
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(args.dest / "unpacked")
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "bytes": size,
                "download_s": downloaded - started,
                "extract_s": done - downloaded,
                "total_s": done - started,
                "cpu_s": time.process_time() - cpu0,
                "peak_rss_bytes": peak,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
