"""Judging a slice of events: cached labels first, one judge call per event for the rest (several
calls in flight at once), then measures, stored in one transaction, then exported once.

A slice costs a fixed number of round trips whatever its size: one query loads its events, one
reads their cached labels, one transaction stores every score, one Redis pipeline exports them.
What to ask is planned in ``workers.plan``, asked in ``workers.calls`` and stored and exported
in ``workers.record``; here the slice is loaded, its events claimed and their outcomes told.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from service.primitives.hashing import text_hash
from service.spend.budget import BudgetExhaustedError
from service.store import judging as judging_store
from service.store.engine import session_scope
from service.store.models import EventStatus, derived_scope
from service.wiring.runtime import Runtime
from workers.calls import call_judge
from workers.claims import EventClaims
from workers.judge.base import Judge, TransientJudgeError
from workers.plan import EventWork, context_cache_key
from workers.record import export_slice, store_slice

log = logging.getLogger(__name__)

Outcome = Literal[
    "judged", "already_judged", "in_progress", "not_found", "skipped", "retry", "over_budget"
]


@dataclass
class SliceResult:
    """What happened to each event of a slice, and the errors of those left for later."""

    outcomes: dict[int, Outcome] = field(default_factory=dict)
    transient: dict[int, TransientJudgeError] = field(default_factory=dict)
    over_budget: dict[int, BudgetExhaustedError] = field(default_factory=dict)


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
    shared = runtime.settings.share_derived_across_tenants
    result = SliceResult()
    with session_scope(runtime.engine) as session:
        events = judging_store.load_many_for_judging(session, event_pks)
        scored = judging_store.scored_event_pks(session, [e.pk for e in events], who)
        work = [
            EventWork(e, text_hash(e.query), context_cache_key(e), derived_scope(e.tenant, shared))
            for e in events
            if e.pk not in scored and (force or e.status != EventStatus.SKIPPED)
        ]
        wanted: dict[tuple[str, str], set[str]] = {}
        for item in work:
            hashes = wanted.setdefault((item.scope, item.query_hash), set())
            hashes.update(p.content_hash for p in item.event.passages)
            hashes.add(item.ctx_key)
        known = judging_store.cached_labels_many(session, who, wanted)
        # A redelivered task: the score is stored, the export may not have happened.
        redelivered = [
            (e, judging_store.stored_score(session, e.pk, who)) for e in events if e.pk in scored
        ]
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
    with claims.kept(list(claimed)):
        calls = call_judge(runtime, judge, work, known)
        stored = store_slice(runtime, who, calls.finished)
    result.transient, result.over_budget = calls.transient, calls.over_budget
    for pk in calls.transient:
        result.outcomes[pk] = "retry"
    for pk in calls.over_budget:
        result.outcomes[pk] = "over_budget"
    for item in calls.finished:
        result.outcomes[item.event.pk] = "judged" if item.event.pk in stored else "already_judged"
    judged = [(item, stored[item.event.pk]) for item in calls.finished if item.event.pk in stored]
    export_slice(runtime, judge, judged, redelivered, calls.spend, calls.vectors)
    return result
