"""The agent's /metrics page scraped and read: samples by name and labels."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


Samples = dict[tuple[str, Labels], float]


async def scrape(address: str) -> Samples:
    """GET /metrics and parse it: {(sample name, labels): value}."""
    async with (
        aiohttp.ClientSession(trust_env=False) as session,
        session.get(f"http://{address}/metrics", timeout=aiohttp.ClientTimeout(10)) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, labels: Mapping[str, str] | None = None) -> float:
    """A sample's value; 0 for a labelled series not yet seen (a counter that never moved)."""
    key = (name, frozenset((labels or {}).items()))
    if key not in samples:
        assert labels, f"{name} missing from the scrape"
        return 0.0
    return samples[key]
