"""The counters of one ingest call, added up per label set before they become one Delta;
``count_rejected``, the one place a refused event is counted, whichever path refused it; and
``add_counts``/``count_refused``, which add counters to the shared aggregates on their own.

A batch of 100 events usually carries one or a few (app, retriever, environment) label sets;
counting per label set rather than per event turns ~15 increments per event into a handful of
additions, and each histogram's buckets are counted once per batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.ingest.signals import Signals
from service.telemetry.aggregates import Aggregates, Delta

log = logging.getLogger(__name__)

LabelKey = tuple[str, str, str]  # app, retriever, environment


def add_counts(aggregates: Aggregates, delta: Delta) -> None:
    """Add ``delta`` to the shared aggregates; a failure is logged, never raised."""
    try:
        aggregates.add(delta)
    except Exception:  # counters are rebuilt from the database; never fail an accepted event
        log.warning("could not update ingest counters", exc_info=True)


def count_refused(
    aggregates: Aggregates,
    tenant: str,
    reason: str,
    events: int = 1,
    empty_retrieval: Mapping[str, str] | None = None,
) -> None:
    """Count ``tenant``'s events refused before the ingestor saw them (admission, the request's
    own validation, the single-event path's writer); the ingestor counts the ones it is given."""
    delta = Delta(tenant)
    count_rejected(delta, reason, events, empty_retrieval)
    add_counts(aggregates, delta)


def count_rejected(
    delta: Delta,
    reason: str,
    events: int = 1,
    empty_retrieval: Mapping[str, str] | None = None,
) -> None:
    """``events`` refused for ``reason``, a bounded label set by the path that refused them:
    validation (invalid, empty_retrieval, limits), the insert (conflict; invalid when the database
    refuses a value of that one event), admission
    (rate_limited, backlog, slow_database) or the single-event writer (stopping, queue_full,
    unconfirmed, store_failed, invalid).

    ``empty_retrieval`` carries the labels of a refused body that reported a retrieval with no
    passage: the v1 contract refuses it, but it also counts as an empty retrieval, the signal
    whose alert watches for a retriever that returns nothing.
    """
    delta.inc("events_rejected", {"reason": reason}, events)
    if empty_retrieval is not None:
        delta.inc("signal_empty_retrievals", empty_retrieval)


@dataclass
class _LabelSetCounts:
    accepted: int = 0
    duplicate: int = 0
    sampled: Counter[str] = field(default_factory=Counter)  # by reason
    skipped: Counter[str] = field(default_factory=Counter)
    empty: int = 0
    short: int = 0
    top_scores: list[float] = field(default_factory=list)
    score_gaps: list[float] = field(default_factory=list)
    duplicate_ratios: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class IngestCounts:
    def __init__(self) -> None:
        self._sets: dict[LabelKey, _LabelSetCounts] = {}

    def _of(self, key: LabelKey) -> _LabelSetCounts:
        counts = self._sets.get(key)
        if counts is None:
            counts = self._sets[key] = _LabelSetCounts()
        return counts

    def accepted(self, key: LabelKey, judge: bool, reason: str, signals: Signals) -> None:
        """An accepted event: sampled or skipped (by reason), and its judge-free signals."""
        counts = self._of(key)
        counts.accepted += 1
        (counts.sampled if judge else counts.skipped)[reason] += 1
        counts.empty += signals.empty
        counts.short += signals.short
        if signals.top_score is not None:
            counts.top_scores.append(signals.top_score)
        if signals.score_gap is not None:
            counts.score_gaps.append(signals.score_gap)
        ratio = signals.duplicate_ratio
        if ratio is not None:
            counts.duplicate_ratios.append(ratio)
        counts.lengths.extend(signals.lengths)

    def duplicate(self, key: LabelKey) -> None:
        self._of(key).duplicate += 1

    def add_to(self, delta: Delta) -> None:
        for (app, retriever, environment), counts in self._sets.items():
            labels = {"app": app, "retriever": retriever, "environment": environment}
            if counts.accepted:
                delta.inc("events_accepted", labels, counts.accepted)
            if counts.duplicate:
                delta.inc("events_duplicate", labels, counts.duplicate)
            for reason, n in counts.sampled.items():
                delta.inc("events_sampled", {**labels, "reason": reason}, n)
            for reason, n in counts.skipped.items():
                delta.inc("events_skipped", {**labels, "reason": reason}, n)
            if counts.empty:
                delta.inc("signal_empty_retrievals", labels, counts.empty)
            if counts.short:
                delta.inc("signal_short_retrievals", labels, counts.short)
            delta.observe_many("signal_top_score", labels, counts.top_scores)
            delta.observe_many("signal_score_gap", labels, counts.score_gaps)
            delta.observe_many("signal_duplicate_ratio", labels, counts.duplicate_ratios)
            delta.observe_many("signal_passage_length_characters", labels, counts.lengths)
