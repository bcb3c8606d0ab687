"""Judging a slice of events: cached labels first, one judge call per event for the rest (several
calls in flight at once), then measures, stored in one transaction, then exported once.

A slice costs a fixed number of round trips whatever its size: one query loads its events, one
reads their cached labels, one transaction stores every score, one Redis pipeline exports them.
Before the first call the judge is told everything the slice will ask (``Judge.prepare``): the
local judge encodes it in one encoder call, reading the passage vectors other slices kept.

Every step can run twice (a redelivered task, a crash between the commit and the export) without
counting twice: the score row is unique per (event, judge, prompt version), and the export is
guarded by a marker in Redis set atomically with the increments.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from sqlalchemy.exc import IntegrityError

from service.kernel.clock import utcnow
from service.kernel.hashing import text_hash
from service.kernel.ratelimit import TokenBucket
from service.measures.formulas import EventLabels, compute_measures, first_gold_ranks
from service.spend.budget import BudgetExhaustedError, reserve_call, settle_call
from service.store import judging as judging_store
from service.store.engine import session_scope
from service.store.judging import EventForJudging, JudgeIdentity, StoredScore
from service.store.models import EventStatus
from service.telemetry.aggregates import Delta
from service.telemetry.score_export import ExportLabels, done_key, score_delta
from service.wiring.runtime import Runtime
from workers.cache_figures import CallShape, JudgedEvent, cache_delta
from workers.claims import EventClaims
from workers.judge.base import Judge, JudgeReply, TransientJudgeError, VectorUse
from workers.judge.prompt import JudgeRequest

log = logging.getLogger(__name__)

Outcome = Literal[
    "judged", "already_judged", "in_progress", "not_found", "skipped", "retry", "over_budget"
]


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


@dataclass
class SliceResult:
    """What happened to each event of a slice, and the errors of those left for later."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    transient: dict[int, TransientJudgeError] = field(default_factory=dict)
    over_budget: dict[int, BudgetExhaustedError] = field(default_factory=dict)


@dataclass
class _Work:
    """One event on its way through the slice."""

    event: EventForJudging
    query_hash: str
    ctx_key: str
    cached: dict[str, int] = field(default_factory=dict)  # labels known before its call
    plan: Plan = field(default_factory=lambda: Plan([], False))
    reply: JudgeReply | None = None


def judge_event(runtime: Runtime, judge: Judge, event_pk: int, force: bool = False) -> Outcome:
    """Judge one event; a judge failure or a spent budget is raised for the task to handle."""
    result = judge_events(runtime, judge, [event_pk], force=force)
    if event_pk in result.over_budget:
        raise result.over_budget[event_pk]
    if event_pk in result.transient:
        raise result.transient[event_pk]
    return result.outcomes[event_pk]


def judge_events(
    runtime: Runtime, judge: Judge, event_pks: Sequence[int], force: bool = False
) -> SliceResult:
    """Judge a slice of events. ``force`` also judges events that sampling or shedding skipped.

    Events the judge could not grade now (it failed, or the app's budget is spent) come back in
    ``transient`` and ``over_budget``, unwritten, for the caller to retry or defer.
    """
    who = judge.identity
    result = SliceResult()
    with session_scope(runtime.engine) as session:
        events = judging_store.load_many_for_judging(session, event_pks)
        scored = judging_store.scored_event_pks(session, [e.pk for e in events], who)
        work = [
            _Work(e, text_hash(e.query), context_cache_key(e))
            for e in events
            if e.pk not in scored and (force or e.status != EventStatus.SKIPPED)
        ]
        wanted: dict[str, set[str]] = {}
        for item in work:
            hashes = wanted.setdefault(item.query_hash, set())
            hashes.update(p.content_hash for p in item.event.passages)
            hashes.add(item.ctx_key)
        known = judging_store.cached_labels_many(session, who, wanted)
        # A redelivered task: the score is stored, the export may not have happened.
        redelivered = {
            e.pk: (e, judging_store.stored_score(session, e.pk, who))
            for e in events
            if e.pk in scored
        }
    found = {e.pk for e in events}
    for pk in event_pks:
        if pk not in found:
            log.warning("judge task for unknown event", extra={"event_pk": pk})
            result.outcomes[pk] = "not_found"
    for e in events:
        if e.pk in scored:
            result.outcomes[e.pk] = "already_judged"
        elif e.status == EventStatus.SKIPPED and not force:
            result.outcomes[e.pk] = "skipped"

    # Another delivery of an event may be judging it right now: only one of them calls the judge.
    claims = EventClaims(runtime.redis, who, runtime.settings.pending_requeue_seconds)
    claimed = set(claims.take([item.event.pk for item in work]))
    for item in work:
        if item.event.pk not in claimed:
            result.outcomes[item.event.pk] = "in_progress"
    work = [item for item in work if item.event.pk in claimed]
    calls = _Calls(known, result)
    with claims.kept(list(claimed)):
        done = _call_judge(runtime, judge, work, calls)
        stored = _store(runtime, who, done)
    for item in done:
        result.outcomes[item.event.pk] = "judged" if item.event.pk in stored else "already_judged"
    exports = [
        (item.event, stored[item.event.pk], item.reply) for item in done if item.event.pk in stored
    ]
    exports.extend((event, score, None) for event, score in redelivered.values())
    calls.spend.merge(
        _cache_figures(runtime, judge, calls, [i for i in done if i.event.pk in stored])
    )
    _export(runtime, who, exports, calls.spend)
    return result


def _cache_figures(runtime: Runtime, judge: Judge, calls: _Calls, judged: list[_Work]) -> Delta:
    shape = CallShape(
        # The LLM judge's per-passage mode: a call per passage (the local judge has none).
        per_passage=bool(getattr(judge, "per_passage", False)),
        counts_tokens=calls.vectors is None,
        prompt_overhead=runtime.settings.judge_prompt_token_overhead,
    )
    return cache_delta(
        judge.identity.judge,
        shape,
        [
            JudgedEvent(
                item.event,
                item.plan.send,
                item.plan.rate_context,
                label_hits=sum(
                    p.content_hash in item.cached and p.content_hash not in sent
                    for p in item.event.passages
                ),
            )
            for item in judged
            for sent in ({item.event.passages[i].content_hash for i in item.plan.send},)
        ],
        calls.vectors,
    )


@dataclass
class _Calls:
    """What the slice's judge calls have given so far."""

    known: dict[tuple[str, str], int]  # (query hash, passage hash or ctx key) -> grade
    result: SliceResult
    spend: Delta = field(default_factory=Delta)
    finished: list[_Work] = field(default_factory=list)
    vectors: VectorUse | None = None  # where the local judge found the slice's vectors

    def take(
        self, item: _Work, answer: Callable[[], tuple[JudgeReply, Delta]], *, final: bool
    ) -> bool:
        """Record one call's outcome; False if the budget refused it and ``final`` is not set."""
        pk = item.event.pk
        try:
            reply, spent = answer()
        except TransientJudgeError as exc:
            self.result.transient[pk] = exc
            self.result.outcomes[pk] = "retry"
            return True
        except BudgetExhaustedError as exc:
            if not final:
                return False
            self.result.over_budget[pk] = exc
            self.result.outcomes[pk] = "over_budget"
            return True
        self.spend.merge(spent)
        item.reply = reply
        _learn(item, self.known)
        self.finished.append(item)
        return True


def _call_judge(runtime: Runtime, judge: Judge, work: list[_Work], calls: _Calls) -> list[_Work]:
    """Grade what the cache does not know, in rounds, several calls at once.

    Two events of a slice that need the same (query, passage) label must not both pay for it:
    the later one waits a round and finds it cached, exactly as if the slice ran one event at
    a time. The events come back with their plans and replies, ready to store.
    """
    # Everything the slice may ask, announced at once: the local judge encodes it in one call.
    # Later rounds only ask less (what an earlier round taught is cached by then).
    for item in work:
        item.cached = _cached_for(item, calls.known)
        item.plan = plan_call(item.event, item.cached)
    prepared = judge.prepare([_request(item.event, item.plan) for item in work if item.plan.send])
    calls.vectors = prepared.vectors
    judge = prepared.judge
    pending = work
    planned = True  # the first round's plans are made above
    while pending:
        claimed: set[tuple[str, str]] = set()
        this_round: list[_Work] = []
        deferred: list[_Work] = []
        for item in pending:
            if not planned:
                item.cached = _cached_for(item, calls.known)
                item.plan = plan_call(item.event, item.cached)
            passages = item.event.passages
            keys = {(item.query_hash, passages[i].content_hash) for i in item.plan.send}
            if item.plan.rate_context:
                keys.add((item.query_hash, item.ctx_key))
            if keys & claimed:
                deferred.append(item)
                continue
            claimed |= keys
            this_round.append(item)
        calls.finished.extend(item for item in this_round if not item.plan.send)
        asking = [item for item in this_round if item.plan.send]
        if len(asking) == 1 or judge.max_concurrency == 1:
            for item in asking:
                calls.take(item, partial(_ask, runtime, judge, item), final=True)
        elif asking:
            pool = _call_pool(judge.max_concurrency)
            futures = [(item, pool.submit(_ask, runtime, judge, item)) for item in asking]
            refused = [item for item, f in futures if not calls.take(item, f.result, final=False)]
            # Refused while the slice's other calls held reservations: asked again one at a
            # time, now that those are settled, so concurrency never spends a budget early.
            for item in refused:
                calls.take(item, partial(_ask, runtime, judge, item), final=True)
        pending = deferred
        planned = False
    return calls.finished


_pool: tuple[int, int, ThreadPoolExecutor] | None = None


def _call_pool(size: int) -> ThreadPoolExecutor:
    """The process's threads for judge calls, made on first use (after Celery forks the process:
    threads do not survive a fork) and kept, since starting them per slice cost more than the
    calls they overlapped."""
    global _pool
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != size:
        _pool = (os.getpid(), size, ThreadPoolExecutor(size, thread_name_prefix="judge-call"))
    return _pool[2]


def _cached_for(item: _Work, known: dict[tuple[str, str], int]) -> dict[str, int]:
    cached: dict[str, int] = {}
    for key in [p.content_hash for p in item.event.passages] + [item.ctx_key]:
        grade = known.get((item.query_hash, key))
        if grade is not None:
            cached[key] = grade
    return cached


def _learn(item: _Work, known: dict[tuple[str, str], int]) -> None:
    """Make the grades of ``item``'s reply visible to the slice's later events."""
    assert item.reply is not None
    for index, grade in zip(item.plan.send, item.reply.grades, strict=True):
        if grade is not None:
            known[(item.query_hash, item.event.passages[index].content_hash)] = grade
    if item.plan.rate_context and item.reply.context_rating is not None:
        known[(item.query_hash, item.ctx_key)] = item.reply.context_rating


def _request(event: EventForJudging, plan: Plan) -> JudgeRequest:
    return JudgeRequest(
        query=event.query,
        passages=tuple(event.passages[i].text for i in plan.send),
        rate_context=plan.rate_context,
        top_k_count=min(event.k, len(event.passages)) if plan.rate_context else 0,
    )


def _ask(runtime: Runtime, judge: Judge, item: _Work) -> tuple[JudgeReply, Delta]:
    """One judge call for one event, within its tenant's app's budget and the shared call
    rate."""
    event, plan, who = item.event, item.plan, judge.identity
    request = _request(event, plan)
    held = reserve_call(
        runtime, event.tenant, event.app, who.model, [event.query, *request.passages]
    )
    try:
        wait_for_judge_budget(runtime)
        reply = judge.judge(request)
    except BaseException:  # a call that never answered releases its reservation
        settle_call(runtime, held, event.tenant, event.app, who.judge, who.model, 0, 0, 0)
        raise
    spent = settle_call(
        runtime,
        held,
        event.tenant,
        event.app,
        who.judge,
        who.model,
        reply.calls,
        reply.prompt_tokens,
        reply.completion_tokens,
    )
    return reply, spent


def _gold_marks(ranked_ids: list[str], gold: set[str]) -> list[bool]:
    ranks = set(first_gold_ranks(ranked_ids, gold))
    return [rank in ranks for rank in range(1, len(ranked_ids) + 1)]


def _judging_result(runtime: Runtime, item: _Work) -> judging_store.JudgingResult:
    settings = runtime.settings
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
    sent_hashes = {event.passages[i].content_hash for i in plan.send}
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
        measures=measures,
        np_window=int(measures.get("np_window") or 0),
        alpha=settings.alpha,
        threshold=settings.relevance_threshold,
    )


_Judged = tuple[EventForJudging, judging_store.JudgingResult]


def _store(runtime: Runtime, who: JudgeIdentity, done: list[_Work]) -> dict[int, StoredScore]:
    """Store the slice in one transaction; what a concurrent delivery stored first stands."""
    if not done:
        return {}
    judged = [(item.event, _judging_result(runtime, item)) for item in done]
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


def _export(
    runtime: Runtime,
    who: JudgeIdentity,
    exports: list[tuple[EventForJudging, StoredScore, JudgeReply | None]],
    extra: Delta,
) -> None:
    """Add each event's score and judging cost to the shared aggregates, once per event, and the
    slice's spend figures, in one round trip."""
    now = utcnow()
    deltas: list[tuple[str, Delta]] = []
    for event, stored, reply in exports:
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
        if reply is not None:
            delta.observe("judge_latency_seconds", {"judge": who.judge}, reply.latency_seconds)
            for mode, count in reply.output_modes.items():
                delta.inc("judge_output_mode", {"judge": who.judge, "mode": mode}, count)
        deltas.append((done_key(event.pk, who.judge, who.prompt_version), delta))
    runtime.aggregates.add_many_once(deltas, extra)


def wait_for_judge_budget(runtime: Runtime, sleep: Callable[[float], None] = time.sleep) -> None:
    """Hold the call until the shared judge rate allows it (all workers draw on one bucket)."""
    rate = runtime.settings.judge_calls_per_second
    if rate <= 0:
        return
    bucket = TokenBucket(runtime.redis, "judge", rate, burst=max(1.0, rate))
    while not (decision := bucket.take()).allowed:
        sleep(min(decision.retry_after_seconds, 5.0))
