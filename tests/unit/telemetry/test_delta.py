"""Delta: many observations at once add up to the same increments as one at a time.

Tests ``service.ingest.counts``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ingest.counts import IngestCounts
from service.ingest.signals import Signals
from service.telemetry.aggregates import Delta
from service.telemetry.metrics import FAMILIES

LABELS = {"app": "shop", "retriever": "r1", "environment": ""}
BOUNDS = list(FAMILIES["signal_passage_length_characters"].buckets)
assert BOUNDS, "a histogram with buckets, so values fall on and between bounds"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(BOUNDS), st.integers(0, 20_000)), max_size=50))
def test_observe_many_equals_observing_each_value(values: list[int]) -> None:
    one_by_one, at_once = Delta(), Delta()
    for value in values:
        one_by_one.observe("signal_passage_length_characters", LABELS, value)
    at_once.observe_many("signal_passage_length_characters", LABELS, values)
    assert dict(at_once.values) == dict(one_by_one.values)


def test_counts_per_label_set_equal_the_per_event_increments() -> None:
    bad = Signals(
        passages=2,
        empty=False,
        short=True,
        top_score=0.9,
        score_gap=0.2,
        duplicates=1,
        lengths=(120, 80),
    )
    plain = Signals(
        passages=3,
        empty=False,
        short=False,
        top_score=None,
        score_gap=None,
        duplicates=0,
        lengths=(10, 20, 30),
    )
    other = {**LABELS, "app": "docs"}
    counts = IngestCounts()
    counts.accepted(("shop", "r1", ""), True, "sampled", bad)
    counts.accepted(("shop", "r1", ""), False, "unsampled", plain)
    counts.accepted(("docs", "r1", ""), True, "gold", plain)
    counts.duplicate(("shop", "r1", ""))
    batched = Delta()
    counts.add_to(batched)

    expected = Delta()
    for labels, reason, signals in (
        (LABELS, "sampled", bad),
        (LABELS, "unsampled", plain),
        (other, "gold", plain),
    ):
        family = "events_skipped" if reason == "unsampled" else "events_sampled"
        expected.inc(family, {**labels, "reason": reason})
        expected.inc("events_accepted", labels)
        if signals.short:
            expected.inc("signal_short_retrievals", labels)
        if signals.top_score is not None:
            expected.observe("signal_top_score", labels, signals.top_score)
        if signals.score_gap is not None:
            expected.observe("signal_score_gap", labels, signals.score_gap)
        ratio = signals.duplicate_ratio
        assert ratio is not None
        expected.observe("signal_duplicate_ratio", labels, ratio)
        for length in signals.lengths:
            expected.observe("signal_passage_length_characters", labels, length)
    expected.inc("events_duplicate", LABELS)
    assert dict(batched.values) == pytest.approx(dict(expected.values))
