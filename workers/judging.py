"""Judging one event: cached labels first, one judge call for the rest, then measures, stored in
one transaction, then exported once.

Every step can run twice (a redelivered task, a crash between the commit and the export) without
counting twice: the score row is unique per (event, judge, prompt version), and the export is
guarded by a marker in Redis set atomically with the increments.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from service import repository
from service.aggregates import Delta
from service.budget import reserve_call, settle_call
from service.db import session_scope
from service.measures import EventLabels, compute_measures
from service.models import EventStatus
from service.ratelimit import TokenBucket
from service.repository import EventForJudging, JudgeIdentity
from service.runtime import Runtime
from service.score_export import ExportLabels, done_key, score_delta
from workers.judge.base import Judge
from workers.judge.prompt import JudgeRequest

log = logging.getLogger(__name__)

Outcome = Literal["judged", "already_judged", "not_found", "skipped"]


def context_cache_key(event: EventForJudging) -> str:
    # The rating is of the set of passages the prompt carries, whatever their order.
    top_k = sorted(p.content_hash for p in event.passages[: event.k])
    return "ctx:" + hashlib.sha256("".join(top_k).encode()).hexdigest()


@dataclass(frozen=True)
class Plan:
    """Which passages go to the judge (indexes into event.passages) and whether to rate context."""

    send: list[int]
    rate_context: bool


def plan_call(event: EventForJudging, cached: dict[str, int]) -> Plan:
    rate_context = context_cache_key(event) not in cached
    top_k = range(min(event.k, len(event.passages)))
    # The context rating needs the whole top-k in front of the judge, cached or not.
    send = list(top_k) if rate_context else []
    seen = {event.passages[i].content_hash for i in send}
    for index, passage in enumerate(event.passages):
        if index in send:
            continue
        if passage.content_hash not in cached and passage.content_hash not in seen:
            send.append(index)
            seen.add(passage.content_hash)
    return Plan(send=send, rate_context=rate_context)


def judge_event(runtime: Runtime, judge: Judge, event_pk: int, force: bool = False) -> Outcome:
    settings = runtime.settings
    who = judge.identity
    with session_scope(runtime.engine) as session:
        event = repository.load_for_judging(session, event_pk)
        if event is None:
            log.warning("judge task for unknown event", extra={"event_pk": event_pk})
            return "not_found"
        if repository.score_exists(session, event_pk, who):
            export(runtime, session, event, who)
            return "already_judged"
        # Skipped by sampling, budget or shedding while the task waited in the queue.
        if event.status == EventStatus.SKIPPED and not force:
            return "skipped"

        query_hash = repository.text_hash(event.query)
        ctx_key = context_cache_key(event)
        cached = repository.cached_labels(
            session, who, query_hash, [p.content_hash for p in event.passages] + [ctx_key]
        )
    plan = plan_call(event, cached)

    by_hash: dict[str, int | None] = {h: g for h, g in cached.items() if not h.startswith("ctx:")}
    context_rating = cached.get(ctx_key)
    new_entries: dict[str, int] = {}
    calls = prompt_tokens = completion_tokens = malformed = 0
    latency: float | None = None
    output_modes: dict[str, int] = {}
    if plan.send:
        request = JudgeRequest(
            query=event.query,
            passages=tuple(event.passages[i].text for i in plan.send),
            rate_context=plan.rate_context,
            top_k_count=min(event.k, len(event.passages)) if plan.rate_context else 0,
        )
        held = reserve_call(runtime, event.app, who.model, [event.query, *request.passages])
        try:
            wait_for_judge_budget(runtime)
            reply = judge.judge(request)
        except BaseException:  # a call that never answered releases its reservation
            settle_call(runtime, held, event.app, who.judge, who.model, 0, 0, 0)
            raise
        settle_call(
            runtime,
            held,
            event.app,
            who.judge,
            who.model,
            reply.calls,
            reply.prompt_tokens,
            reply.completion_tokens,
        )
        calls, malformed, latency = reply.calls, reply.malformed_replies, reply.latency_seconds
        output_modes = reply.output_modes
        prompt_tokens, completion_tokens = reply.prompt_tokens, reply.completion_tokens
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
                new_entries[ctx_key] = context_rating

    sent_hashes = {event.passages[i].content_hash for i in plan.send}
    grades = [by_hash.get(p.content_hash) for p in event.passages]
    from_cache = [
        p.content_hash in cached and p.content_hash not in sent_hashes for p in event.passages
    ]
    gold = set(event.gold_passage_ids) if event.gold_passage_ids is not None else None
    labels = EventLabels(
        grades=grades,
        k=event.k,
        threshold=settings.relevance_threshold,
        context_rating=context_rating,
        gold_relevant=[p.passage_id in gold for p in event.passages] if gold is not None else None,
        n_gold=len(gold) if gold is not None else None,
    )
    measures = compute_measures(labels, settings.alpha)
    result = repository.JudgingResult(
        grades=grades,
        from_cache=from_cache,
        context_rating=context_rating,
        calls=calls,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        malformed_replies=malformed,
        new_cache_entries=new_entries,
        query_hash=query_hash,
        measures=measures,
        np_window=int(measures.get("np_window") or 0),
        alpha=settings.alpha,
        threshold=settings.relevance_threshold,
    )
    with session_scope(runtime.engine) as session:
        stored: repository.StoredScore | None
        try:
            stored = repository.store_judging(session, event, who, result)
            if stored and settings.passage_text_storage == "hash_after_judging":
                repository.erase_passage_texts(session, event.pk)
            session.commit()
        except IntegrityError:
            # The same event judged by a concurrent delivery of the task: theirs stands.
            session.rollback()
            stored = None
        if latency is not None and stored:
            _observe_latency(runtime, who, latency)
            _count_output_modes(runtime, who, output_modes)
        export(runtime, session, event, who, stored)
    return "judged" if stored else "already_judged"


def wait_for_judge_budget(runtime: Runtime) -> None:
    """Hold the call until the shared judge rate allows it (all workers draw on one bucket)."""
    rate = runtime.settings.judge_calls_per_second
    if rate <= 0:
        return
    bucket = TokenBucket(runtime.redis, "judge", rate, burst=max(1.0, rate))
    while not (decision := bucket.take()).allowed:
        time.sleep(min(decision.retry_after_seconds, 5.0))


def _observe_latency(runtime: Runtime, who: JudgeIdentity, seconds: float) -> None:
    delta = Delta()
    delta.observe("judge_latency_seconds", {"judge": who.judge}, seconds)
    runtime.aggregates.add(delta)


def _count_output_modes(runtime: Runtime, who: JudgeIdentity, modes: dict[str, int]) -> None:
    delta = Delta()
    for mode, count in modes.items():
        delta.inc("judge_output_mode", {"judge": who.judge, "mode": mode}, count)
    runtime.aggregates.add(delta)


def export(
    runtime: Runtime,
    session: Session,
    event: EventForJudging,
    who: JudgeIdentity,
    stored: repository.StoredScore | None = None,
) -> bool:
    """Add this event's score and judging cost to the shared aggregates, once.

    ``stored`` is what this delivery just wrote; a redelivery reads it back instead.
    """
    if stored is None:
        stored = repository.stored_score(session, event.pk, who)
    score, run = stored.score, stored.run
    delta = score_delta(
        ExportLabels(
            app=event.app,
            retriever=event.retriever,
            environment=event.environment,
            judge=who.judge,
            prompt_version=who.prompt_version,
            judged_passages=len(event.passages),
        ),
        score,
        run,
    )
    delta.observe(
        "pipeline_lag_seconds",
        {"app": event.app},
        max((repository.utcnow() - event.received_at).total_seconds(), 0.0),
    )
    return runtime.aggregates.add_once(done_key(event.pk, who.judge, who.prompt_version), delta)
