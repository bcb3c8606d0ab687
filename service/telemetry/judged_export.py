"""What a judged event exports: what it adds to the shared aggregates, under the once-only marker
that makes the export happen once whoever does it (the worker that judged it, a redelivery, or the
rebuild from the database), and what the judge's caches saved the slice it was judged in.

Per event: ``events_judged``, a histogram observation per measure it has (or
``events_missing_measures``), the labels, calls, tokens and cache hits of its judge run, the lag
from its arrival, and for an event judged now the call's latency and output modes.

Per slice, what the caches saved, per tenant and judge:

- ``judge_cache_lookups`` by cache and result: ``label`` per passage of an event (a hit is a
  grade the label cache held for the same query and passage text), ``context`` per event with a
  top k (a hit is a rating held for the same query and top-k set), ``vector`` per distinct
  passage the local judge compared (a miss is a passage encoded now; a hit, one whose vector
  another slice or an earlier event of this slice made);
- ``judge_calls_saved``: the judge calls an event would have cost with no label cache, less
  those it cost;
- ``judge_tokens_saved``: the same for the prompt tokens, estimated the way the budget reserves
  them; an LLM judge only.

The calls and tokens spent are ``judge_app_calls`` and ``judge_app_tokens``, so the share saved
is saved / (saved + spent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from service.measures.catalogue import MEASURES
from service.primitives.keys import composite_key
from service.store.judging import EventForJudging, JudgeIdentity, StoredScore
from service.telemetry.aggregates import Delta

# The prompt tokens of a call carrying ``texts``, with ``overhead`` tokens beyond them.
TokenEstimate = Callable[[list[str], int], int]


@dataclass(frozen=True)
class ExportLabels:
    tenant: str
    app: str
    retriever: str
    environment: str
    judge: str
    prompt_version: str
    judged_passages: int


def done_key(event_pk: int, judge: str, prompt_version: str) -> str:
    """The marker that makes an event's export happen once, whoever does it."""
    return composite_key(str(event_pk), judge, prompt_version)


def score_delta(
    who: ExportLabels, score: Mapping[str, Any], run: Mapping[str, Any] | None
) -> Delta:
    """``score`` and ``run`` are the column values of the scores and judge_runs rows."""
    labels = {
        "tenant": who.tenant,
        "app": who.app,
        "retriever": who.retriever,
        "environment": who.environment,
        "judge": who.judge,
        "prompt_version": who.prompt_version,
    }
    delta = Delta()
    delta.inc("events_judged", labels)
    any_measure = False
    for measure in MEASURES:
        value = score[measure.name]
        if value is not None:
            delta.observe(f"measure_{measure.name}", labels, float(value))
            # Context relevance and the gold measures exist even when the judge's labels are
            # missing; only a measure from those labels says the event was scored.
            any_measure = any_measure or measure.from_judge_labels
    if not any_measure:
        delta.inc("events_missing_measures", labels)
    if run is None:
        return delta
    judge = {"judge": who.judge}
    missing, malformed = run["missing_labels"], run["malformed_replies"]
    delta.inc("judge_labels", judge, who.judged_passages - missing)
    if missing:
        delta.inc("judge_labels_missing", judge, missing)
    if run["cache_hits"]:
        delta.inc("judge_cache_hits", judge, run["cache_hits"])
    ok_calls = run["calls"] - malformed
    if ok_calls > 0:
        delta.inc("judge_calls", {**judge, "outcome": "ok"}, ok_calls)
    if malformed:
        delta.inc("judge_calls", {**judge, "outcome": "malformed"}, malformed)
    if run["prompt_tokens"]:
        delta.inc("judge_tokens", {**judge, "kind": "prompt"}, run["prompt_tokens"])
    if run["completion_tokens"]:
        delta.inc("judge_tokens", {**judge, "kind": "completion"}, run["completion_tokens"])
    return delta


class AnsweredCall(Protocol):
    """What the export reads of a judge's reply."""

    @property
    def latency_seconds(self) -> float: ...

    @property
    def output_modes(self) -> Mapping[str, int]: ...


def judged_event_delta(
    event: EventForJudging,
    who: JudgeIdentity,
    stored: StoredScore,
    now: datetime,
    call: AnsweredCall | None,
) -> tuple[str, Delta]:
    """One judged event's export under its once-only marker. ``call`` is the judge call made for
    it now; None when its labels were all cached or an earlier delivery made the call."""
    delta = score_delta(
        ExportLabels(
            tenant=event.tenant,
            app=event.app,
            retriever=event.retriever,
            environment=event.environment,
            judge=who.judge,
            prompt_version=who.prompt_version,
            judged_passages=len(event.passages),
        ),
        stored.score,
        stored.run,
    )
    delta.observe(
        "pipeline_lag_seconds",
        {"tenant": event.tenant, "app": event.app},
        max((now - event.received_at).total_seconds(), 0.0),
    )
    if call is not None:
        delta.observe("judge_latency_seconds", {"judge": who.judge}, call.latency_seconds)
        for mode, count in call.output_modes.items():
            delta.inc("judge_output_mode", {"judge": who.judge, "mode": mode}, count)
    return done_key(event.pk, who.judge, who.prompt_version), delta


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
    # How its calls' prompt tokens are estimated; None when its calls cost no tokens (the local
    # judge).
    estimate_tokens: TokenEstimate | None
    prompt_overhead: int  # tokens of a call beyond the query and passages


class EncodedVectors(Protocol):
    """Which passage vectors the local judge encoded for the slice, by content hash."""

    @property
    def encoded(self) -> Set[str]: ...


def cache_delta(
    judge: str, shape: CallShape, judged: Sequence[JudgedEvent], vectors: EncodedVectors | None
) -> Delta:
    """What the caches saved a slice; ``vectors`` is None for a judge without vectors."""
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
            if shape.estimate_tokens is not None:
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
    if calls == 0 or shape.estimate_tokens is None:
        return 0
    # Every call carries the query and the prompt's overhead; each passage goes once.
    return shape.estimate_tokens([query] * calls + texts, shape.prompt_overhead * calls)
