"""Accepting events: validate against the limits, commit, count, then enqueue judging.

The order is the guarantee: nothing is acknowledged before it is committed, and nothing is
enqueued before it is committed (a task never looks for an event that is not there yet).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from service import repository
from service.aggregates import Delta
from service.backpressure import Backpressure
from service.db import session_scope
from service.queue import TaskSender
from service.ratelimit import TokenBucket
from service.redaction import Redactor
from service.runtime import Runtime
from service.schemas import EventIn, IngestResult, check_limits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    event_id: str | None
    reason: str  # a bounded metric label: invalid, limits, conflict
    message: str


def new_event_id() -> str:
    return uuid.uuid4().hex


def validate(raw: dict[str, Any] | EventIn, runtime: Runtime) -> EventIn | Rejection:
    claimed = raw.get("event_id") if isinstance(raw, dict) else raw.event_id
    event_id = claimed if isinstance(claimed, str) else None
    try:
        event = raw if isinstance(raw, EventIn) else EventIn.model_validate(raw)
    except ValidationError as exc:
        return Rejection(event_id, "invalid", _explain(exc))
    problems = check_limits(event, runtime.settings)
    if problems:
        return Rejection(event_id, "limits", "; ".join(problems))
    return redact_event(event, runtime.redactor)


def redact_event(event: EventIn, redactor: Redactor) -> EventIn:
    """The event with its texts masked; every later stage only ever sees this copy."""
    if not redactor:
        return event
    return event.model_copy(
        update={
            "query": redactor.redact(event.query),
            "passages": [
                p.model_copy(update={"text": redactor.redact(p.text)}) for p in event.passages
            ],
            "response": redactor.redact(event.response) if event.response else event.response,
        }
    )


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


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

    def admit(self, tenant: str, events: int) -> Refusal | None:
        """Refuse work the service cannot take now; None when the request may proceed."""
        overload = self.backpressure.check()
        refusal: Refusal | None = None
        if overload is not None:
            refusal = Refusal(503, overload.reason, overload.message, overload.retry_after_seconds)
        elif self.runtime.settings.tenant_events_per_second > 0:
            decision = self._tenant_bucket(tenant).take(events)
            if not decision.allowed:
                refusal = Refusal(
                    429,
                    "rate_limited",
                    f"tenant {tenant!r} is over {self.runtime.settings.tenant_events_per_second:g} "
                    "events per second",
                    max(1, math.ceil(decision.retry_after_seconds)),
                )
        if refusal is not None:
            delta = Delta()
            delta.inc("events_rejected", {"reason": refusal.reason}, events)
            self.count(delta)
        return refusal

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
        named = [(event.event_id or new_event_id(), event) for event in events]
        with session_scope(self.runtime.engine) as session:
            try:
                started = time.perf_counter()
                stored = repository.insert_events(session, tenant, named, repository.utcnow())
                session.commit()
                self.backpressure.record_commit(time.perf_counter() - started)
            except IntegrityError:
                # Another request inserted one of these ids between our check and our insert.
                session.rollback()
                stored = repository.insert_events_one_by_one(
                    session, tenant, named, repository.utcnow()
                )

        delta = Delta()
        results: list[IngestResult] = []
        new_pks: list[int] = []
        for (_, event), outcome in zip(named, stored, strict=True):
            labels = {
                "app": event.app,
                "retriever": event.retriever,
                "environment": event.environment or "",
            }
            if outcome.outcome == "accepted":
                assert outcome.pk is not None
                new_pks.append(outcome.pk)
                delta.inc("events_accepted", labels)
                results.append(IngestResult(event_id=outcome.event_id, status="accepted"))
            elif outcome.outcome == "duplicate":
                delta.inc("events_duplicate", labels)
                results.append(IngestResult(event_id=outcome.event_id, status="duplicate"))
            else:
                delta.inc("events_rejected", {"reason": "conflict"})
                results.append(
                    IngestResult(
                        event_id=outcome.event_id,
                        status="rejected",
                        error="event_id already used for a different event",
                    )
                )
        for rejection in rejections:
            delta.inc("events_rejected", {"reason": rejection.reason})
        self.count(delta)
        if new_pks:
            self.sender.send_judge(new_pks)
        return results

    def count(self, delta: Delta) -> None:
        try:
            self.runtime.aggregates.add(delta)
        except Exception:  # counters are rebuilt from the database; never fail an accepted event
            log.warning("could not update ingest counters", exc_info=True)
