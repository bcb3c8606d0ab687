"""The urgent-queue decision at ingest, made without the full near-duplicate count: the same
decision as the full signals give, on lists with and without repeats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.ingest.sampling import decide
from service.ingest.signals import compute_signals, count_near_duplicates, looks_bad, repeats_enough
from service.ingest.triage import Triage
from service.primitives.hashing import text_hash
from tests.support.near_duplicates import near_duplicate_passages, reference_near_duplicates

SETTINGS = Settings.model_validate({"database_url": "sqlite://", "redis_url": "redis://unused"})


@settings(max_examples=300, deadline=None)
@given(
    near_duplicate_passages(),
    st.sampled_from([0.05, 0.3, 0.5, 0.75, 0.9, 1.0]),
    st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    st.integers(0, 3),
)
def test_repeats_enough_is_the_full_count_against_the_bound(
    texts: list[str], threshold: float, bound: float, extra: int
) -> None:
    passages = len(texts) + extra  # the compared texts may be fewer than the top k
    expected = reference_near_duplicates(texts, threshold) / passages >= bound
    assert repeats_enough(texts, threshold, passages, bound) == expected


def _full_decision(event_id: str, event: EventIn) -> bool:
    """The decision as ingest made it before: every signal counted, then looks_bad."""
    full = compute_signals(
        [p.text for p in event.passages],
        [p.score for p in event.passages],
        event.k or len(event.passages),
        SETTINGS.signal_short_passages,
        SETTINGS.signal_duplicate_similarity,
        SETTINGS.signal_max_compared_passages,
    )
    is_gold = event.gold_passage_ids is not None
    sample = decide(event_id, event.app, event.retriever, is_gold, 1.0, {})
    return sample.judge and (is_gold or looks_bad(full))


@settings(max_examples=300, deadline=None)
@given(near_duplicate_passages(), st.integers(1, 8), st.booleans())
def test_the_urgent_decision_is_the_full_signals_decision(
    texts: list[str], k: int, gold: bool
) -> None:
    passages = [{"text": text if text.strip() else "blank"} for text in texts]
    event = EventIn.model_validate(
        {
            "app": "shop",
            "retriever": "r1",
            "query": "q",
            "passages": passages,
            "k": min(k, len(passages)),
            **({"gold_passage_ids": ["p1"]} if gold else {}),
        }
    )
    triage = Triage.of("e1", event, SETTINGS)
    assert triage.urgent == _full_decision("e1", event)
    assert triage.signals.duplicates is None  # counted after the answer, not here


def test_a_repetitive_list_is_urgent_and_a_varied_one_is_not() -> None:
    text = "the quick brown fox jumps over the lazy dog near the river bank today"
    repeated = [text, text.upper(), text + ".", "something else entirely, about billing"]
    assert count_near_duplicates(repeated, 0.9) == 2
    for passages, urgent in ((repeated, True), ([text, "other words here", "and more"], False)):
        event = EventIn.model_validate(
            {
                "app": "a",
                "retriever": "r",
                "query": "q",
                "passages": [{"text": t} for t in passages],
            }
        )
        assert Triage.of("e", event, SETTINGS).urgent is urgent


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(2, 8))
def test_triage_hashes_only_the_passages_the_near_duplicate_count_compares(
    passages: int, k: int, compared: int
) -> None:
    # The store hashes the rest when it keeps the texts; a narrow row pays for no more.
    texts = [f"passage number {i} about something" for i in range(passages)]
    event = EventIn.model_validate(
        {
            "app": "a",
            "retriever": "r",
            "query": "q",
            "passages": [{"text": t} for t in texts],
            "k": min(k, passages),
        }
    )
    limited = SETTINGS.model_copy(update={"signal_max_compared_passages": compared})
    triage = Triage.of("e1", event, limited)
    assert triage.content_hashes == tuple(text_hash(t) for t in texts[: min(k, passages, compared)])
