"""What the judge's caches saved a slice, as metric increments per tenant and judge.

- ``judge_cache_lookups`` by cache and result: ``label`` per passage of an event (a hit is a
  grade the label cache held for the same query and passage text), ``context`` per event with a
  top k (a hit is a rating held for the same query and top-k set), ``vector`` per distinct
  passage the local judge compared (a miss is a passage encoded now; a hit, one whose vector
  another slice or an earlier event of this slice made);
- ``judge_calls_saved``: the judge calls an event would have cost with no label cache, less
  those it cost;
- ``judge_tokens_saved``: the same for the prompt tokens, estimated the way the budget reserves
  them (four characters a token, plus the prompt's fixed overhead per call); an LLM judge only.

The calls and tokens spent are ``judge_app_calls`` and ``judge_app_tokens``, so the share saved
is saved / (saved + spent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.spend.budget import estimate_prompt_tokens
from service.store.judging import EventForJudging
from service.telemetry.aggregates import Delta
from workers.judge.base import VectorUse


@dataclass(frozen=True)
class JudgedEvent:
    """One event as its judge call saw it."""

    event: EventForJudging
    sent: Sequence[int]  # indexes of the passages sent to the judge
    rate_context: bool  # the context rating was asked (not held by the cache)
    label_hits: int  # passages whose grade came from the label cache


@dataclass(frozen=True)
class CallShape:
    """How the judge spends calls and tokens on one event."""

    per_passage: bool  # one call per passage, plus one for the context rating
    counts_tokens: bool  # its calls cost tokens (an LLM, not the local judge)
    prompt_overhead: int  # tokens of a call beyond the query and passages


def cache_delta(
    judge: str, shape: CallShape, judged: Sequence[JudgedEvent], vectors: VectorUse | None
) -> Delta:
    delta = Delta()
    vectors_used: set[str] = set()
    for one in judged:
        event = one.event
        who = {"tenant": event.tenant, "judge": judge}
        passages = len(event.passages)
        _lookups(delta, who, "label", one.label_hits, passages - one.label_hits)
        has_top_k = min(event.k, passages) > 0
        if has_top_k:
            asked = int(one.rate_context)
            _lookups(delta, who, "context", 1 - asked, asked)
        # Distinct texts: a passage repeated within an event is sent once.
        sent = {event.passages[i].content_hash: event.passages[i].text for i in one.sent}
        sent_texts = list(sent.values())
        all_texts = list({p.content_hash: p.text for p in event.passages}.values())
        full_calls = _calls(shape, len(all_texts), has_top_k)
        spent_calls = _calls(shape, len(sent_texts), one.rate_context)
        if full_calls > spent_calls:
            delta.inc("judge_calls_saved", who, full_calls - spent_calls)
        if shape.counts_tokens:
            saved = _tokens(shape, event.query, all_texts, full_calls) - _tokens(
                shape, event.query, sent_texts, spent_calls
            )
            if saved > 0:
                delta.inc("judge_tokens_saved", who, saved)
        if vectors is not None:
            hits = misses = 0
            for content_hash in sent:
                if content_hash in vectors.encoded and content_hash not in vectors_used:
                    misses += 1
                else:
                    hits += 1
                vectors_used.add(content_hash)
            _lookups(delta, who, "vector", hits, misses)
    return delta


def _lookups(delta: Delta, who: dict[str, str], cache: str, hits: int, misses: int) -> None:
    if hits:
        delta.inc("judge_cache_lookups", {**who, "cache": cache, "result": "hit"}, hits)
    if misses:
        delta.inc("judge_cache_lookups", {**who, "cache": cache, "result": "miss"}, misses)


def _calls(shape: CallShape, passages: int, rate_context: bool) -> int:
    if shape.per_passage:
        return passages + int(rate_context)
    return int(passages > 0 or rate_context)


def _tokens(shape: CallShape, query: str, texts: list[str], calls: int) -> int:
    if calls == 0:
        return 0
    # Every call carries the query and the prompt's overhead; each passage goes once.
    return estimate_prompt_tokens([query] * calls + texts, shape.prompt_overhead * calls)
