"""Prometheus histograms scraped from a running process, for benches: the change between two
scrapes (one window of a run), and its quantiles read off the buckets.

A quantile read off buckets is the upper bound of the bucket it falls in (``le``): what the
process itself could say, with the buckets it exports; ``meanMs`` is exact (sum / count).
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Histogram:
    """One unlabelled histogram: cumulative counts per upper bound, count and sum."""

    buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), ascending
    count: float = 0.0
    total: float = 0.0

    def minus(self, before: Histogram) -> Histogram:
        """The observations made between ``before`` and this scrape."""
        earlier = dict(before.buckets)
        return Histogram(
            tuple((le, n - earlier.get(le, 0.0)) for le, n in self.buckets),
            self.count - before.count,
            self.total - before.total,
        )

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the ``q`` quantile (inf past the last)."""
        want = q * self.count
        for le, n in self.buckets:
            if n >= want:
                return le
        return float("inf")

    def figures(self) -> dict[str, Any]:
        """Count, exact mean and bucketed p50 / p99 / p99.9, in milliseconds."""
        if self.count <= 0:
            return {"n": 0}
        return {
            "n": int(self.count),
            "meanMs": round(1000 * self.total / self.count, 2),
            "p50LeMs": round(1000 * self.quantile(0.5), 2),
            "p99LeMs": round(1000 * self.quantile(0.99), 2),
            "p999LeMs": round(1000 * self.quantile(0.999), 2),
        }


def scrape(
    address: str, names: tuple[str, ...], where: dict[str, dict[str, str]] | None = None
) -> dict[str, Histogram]:
    """The named histograms from ``http://address/metrics`` (absent ones: empty; one with
    labels summed over them, or over the samples whose labels include ``where[name]``)."""
    where = where or {}
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
        text = r.read().decode()
    found: dict[str, Histogram] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names:
            continue
        # a labelled histogram is summed over its labels (e.g. every GC generation)
        buckets: dict[float, float] = {}
        count = total = 0.0
        wanted = where.get(family.name, {}).items()
        for s in family.samples:
            if not wanted <= s.labels.items():
                continue
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
        found[family.name] = Histogram(tuple(sorted(buckets.items())), count, total)
    return {n: found.get(n, Histogram()) for n in names}
