"""The duplicate-ratio histogram counted after the answer: what reaches the shared aggregates
(the real Redis), when, and what a full backlog skips.

Tests ``service.ingest.deferred``.
"""

from __future__ import annotations

import pytest
import redis

from service.ingest.deferred import DuplicateRatios, PendingRatio
from service.ingest.signals import NearDuplicateCount, count_near_duplicates
from service.telemetry.aggregates import Aggregates
from tests.support.live import wait_for

TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"
OTHER = "a completely different passage about invoices and billing cycles"
LABELS = ("shop", "r1", "")


def _ratio(aggregates: Aggregates, part: str, tenant: str = "t1") -> float:
    return sum(
        value
        for (family, labels, field), value in aggregates.read().items()
        if family == "signal_duplicate_ratio" and field == part and labels[0] == tenant
    )


def _pending(tenant: str, texts: tuple[str, ...], passages: int) -> PendingRatio:
    return PendingRatio(tenant, LABELS, NearDuplicateCount(texts, 0.9), passages)


def test_a_count_started_at_ingest_is_finished_from_where_it_stopped() -> None:
    texts = (TEXT, OTHER, "third words here now", "fourth set of words", TEXT.upper())
    count = NearDuplicateCount(texts, 0.9)
    assert not count.reaches(5)  # 3 of 5 needed: settled after three passages
    assert count.left == 2
    assert count.total() == count_near_duplicates(texts, 0.9) == 1
    assert count.left == 0


@pytest.fixture
def aggregates(redis_url: str) -> Aggregates:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    found = Aggregates(client)
    found.start_epoch(0.0)  # complete aggregates: adds are applied
    return found


def test_a_flush_exports_each_events_ratio_with_its_tenant(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, flush_seconds=3600)
    texts = (TEXT, TEXT.upper(), OTHER, TEXT + "!")
    assert count_near_duplicates(texts, 0.9) == 2
    ratios.submit([_pending("t1", texts, 4), _pending("t2", (OTHER,), 1)])
    assert _ratio(aggregates, "count") == 0  # nothing before the flush
    ratios.flush()
    assert _ratio(aggregates, "count") == 1
    assert _ratio(aggregates, "sum") == pytest.approx(0.5)
    assert _ratio(aggregates, "count", tenant="t2") == 1
    assert _ratio(aggregates, "sum", tenant="t2") == 0
    ratios.close()


def test_the_thread_exports_without_a_scrape(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, flush_seconds=0.05)
    try:
        ratios.submit([_pending("t1", (TEXT, TEXT), 2)])
        wait_for(lambda: _ratio(aggregates, "count") == 1, timeout=10)
        assert _ratio(aggregates, "sum") == pytest.approx(0.5)
    finally:
        ratios.close()


def test_a_full_backlog_skips_events_rather_than_growing(aggregates: Aggregates) -> None:
    ratios = DuplicateRatios(aggregates, flush_seconds=3600, capacity=3)
    ratios.submit([_pending("t1", (TEXT,), 1) for _ in range(2)])
    ratios.submit([_pending("t1", (TEXT,), 1) for _ in range(5)])  # one fits
    ratios.close()  # shutdown exports what waited
    assert _ratio(aggregates, "count") == 3
