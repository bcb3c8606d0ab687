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

from collections import Counter
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
    # Summed per tenant first: a slice is mostly one tenant, and each increment costs a lookup.
    counts: Counter[tuple[str, str, str, str]] = Counter()  # (tenant, family, cache, result)
    vectors_used: set[str] = set()
    for one in judged:
        event, tenant = one.event, one.event.tenant
        passages = len(event.passages)
        counts[tenant, "lookups", "label", "hit"] += one.label_hits
        counts[tenant, "lookups", "label", "miss"] += passages - one.label_hits
        has_top_k = min(event.k, passages) > 0
        if has_top_k:
            counts[tenant, "lookups", "context", "miss" if one.rate_context else "hit"] += 1
        # Distinct texts: a passage repeated within an event is sent once.
        sent = {event.passages[i].content_hash: event.passages[i].text for i in one.sent}
        every = {p.content_hash: p.text for p in event.passages}
        if len(sent) < len(every) or (has_top_k and not one.rate_context):
            full_calls = _calls(shape, len(every), has_top_k)
            spent_calls = _calls(shape, len(sent), one.rate_context and has_top_k)
            counts[tenant, "calls_saved", "", ""] += max(0, full_calls - spent_calls)
            if shape.counts_tokens:
                full = _tokens(shape, event.query, list(every.values()), full_calls)
                spent = _tokens(shape, event.query, list(sent.values()), spent_calls)
                counts[tenant, "tokens_saved", "", ""] += max(0, full - spent)
        if vectors is not None:
            for content_hash in sent:
                first_use = content_hash in vectors.encoded and content_hash not in vectors_used
                counts[tenant, "lookups", "vector", "miss" if first_use else "hit"] += 1
                vectors_used.add(content_hash)
    delta = Delta()
    for (tenant, family, cache, result), amount in counts.items():
        if amount <= 0:
            continue
        who = {"tenant": tenant, "judge": judge}
        if family == "lookups":
            delta.inc("judge_cache_lookups", {**who, "cache": cache, "result": result}, amount)
        else:
            delta.inc(f"judge_{family}", who, amount)
    return delta


def _calls(shape: CallShape, passages: int, rate_context: bool) -> int:
    if passages == 0:  # nothing to send: no call (the rating needs its top k sent)
        return 0
    return passages + int(rate_context) if shape.per_passage else 1


def _tokens(shape: CallShape, query: str, texts: list[str], calls: int) -> int:
    if calls == 0:
        return 0
    # Every call carries the query and the prompt's overhead; each passage goes once.
    return estimate_prompt_tokens([query] * calls + texts, shape.prompt_overhead * calls)
