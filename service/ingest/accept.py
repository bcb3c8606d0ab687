"""Accepting events: validate against the limits, commit, count, then enqueue judging.

The order is the guarantee: nothing is acknowledged before it is committed, and nothing is
enqueued before it is committed (a task never looks for an event that is not there yet).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.exceptions import NoScriptError
from sqlalchemy.exc import IntegrityError

from service.ingest.backpressure import Backpressure
from service.ingest.counts import IngestCounts, count_rejected
from service.ingest.deferred import DuplicateRatios, PendingRatio
from service.ingest.judge_queue import TaskSender
from service.ingest.sampling import decide
from service.ingest.signals import NearDuplicateCount, Signals, compute_signals, looks_bad
from service.kernel.clock import utcnow
from service.kernel.queue_names import urgent_queue
from service.kernel.ratelimit import TokenBucket
from service.kernel.redaction import Redactor
from service.kernel.schemas import (
    MAX_ID_CHARS,
    MAX_LABEL_COLUMN_CHARS,
    EventIn,
    IngestResult,
    check_limits,
)
from service.kernel.settings import Settings
from service.store import events as event_store
from service.store.engine import session_scope
from service.telemetry.aggregates import Delta
from service.wiring.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    event_id: str | None
    reason: str  # a bounded metric label: invalid, empty_retrieval, limits, conflict
    message: str
    empty_retrieval: dict[str, str] | None = None  # its labels, when no passage was sent


CONFLICT_MESSAGE = "event_id already used for a different event"


def new_event_id() -> str:
    return uuid.uuid4().hex


def validate(raw: dict[str, Any] | EventIn, runtime: Runtime) -> EventIn | Rejection:
    claimed = raw.get("event_id") if isinstance(raw, dict) else raw.event_id
    event_id = claimed if isinstance(claimed, str) else None
    try:
        event = raw if isinstance(raw, EventIn) else EventIn.model_validate(raw)
    except ValidationError as exc:
        empty = empty_retrieval_labels(raw)
        return Rejection(event_id, "empty_retrieval" if empty else "invalid", _explain(exc), empty)
    problems = check_limits(event, runtime.settings)
    if problems:
        return Rejection(event_id, "limits", "; ".join(problems))
    return redact_event(event, runtime.redactor)


def empty_retrieval_labels(raw: object) -> dict[str, str] | None:
    """The labels of a body that reports a retrieval with no passage at all, else None.

    The v1 contract refuses such an event (there is nothing to judge), but a retriever returning
    nothing is exactly what the empty-retrieval signal and its alert watch for, so it is counted.
    """
    if not isinstance(raw, dict) or raw.get("passages") != []:
        return None
    labels = {name: raw.get(name) for name in ("app", "retriever", "environment")}
    if not isinstance(labels["app"], str) or not isinstance(labels["retriever"], str):
        return None
    limit = 100
    return {k: v[:limit] if isinstance(v, str) else "" for k, v in labels.items()}


def redact_event(event: EventIn, redactor: Redactor) -> EventIn:
    """The event with every free text masked; every later stage only ever sees this copy.

    Ids and labels are masked too (an email makes a fine passage id), and cut back to their
    column's width should a mask be longer than what it hides. The event_id is the exception:
    it is the client's handle on the event, and its pattern admits no "@" or space.
    """
    if not redactor:
        return event

    def text(value: str) -> str:
        return redactor.redact(value)

    def ident(value: str, width: int = MAX_ID_CHARS) -> str:
        return redactor.redact(value)[:width]

    def label(value: str | None) -> str | None:
        return None if value is None else ident(value, MAX_LABEL_COLUMN_CHARS)

    update: dict[str, Any] = {
        "app": label(event.app),
        "retriever": label(event.retriever),
        "environment": label(event.environment),
        "query": text(event.query),
        "passages": [
            p.model_copy(update={"text": text(p.text), "id": None if p.id is None else ident(p.id)})
            for p in event.passages
        ],
        "response": None if event.response is None else text(event.response),
        "metadata": redactor.redact_json(event.metadata),
    }
    if event.candidates is not None:
        update["candidates"] = [c.model_copy(update={"id": ident(c.id)}) for c in event.candidates]
    if event.gold_passage_ids is not None:
        update["gold_passage_ids"] = [ident(g) for g in event.gold_passage_ids]
    return event.model_copy(update=update)


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Triage:
    """What ingest decides about an event without a judge: sample it, hurry it, its signals."""

    judge: bool
    reason: str  # gold, sampled, unsampled
    urgent: bool
    signals: Signals
    duplicates: NearDuplicateCount  # read as far as ``urgent`` needed; finished after the answer

    @classmethod
    def of(cls, event_id: str, event: EventIn, settings: Settings) -> Triage:
        texts = [p.text for p in event.passages]
        k = event.k or len(event.passages)
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
        duplicates = NearDuplicateCount(
            texts[:k][: settings.signal_max_compared_passages],
            settings.signal_duplicate_similarity,
        )
        # The same decision as ``sample.judge and (is_gold or looks_bad(full signals))``.
        urgent = sample.judge and (
            is_gold or looks_bad(signals) or duplicates.reaches(signals.passages)
        )
        return cls(sample.judge, sample.reason, urgent, signals, duplicates)


def _initial_states(triage: dict[str, Triage]) -> dict[str, event_store.InitialState]:
    """Unsampled events are stored skipped and urgent ones with priority, in the INSERT itself."""
    return {
        event_id: event_store.InitialState(
            skip_reason=None if chosen.judge else "unsampled", priority=int(chosen.urgent)
        )
        for event_id, chosen in triage.items()
        if chosen.urgent or not chosen.judge
    }


@dataclass(frozen=True)
class Refusal:
    """Why a request is turned away before anything is stored, and when to come back."""

    status_code: int  # 503 (the service is overloaded) or 429 (the tenant is over its rate)
    reason: str
    message: str
    retry_after_seconds: int


class Ingestor:
    def __init__(self, runtime: Runtime, sender: TaskSender) -> None:
        self.runtime = runtime
        self.sender = sender
        self.backpressure = Backpressure(runtime)
        self.duplicate_ratios = DuplicateRatios(runtime.aggregates)

    def admit(self, tenant: str, events: int) -> Refusal | None:
        """Refuse work the service cannot take now; None when the request may proceed. A
        refusal is counted."""
        refusal = self.refusal(tenant, events)
        if refusal is not None:
            self.reject(tenant, refusal.reason, events)
        return refusal

    def admits_without_io(self) -> bool:
        """Whether ``refusal(..., refresh=False)`` decides with no query and no Redis call: the
        backlog count is cached and no tenant rate applies (its token bucket lives in Redis)."""
        return (
            self.runtime.settings.tenant_events_per_second <= 0
            and self.backpressure.decides_without_io()
        )

    def refusal(self, tenant: str, events: int, refresh: bool = True) -> Refusal | None:
        """Why the request should be turned away now, or None; counts nothing (``admit`` and
        ``reject`` do). ``refresh=False``: the backlog's cached count, see ``Backpressure``."""
        overload = self.backpressure.check(refresh)
        if overload is not None:
            return Refusal(503, overload.reason, overload.message, overload.retry_after_seconds)
        if self.runtime.settings.tenant_events_per_second > 0:
            decision = self._tenant_bucket(tenant).take(events)
            if not decision.allowed:
                return Refusal(
                    429,
                    "rate_limited",
                    f"tenant {tenant!r} is over {self.runtime.settings.tenant_events_per_second:g} "
                    "events per second",
                    max(1, math.ceil(decision.retry_after_seconds)),
                )
        return None

    def _tenant_bucket(self, tenant: str) -> TokenBucket:
        settings = self.runtime.settings
        return TokenBucket(
            self.runtime.redis,
            f"tenant:{tenant}",
            settings.tenant_events_per_second,
            settings.tenant_burst_events,
        )

    def ingest(
        self, tenant: str, events: Sequence[EventIn], rejections: Sequence[Rejection] = ()
    ) -> list[IngestResult]:
        """Commit the valid events, then count and enqueue; results in the order given."""
        settings = self.runtime.settings
        named = [(event.event_id or new_event_id(), event) for event in events]
        triage: dict[str, Triage] = {}
        for event_id, event in named:
            # An id repeated in the batch is stored once, as its first occurrence.
            if event_id not in triage:
                triage[event_id] = Triage.of(event_id, event, settings)
        initial = _initial_states(triage)
        with session_scope(self.runtime.engine) as session:
            try:
                started = time.perf_counter()
                stored = event_store.insert_events(session, tenant, named, utcnow(), initial)
                session.commit()
                self.backpressure.record_commit(time.perf_counter() - started)
            except Exception as exc:
                # IntegrityError: another request inserted one of these ids between our check
                # and our insert. A refused value: one event's own fault, so it alone fails.
                if not isinstance(exc, IntegrityError) and not event_store.refused_by_store(exc):
                    raise
                if not isinstance(exc, IntegrityError):
                    log.warning(
                        "the database refused a batch of %d (%s); storing the events one by one",
                        len(named),
                        type(exc).__name__,
                    )
                session.rollback()
                stored = event_store.insert_events_one_by_one(
                    session, tenant, named, utcnow(), initial
                )

        delta = Delta(tenant)
        counts = IngestCounts()
        results: list[IngestResult] = []
        new_pks: list[int] = []
        urgent_pks: list[int] = []
        ratios: list[PendingRatio] = []
        for (event_id, event), outcome in zip(named, stored, strict=True):
            key = (event.app, event.retriever, event.environment or "")
            if outcome.outcome == "accepted":
                assert outcome.pk is not None
                chosen = triage[event_id]
                if chosen.judge:
                    (urgent_pks if chosen.urgent else new_pks).append(outcome.pk)
                counts.accepted(key, chosen.judge, chosen.reason, chosen.signals)
                ratios.append(PendingRatio(tenant, key, chosen.duplicates, chosen.signals.passages))
                results.append(IngestResult(event_id=outcome.event_id, status="accepted"))
            elif outcome.outcome == "duplicate":
                counts.duplicate(key)
                results.append(IngestResult(event_id=outcome.event_id, status="duplicate"))
            elif outcome.outcome == "refused":
                count_rejected(delta, "invalid")
                results.append(
                    IngestResult(
                        event_id=outcome.event_id, status="rejected", error=outcome.refusal
                    )
                )
            else:
                count_rejected(delta, "conflict")
                results.append(
                    IngestResult(
                        event_id=outcome.event_id, status="rejected", error=CONFLICT_MESSAGE
                    )
                )
        counts.add_to(delta)
        for rejection in rejections:
            count_rejected(delta, rejection.reason, empty_retrieval=rejection.empty_retrieval)
        self._count_and_enqueue(delta, urgent_pks, new_pks)
        self.duplicate_ratios.submit(ratios)
        return results

    def close(self) -> None:
        """Send held judge messages and export the last duplicate ratios (at shutdown)."""
        self.sender.close()
        self.duplicate_ratios.close()

    def _count_and_enqueue(self, delta: Delta, urgent_pks: list[int], new_pks: list[int]) -> None:
        """The counters and the judge messages of one ingest call in one Redis round trip.

        A message the sender would hold to gather it with later ones is handed to the sender;
        when the broker is another Redis than the counters', each goes its own way.
        """
        sender = self.sender
        pushes: list[tuple[str, list[bytes]]] = []
        if urgent_pks:
            queue = urgent_queue(sender.queue)
            pushes.append((queue, sender.judge_messages(urgent_pks, queue)))
        if new_pks:
            if sender.sends_now(new_pks):
                pushes.append((sender.queue, sender.judge_messages(new_pks)))
            else:
                sender.send_judge(new_pks)
        if sender.broker_url != self.runtime.settings.redis_url:
            self.count(delta)
            for queue, messages in pushes:
                self._push_alone(queue, messages)
            return
        try:
            pipe = self.runtime.redis.pipeline(transaction=False)
            counted = self.runtime.aggregates.add_in(pipe, delta)
            for queue, messages in pushes:
                pipe.lpush(queue, *messages)
            answers = pipe.execute(raise_on_error=False)
        except Exception:  # committed already: the counters are rebuilt, the sweeper re-sends
            log.warning(
                "could not update ingest counters nor enqueue judging; the sweeper will",
                exc_info=True,
            )
            return
        if counted:
            if isinstance(answers[0], NoScriptError):  # a restarted Redis: load the script
                self.count(delta)
            elif isinstance(answers[0], Exception):
                log.warning("could not update ingest counters: %s", answers[0])
            answers = answers[1:]
        for (queue, messages), answer in zip(pushes, answers, strict=True):
            if isinstance(answer, Exception):
                log.warning(
                    "could not enqueue %d judge message(s) on %s; the sweeper will: %s",
                    len(messages),
                    queue,
                    answer,
                )

    def _push_alone(self, queue: str, messages: list[bytes]) -> None:
        try:
            self.sender.redis.lpush(queue, *messages)
        except Exception:  # the events are committed; the sweeper re-sends them
            log.warning("could not enqueue judging on %s; the sweeper will", queue, exc_info=True)

    def reject(
        self,
        tenant: str,
        reason: str,
        events: int = 1,
        empty_retrieval: Mapping[str, str] | None = None,
    ) -> None:
        """Count ``tenant``'s events refused before ``ingest`` saw them (admission, the request's
        own validation, the single-event path's writer); ``ingest`` counts the ones it is given."""
        delta = Delta(tenant)
        count_rejected(delta, reason, events, empty_retrieval)
        self.count(delta)

    def count(self, delta: Delta) -> None:
        try:
            self.runtime.aggregates.add(delta)
        except Exception:  # counters are rebuilt from the database; never fail an accepted event
            log.warning("could not update ingest counters", exc_info=True)
