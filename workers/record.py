"""What a judged slice leaves behind: each event's judgments, score, judge run and new label-cache
rows, stored in one transaction, then its export to the shared aggregates in one round trip.

Storing and exporting can each run twice (a redelivered task, a crash between the commit and the
export) without counting twice: the score row is unique per (event, judge, prompt version), and
the export is guarded by a marker in Redis set atomically with the increments
(``service.telemetry.judged_export``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.exc import IntegrityError

from service.config.settings import Settings
from service.measures.formulas import EventLabels, compute_measures, first_gold_ranks
from service.primitives.clock import utcnow
from service.spend.budget import estimate_prompt_tokens
from service.store import judging as judging_store
from service.store.engine import session_scope
from service.store.judging import EventForJudging, JudgeIdentity, StoredScore
from service.telemetry.aggregates import Delta
from service.telemetry.judged_export import (
    CallShape,
    JudgedEvent,
    cache_delta,
    judged_event_delta,
)
from service.wiring.runtime import Runtime
from workers.judge.base import Judge, VectorUse
from workers.plan import EventWork

_Judged = tuple[EventForJudging, judging_store.JudgingResult]


def judging_result(settings: Settings, item: EventWork) -> judging_store.JudgingResult:
    """The rows one judged event stores: its grades (cached or answered), measures and cost."""
    event, plan, reply = item.event, item.plan, item.reply
    by_hash: dict[str, int | None] = {
        h: g for h, g in item.cached.items() if not h.startswith("ctx:")
    }
    context_rating = item.cached.get(item.ctx_key)
    new_entries: dict[str, int] = {}
    if reply is not None:
        for index, grade in zip(plan.send, reply.grades, strict=True):
            content_hash = event.passages[index].content_hash
            if grade is not None:
                new_entries[content_hash] = grade
                by_hash[content_hash] = grade
            else:
                by_hash.setdefault(content_hash, None)
        if plan.rate_context:
            context_rating = reply.context_rating
            if context_rating is not None:
                new_entries[item.ctx_key] = context_rating
    sent_hashes = item.sent_hashes()
    grades = [by_hash.get(p.content_hash) for p in event.passages]
    similarity_by_hash: dict[str, float] = {}
    if reply is not None and reply.similarities is not None:
        for index, similarity in zip(plan.send, reply.similarities, strict=True):
            similarity_by_hash[event.passages[index].content_hash] = similarity
    from_cache = [
        p.content_hash in item.cached and p.content_hash not in sent_hashes for p in event.passages
    ]
    gold = set(event.gold_passage_ids) if event.gold_passage_ids else None
    labels = EventLabels(
        grades=grades,
        k=event.k,
        threshold=settings.relevance_threshold,
        context_rating=context_rating,
        gold_relevant=_gold_marks([p.passage_id for p in event.passages], gold)
        if gold is not None
        else None,
        n_gold=len(gold) if gold is not None else None,
    )
    measures = compute_measures(labels, settings.alpha)
    return judging_store.JudgingResult(
        grades=grades,
        similarities=[similarity_by_hash.get(p.content_hash) for p in event.passages]
        if similarity_by_hash
        else None,
        from_cache=from_cache,
        context_rating=context_rating,
        calls=reply.calls if reply else 0,
        prompt_tokens=reply.prompt_tokens if reply else 0,
        completion_tokens=reply.completion_tokens if reply else 0,
        malformed_replies=reply.malformed_replies if reply else 0,
        new_cache_entries=new_entries,
        query_hash=item.query_hash,
        derived_scope=item.scope,
        measures=measures,
        np_window=int(measures.get("np_window") or 0),
        alpha=settings.alpha,
        threshold=settings.relevance_threshold,
    )


def _gold_marks(ranked_ids: list[str], gold: set[str]) -> list[bool]:
    ranks = set(first_gold_ranks(ranked_ids, gold))
    return [rank in ranks for rank in range(1, len(ranked_ids) + 1)]


def store_slice(
    runtime: Runtime, who: JudgeIdentity, done: Sequence[EventWork]
) -> dict[int, StoredScore]:
    """Store the slice in one transaction; what a concurrent delivery stored first stands."""
    if not done:
        return {}
    judged = [(item.event, judging_result(runtime.settings, item)) for item in done]
    erase = runtime.settings.passage_text_storage == "hash_after_judging"

    def write(batch: list[_Judged]) -> dict[int, StoredScore]:
        with session_scope(runtime.engine) as session:
            stored = judging_store.store_judging_many(session, who, batch)
            if erase:
                judging_store.erase_passage_texts(session, list(stored))
            session.commit()
            return stored

    try:
        return write(judged)
    except IntegrityError:
        # Another delivery stored one of these events meanwhile: store the rest one by one.
        stored: dict[int, StoredScore] = {}
        for one in judged:
            try:
                stored.update(write([one]))
            except IntegrityError:
                continue
        return stored


def export_slice(
    runtime: Runtime,
    judge: Judge,
    judged: Sequence[tuple[EventWork, StoredScore]],
    redelivered: Sequence[tuple[EventForJudging, StoredScore]],
    spend: Delta,
    vectors: VectorUse | None,
) -> None:
    """Add each event's score and judging cost to the shared aggregates, once per event, and the
    slice's spend with its cache figures, in one round trip. ``judged`` are the events stored
    now; ``redelivered``, those an earlier delivery stored and may not have exported."""
    who = judge.identity
    now = utcnow()
    deltas = [
        judged_event_delta(item.event, who, stored, now, item.reply) for item, stored in judged
    ]
    deltas.extend(
        judged_event_delta(event, who, stored, now, None) for event, stored in redelivered
    )
    spend.merge(_cache_figures(runtime, judge, [item for item, _ in judged], vectors))
    runtime.aggregates.add_many_once(deltas, spend)


def _cache_figures(
    runtime: Runtime, judge: Judge, judged: list[EventWork], vectors: VectorUse | None
) -> Delta:
    shape = CallShape(
        # The LLM judge's per-passage mode: a call per passage (the local judge has none).
        per_passage=bool(getattr(judge, "per_passage", False)),
        estimate_tokens=estimate_prompt_tokens if vectors is None else None,
        prompt_overhead=runtime.settings.judge_prompt_token_overhead,
    )
    return cache_delta(
        judge.identity.judge,
        shape,
        [
            JudgedEvent(item.event, item.plan.send, item.plan.rate_context, item.label_hits())
            for item in judged
        ],
        vectors,
    )
