"""What is decided about an event without a judge, before it is stored: whether it is judged
(sampling), whether it is judged first (urgent), its signals, and the state it is stored in."""

from __future__ import annotations

from dataclasses import dataclass

from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.ingest.sampling import decide, keep_point
from service.ingest.signals import NearDuplicateCount, Signals, compute_signals, looks_bad
from service.primitives.hashing import text_hash
from service.store import events as event_store


@dataclass(frozen=True)
class Triage:
    """What ingest decides about an event without a judge: sample it, hurry it, its signals."""

    judge: bool
    reason: str  # gold, sampled, unsampled
    urgent: bool
    keep_texts: bool  # stored in full; False: a narrow row (RM_KEEP_TEXTS=needed)
    signals: Signals
    duplicates: NearDuplicateCount  # read as far as ``urgent`` needed; finished after the answer
    # The ``text_hash`` of each passage the near-duplicate count compares (the first
    # min(k, RM_SIGNAL_MAX_COMPARED_PASSAGES)), made once for the count and the store; the store
    # hashes the rest only when it keeps the texts, so a narrow row pays for no more.
    content_hashes: tuple[str, ...]

    @classmethod
    def of(cls, event_id: str, event: EventIn, settings: Settings) -> Triage:
        texts = [p.text for p in event.passages]
        k = event.k or len(event.passages)
        compared = texts[:k][: settings.signal_max_compared_passages]
        hashes = tuple(map(text_hash, compared))
        # The near-duplicate count only feeds a histogram: it is made after the answer
        # (service/ingest/deferred.py). What decides here is whether it reaches looks_bad's
        # bound, asked only when the answer depends on it and stopped once it is known.
        signals = compute_signals(
            texts,
            [p.score for p in event.passages],
            k,
            settings.signal_short_passages,
            settings.signal_duplicate_similarity,
            settings.signal_max_compared_passages,
            count_duplicates=False,
        )
        is_gold = event.gold_passage_ids is not None
        sample = decide(
            event_id,
            event.app,
            event.retriever,
            is_gold,
            settings.sample_rate,
            settings.sample_rates,
        )
        duplicates = NearDuplicateCount(compared, settings.signal_duplicate_similarity, hashes)
        # The same decision as ``sample.judge and (is_gold or looks_bad(full signals))``.
        urgent = sample.judge and (
            is_gold or looks_bad(signals) or duplicates.reaches(signals.passages)
        )
        keep_texts = (
            sample.judge
            or settings.keep_texts == "all"
            or keep_point(event_id) < settings.keep_texts_share
            # An event that looks bad is what a person opens on the pages, judged or not.
            or looks_bad(signals)
            or duplicates.reaches(signals.passages)
        )
        return cls(sample.judge, sample.reason, urgent, keep_texts, signals, duplicates, hashes)


def initial_states(triage: dict[str, Triage]) -> dict[str, event_store.InitialState]:
    """Unsampled events are stored skipped (narrow when they keep no texts) and urgent ones with
    priority, in the INSERT itself."""
    return {
        event_id: event_store.InitialState(
            skip_reason=None if chosen.judge else "unsampled",
            priority=int(chosen.urgent),
            keep_texts=chosen.keep_texts,
        )
        for event_id, chosen in triage.items()
        if chosen.urgent or not chosen.judge
    }
