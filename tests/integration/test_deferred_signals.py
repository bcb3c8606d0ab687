"""The duplicate-ratio histogram counted after the answer: what reaches the shared aggregates
(the real Redis), when, and what a full backlog skips."""

from __future__ import annotations

import pytest
import redis

from service.ingest.deferred import DuplicateRatios, PendingRatio
from service.ingest.signals import count_near_duplicates
from service.telemetry.aggregates import Aggregates
from tests.conftest import wait_for

TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"
OTHER = "a completely different passage about invoices and billing cycles"
LABELS = ("shop", "r1", "")


def _ratio(aggregates: Aggregates, part: str, tenant: str = "t1") -> float:
    return sum(
        value
        for (family, labels, field), value in aggregates.read().items()
        if family == "signal_duplicate_ratio" and field == part and labels[0] == tenant
    )


@pytest.fixture
def aggregates(redis_url: str) -> Aggregates:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    found = Aggregates(client)
    found.start_epoch(0.0)  # complete aggregates: adds are applied
    return found


def test_a_flush_exports_each_events_ratio_with_its_tenant(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, 0.9, flush_seconds=3600)
    texts = (TEXT, TEXT.upper(), OTHER, TEXT + "!")
    assert count_near_duplicates(texts, 0.9) == 2
    ratios.submit([PendingRatio("t1", LABELS, texts, 4), PendingRatio("t2", LABELS, (OTHER,), 1)])
    assert _ratio(aggregates, "count") == 0  # nothing before the flush
    ratios.flush()
    assert _ratio(aggregates, "count") == 1
    assert _ratio(aggregates, "sum") == pytest.approx(0.5)
    assert _ratio(aggregates, "count", tenant="t2") == 1
    assert _ratio(aggregates, "sum", tenant="t2") == 0
    ratios.close()


def test_the_thread_exports_without_a_scrape(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, 0.9, flush_seconds=0.05)
    try:
        ratios.submit([PendingRatio("t1", LABELS, (TEXT, TEXT), 2)])
        wait_for(lambda: _ratio(aggregates, "count") == 1, timeout=10)
        assert _ratio(aggregates, "sum") == pytest.approx(0.5)
    finally:
        ratios.close()


def test_a_full_backlog_skips_events_rather_than_growing(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, 0.9, flush_seconds=3600, capacity=3)
    ratios.submit([PendingRatio("t1", LABELS, (TEXT,), 1)] * 2)
    ratios.submit([PendingRatio("t1", LABELS, (TEXT,), 1)] * 5)  # one fits
    ratios.close()  # shutdown exports what waited
    assert _ratio(aggregates, "count") == 3
