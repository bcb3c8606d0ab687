"""Reading counters and histograms back from the API's /metrics."""

from __future__ import annotations

import math
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families


def counter_total(url: str, family: str, **labels: str) -> float:
    """Sum of a counter's samples whose labels include ``labels``."""
    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if fam.name != family:
            continue
        for sample in fam.samples:
            if sample.name.endswith("_total") and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def histogram_buckets(url: str, family: str) -> dict[float, float]:
    """Cumulative bucket counts by upper bound, summed over every label set."""
    buckets: dict[float, float] = defaultdict(float)
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if fam.name != family:
            continue
        for sample in fam.samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] += sample.value
    return dict(buckets)


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of what was observed between two reads, interpolated within a bucket
    the way Prometheus's histogram_quantile does."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower
