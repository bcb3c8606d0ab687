"""What the caches saved, counted per tenant and judge: calls and tokens by the judge's way of
calling, look-ups by cache, and vectors attributed once per slice."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from service.primitives.hashing import text_hash
from service.spend.budget import estimate_prompt_tokens
from service.store.judging import EventForJudging, PassageForJudging
from service.telemetry.aggregates import Delta
from service.telemetry.judged_export import CallShape, JudgedEvent, cache_delta
from workers.judge.base import VectorUse

TEXTS = ("Homer wrote the Iliad.", "Troy was in Anatolia.", "Bread needs yeast.")


def event(pk: int, tenant: str, texts: tuple[str, ...], k: int) -> EventForJudging:
    return EventForJudging(
        pk=pk,
        event_id=f"ev-{pk}",
        tenant=tenant,
        app="shop",
        retriever="bm25",
        environment="",
        query="who wrote the iliad",
        k=k,
        status="pending",
        received_at=datetime.now(UTC),
        gold_passage_ids=None,
        passages=[
            PassageForJudging(rank, f"d{rank}", text, text_hash(text))
            for rank, text in enumerate(texts, start=1)
        ],
    )


def test_per_passage_calls_saved_count_each_passage_and_the_context_call() -> None:
    seen = event(1, "acme", TEXTS, 2)
    # The context rating and two grades were cached: only the third passage is asked.
    shape = CallShape(per_passage=True, estimate_tokens=estimate_prompt_tokens, prompt_overhead=50)
    delta = cache_delta(
        "gpt", shape, [JudgedEvent(seen, sent=[2], rate_context=False, label_hits=2)], None
    )
    read = {(f, labels): amount for (f, labels, _), amount in _parsed(delta).items()}
    assert read[("judge_calls_saved", ("acme", "gpt"))] == 3  # two grades and the context call
    full = estimate_prompt_tokens(["who wrote the iliad"] * 4 + list(TEXTS), 4 * 50)
    spent = estimate_prompt_tokens(["who wrote the iliad", TEXTS[2]], 50)
    assert read[("judge_tokens_saved", ("acme", "gpt"))] == full - spent
    assert read[("judge_cache_lookups", ("acme", "gpt", "label", "hit"))] == 2
    assert read[("judge_cache_lookups", ("acme", "gpt", "context", "hit"))] == 1


def test_a_vector_encoded_for_a_slice_is_a_miss_once_then_a_hit() -> None:
    first, second = event(1, "acme", TEXTS, 2), event(2, "other", TEXTS[:2], 1)
    encoded = frozenset(text_hash(t) for t in TEXTS)
    shape = CallShape(per_passage=False, estimate_tokens=None, prompt_overhead=50)
    delta = cache_delta(
        "local",
        shape,
        [
            JudgedEvent(first, sent=[0, 1, 2], rate_context=True, label_hits=0),
            JudgedEvent(second, sent=[0, 1], rate_context=True, label_hits=0),
        ],
        VectorUse(cached=frozenset(), encoded=encoded),
    )
    read = {(f, labels): amount for (f, labels, _), amount in _parsed(delta).items()}
    assert read[("judge_cache_lookups", ("acme", "local", "vector", "miss"))] == 3
    assert read[("judge_cache_lookups", ("other", "local", "vector", "hit"))] == 2
    assert ("judge_cache_lookups", ("other", "local", "vector", "miss")) not in read
    # The local judge costs no tokens, and each event made its one call.
    assert not any(f in {"judge_tokens_saved", "judge_calls_saved"} for f, _ in read)


def _parsed(delta: Delta) -> dict[tuple[str, tuple[str, ...], str], float]:
    """The increments by (family, label values, part); a field is that triple as JSON."""
    parsed = {}
    for key, amount in delta.values.items():
        family, labels, part = json.loads(key)
        parsed[(family, tuple(labels), part)] = amount
    return parsed
